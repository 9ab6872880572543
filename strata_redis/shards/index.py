"""A sharded dataset's description in storage: where its objects live, each shard's index and
the dataset's manifest, and how they are read back and checked.

The layout (the seeds' ``{root}/{dataset_id}/shards/``)::

    {dataset_id}/shards/shard-000000.tar              the samples, a webdataset-compatible tar
    {dataset_id}/shards/shard-000000.tar.index.json   its index: each sample's key, byte
                                                      offset and size in the tar, the shard's
                                                      size and CRC-32
    {dataset_id}/shards/index.json                    the manifest: every shard, in order, with
                                                      its sample count, size and CRC-32

A sample's byte range covers its members whole (headers, data and padding), so a range read
of it is a small tar of its own. The checksum is the standard CRC-32 of the shard's bytes,
written as the checkpoints write theirs (``checkpoint/checksum.py``: ``"crc32:<8 hex>"``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import orjson

from ..checkpoint import checksum as crc
from ..errors import ShardFormatError, ShardManifestError
from ..storage import Storage
from ..validate import check_id

__all__ = [
    "FORMAT",
    "MANIFEST",
    "Manifest",
    "ShardEntry",
    "ShardIndex",
    "check_objects",
    "checksum",
    "index_path",
    "manifest_path",
    "read_index",
    "read_manifest",
    "shard_name",
    "shard_path",
    "shards_prefix",
]

#: the manifest's object name, under ``{dataset_id}/shards/``
MANIFEST = "index.json"
#: what the manifest's ``format`` says: tars as webdataset writes them
FORMAT = "webdataset-tar"
_INDEX_SUFFIX = ".index.json"
_VERSION = 1


def shards_prefix(dataset_id: str) -> str:
    """``{dataset_id}/shards/``: where a dataset's objects live in its storage."""
    return f"{check_id('dataset_id', dataset_id)}/shards/"


def shard_name(number: int) -> str:
    """The name the writer gives its ``number``-th shard: ``shard-000000.tar``."""
    return f"shard-{number:06d}.tar"


def shard_path(dataset_id: str, name: str) -> str:
    """The path of the shard object ``name`` of ``dataset_id``."""
    return shards_prefix(dataset_id) + name


def index_path(dataset_id: str, name: str) -> str:
    """The path of the index object of shard ``name``."""
    return shards_prefix(dataset_id) + name + _INDEX_SUFFIX


def manifest_path(dataset_id: str) -> str:
    """The path of the dataset's manifest."""
    return shards_prefix(dataset_id) + MANIFEST


def checksum(data: bytes | memoryview) -> str:
    """A shard's checksum as the indexes record it: ``"crc32:<8 hex digits>"``."""
    return crc.format_checksum(zlib.crc32(data))


@dataclass(frozen=True)
class ShardIndex:
    """One shard's index: where each sample's members are in the tar.

    Attributes:
        name: the shard object's name (``shard-000000.tar``).
        size: the tar's size in bytes.
        checksum: the CRC-32 of the tar's bytes.
        keys: each sample's webdataset key (``__key__``), in the tar's order.
        offsets: each sample's first byte in the tar (its first member's header).
        sizes: each sample's bytes: its members' headers, data and padding.
        fields: each sample's fields as ``(name, data offset from the sample's first byte,
            size)`` (a reader slices them out without parsing tar headers); None in an
            index without them (the headers are parsed).
    """

    name: str
    size: int
    checksum: str
    keys: list[str] = field(repr=False)
    offsets: list[int] = field(repr=False)
    sizes: list[int] = field(repr=False)
    fields: list[list[tuple[str, int, int]]] | None = field(default=None, repr=False)

    @property
    def count(self) -> int:
        """Samples in the shard."""
        return len(self.keys)

    @cached_property
    def columns(self) -> tuple[tuple[str, ...], np.ndarray] | None:
        """When every sample has the same fields in the same order (the usual dataset): their
        names, and a ``(count, fields, 2)`` array of each field's data offset in the tar and
        size (a batch's spans are then one array index, not a loop over its samples); None
        otherwise, or without ``fields``."""
        fields = self.fields
        if not fields or len(fields) != self.count or len(self.offsets) != self.count:
            return None
        names = tuple(name for name, _, _ in fields[0])
        width = len(names)
        if any(len(sample) != width for sample in fields):
            return None
        flat = [member for sample in fields for member in sample]
        for j, name in enumerate(names):
            if any(member[0] != name for member in flat[j::width]):
                return None
        pairs = np.empty((len(flat), 2), dtype=np.int64)
        pairs[:, 0] = np.fromiter((member[1] for member in flat), np.int64, len(flat))
        pairs[:, 1] = np.fromiter((member[2] for member in flat), np.int64, len(flat))
        table = pairs.reshape(self.count, width, 2)
        table[:, :, 0] += np.asarray(self.offsets, dtype=np.int64)[:, None]
        return names, table

    def to_json(self) -> bytes:
        return orjson.dumps({
            "version": _VERSION, "name": self.name, "size": self.size, "checksum": self.checksum,
            "keys": self.keys, "offsets": self.offsets, "sizes": self.sizes,
            **({} if self.fields is None else {"fields": self.fields}),
        })  # fmt: skip

    @classmethod
    def from_json(cls, raw: bytes, *, dataset: str, path: str, backend: str) -> ShardIndex:
        """Parse an index object.

        Raises:
            ShardFormatError: it is not an index of this version, or its spans are not
                inside the tar.
        """
        try:
            doc: dict[str, Any] = orjson.loads(raw)
            if doc.get("version") != _VERSION:
                raise ValueError(f"version {doc.get('version')!r}, not {_VERSION}")
            keys, offsets, sizes = doc["keys"], doc["offsets"], doc["sizes"]
            # (checked as arrays: an index has a few entries per sample, read per shard)
            starts, lengths = np.asarray(offsets), np.asarray(sizes)
            if (
                not isinstance(keys, list) or not set(map(type, keys)) <= {str}
                or starts.dtype.kind != "i" or lengths.dtype.kind != "i"
                or starts.ndim != 1 or lengths.ndim != 1
            ):  # fmt: skip
                raise ValueError("keys, offsets or sizes are not lists of strings and integers")
            index = cls(str(doc["name"]), int(doc["size"]), str(doc["checksum"]), keys,
                        offsets, sizes, _fields(doc.get("fields")))  # fmt: skip
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ShardFormatError(
                f"not a shard index: {exc}", dataset=dataset, path=path, backend=backend
            ) from None
        spans_ok = len(starts) == len(lengths) == index.count and bool(
            (starts >= 0).all() and (lengths > 0).all() and (starts + lengths <= index.size).all()
        )
        columns = None
        if spans_ok and index.fields is not None and len(index.fields) == index.count:
            columns = index.columns
        if columns is not None:  # the usual index: checked as one array
            table = columns[1]
            ends = table[:, :, 0] + table[:, :, 1] - starts[:, None]
            spans_ok = spans_ok and bool(
                (table[:, :, 0] >= starts[:, None]).all() and (ends <= lengths[:, None]).all()
            )
        elif index.fields is not None:
            spans_ok = (
                spans_ok
                and len(index.fields) == index.count
                and all(
                    at >= 0 and at + n <= size
                    for size, sample in zip(index.sizes, index.fields, strict=True)
                    for _, at, n in sample
                )
            )
        if not spans_ok:
            raise ShardFormatError(
                f"the index's sample spans do not fit in its {index.size}-byte tar",
                dataset=dataset, path=path, backend=backend,
            )  # fmt: skip
        return index


def _fields(raw: Any) -> list[list[tuple[str, int, int]]] | None:
    if raw is None:
        return None
    return [[(str(n), int(at), int(size)) for n, at, size in sample] for sample in raw]


@dataclass(frozen=True)
class ShardEntry:
    """One shard as the manifest lists it."""

    name: str
    count: int
    size: int
    checksum: str


@dataclass(frozen=True)
class Manifest:
    """A dataset's manifest: its shards in order (shard ``i`` of the registered dataset is
    ``shards[i]``).

    Attributes:
        dataset: the dataset id.
        shards: the shards, in order.
    """

    dataset: str
    shards: list[ShardEntry]

    @property
    def total(self) -> int:
        """Samples in the dataset."""
        return sum(s.count for s in self.shards)

    @property
    def samples_per_shard(self) -> int:
        """The samples of every shard but the last (which may hold fewer).

        Sample id ``i`` is then sample ``i % samples_per_shard`` of shard ``i //
        samples_per_shard``, as ``DatasetParams`` tiles its ids: a dataset whose shards hold
        unequal counts (other than a shorter last one) has no such mapping and is refused
        (``check_counts``), rather than padded with ids that hold no sample.
        """
        return self.shards[0].count

    def check_counts(self, *, backend: str) -> None:
        """Refuse shards of unequal sample counts (but for a shorter last shard) and empty
        shards: the lease unit is one shard of ``samples_per_shard`` ids.

        Raises:
            ShardManifestError: naming the first shard out of line.
        """
        path = manifest_path(self.dataset)
        if not self.shards:
            raise ShardManifestError("the manifest lists no shard", dataset=self.dataset,
                                     path=path, backend=backend)  # fmt: skip
        per = self.samples_per_shard
        for i, entry in enumerate(self.shards):
            last = i == len(self.shards) - 1
            if entry.count < 1 or entry.count > per or (not last and entry.count != per):
                raise ShardManifestError(
                    f"shard {entry.name!r} holds {entry.count} samples where every shard but "
                    f"the last must hold {per} (the first shard's) and the last 1 to {per}: "
                    "write the dataset again with ShardWriter(samples_per_shard=...)",
                    dataset=self.dataset, path=path, backend=backend,
                )  # fmt: skip

    def to_json(self) -> bytes:
        return orjson.dumps({
            "version": _VERSION, "dataset": self.dataset, "format": FORMAT,
            "total": self.total, "samples_per_shard": self.samples_per_shard,
            "shards": [{"name": s.name, "count": s.count, "size": s.size,
                        "checksum": s.checksum} for s in self.shards],
        }, option=orjson.OPT_INDENT_2)  # fmt: skip

    @classmethod
    def from_json(cls, raw: bytes, *, dataset: str, backend: str) -> Manifest:
        """Parse a manifest.

        Raises:
            ShardManifestError: not a manifest of this version, or of another dataset.
        """
        path = manifest_path(dataset)
        try:
            doc: dict[str, Any] = orjson.loads(raw)
            if doc.get("version") != _VERSION or doc.get("format") != FORMAT:
                raise ValueError(f"version {doc.get('version')!r} format {doc.get('format')!r}")
            shards = [ShardEntry(str(s["name"]), int(s["count"]), int(s["size"]),
                                 str(s["checksum"])) for s in doc["shards"]]  # fmt: skip
            named = str(doc["dataset"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ShardManifestError(
                f"not a shard manifest: {exc}", dataset=dataset, path=path, backend=backend
            ) from None
        if named != dataset:
            raise ShardManifestError(f"the manifest is of dataset {named!r}", dataset=dataset,
                                     path=path, backend=backend)  # fmt: skip
        return cls(dataset, shards)


def read_manifest(storage: Storage, dataset_id: str) -> Manifest:
    """The dataset's manifest, read from ``storage``.

    Raises:
        StorageNotFoundError: no manifest (write the dataset, or ``index_tar_shards``).
        ShardManifestError: it does not parse.
    """
    raw = storage.read(manifest_path(dataset_id))
    return Manifest.from_json(raw, dataset=dataset_id, backend=storage.describe())


def read_index(storage: Storage, dataset_id: str, entry: ShardEntry) -> ShardIndex:
    """The index of the manifest's shard ``entry``, checked against the manifest.

    Raises:
        StorageNotFoundError: no index object.
        ShardFormatError: it does not parse, or disagrees with the manifest.
    """
    path = index_path(dataset_id, entry.name)
    backend = storage.describe()
    index = ShardIndex.from_json(storage.read(path), dataset=dataset_id, path=path,
                                 backend=backend)  # fmt: skip
    if (index.name, index.count, index.size, index.checksum) != (
        entry.name,
        entry.count,
        entry.size,
        entry.checksum,
    ):
        raise ShardFormatError(
            f"the index says {index.count} samples, {index.size} bytes, {index.checksum}; the "
            f"manifest {entry.count}, {entry.size}, {entry.checksum}",
            dataset=dataset_id, path=path, backend=backend,
        )  # fmt: skip
    return index


def check_objects(storage: Storage, manifest: Manifest) -> None:
    """Check that the storage holds exactly the manifest's shards (one listing).

    Raises:
        ShardManifestError: naming shards missing from storage, or tars the manifest lacks.
    """
    prefix = shards_prefix(manifest.dataset)
    stored = {p[len(prefix) :] for p in storage.list(prefix)}
    tars = {n for n in stored if n.endswith(".tar") and "/" not in n}
    named = [s.name for s in manifest.shards]
    missing = [n for n in named if n not in stored]
    missing += [n + _INDEX_SUFFIX for n in named if n + _INDEX_SUFFIX not in stored]
    extra = sorted(tars - set(named))
    if missing or extra or len(set(named)) != len(named):
        said = []
        if missing:
            said.append(f"{len(missing)} objects it names are not in storage ({missing[:3]}...)")
        if extra:
            said.append(f"{len(extra)} tars in storage are not in it ({extra[:3]}...)")
        if len(set(named)) != len(named):
            said.append("it names a shard twice")
        raise ShardManifestError(
            f"the manifest lists {len(named)} shards but " + "; ".join(said),
            dataset=manifest.dataset, path=manifest_path(manifest.dataset),
            backend=storage.describe(),
        )  # fmt: skip

"""A sharded dataset's description in storage: where its objects live, each shard's index and
the dataset's manifest, and how they are read back and checked.

The layout (the seeds' ``{root}/{dataset_id}/shards/``)::

    {dataset_id}/shards/shard-000000.tar              the samples, a webdataset-compatible tar
    {dataset_id}/shards/shard-000000.tar.index.json   its index: each sample's key, byte
                                                      offset and size in the tar, the shard's
                                                      size and CRC-32
    {dataset_id}/shards/shard-000000.tar.index.bin    the same index in binary form (arrays
                                                      loaded without parsing), when the
                                                      manifest says ``binary_index``
    {dataset_id}/shards/index.pack                    every shard's binary index in one object
                                                      (``IndexPack``), when they total at most
                                                      ``PACK_LIMIT`` bytes and the manifest
                                                      says ``index_pack``
    {dataset_id}/shards/index.json                    the manifest: every shard, in order, with
                                                      its sample count, size and CRC-32

A sample's byte range covers its members whole (headers, data and padding), so a range read
of it is a small tar of its own. The checksum is the standard CRC-32 of the shard's bytes,
written as the checkpoints write theirs (``checkpoint/checksum.py``: ``"crc32:<8 hex>"``).

The binary index (``ShardIndex.to_binary``) holds what the JSON one does, as little-endian
int64 arrays a reader takes as they are (``numpy.frombuffer``) and checks as arrays: a shard's
index is read at each use of the shard, and parsing 1,000 samples' JSON holds the GIL 1-2 ms
(the binary form: ~0.15 ms). Datasets written before it (no ``binary_index`` in their
manifest) are read through their JSON indexes, as before; the JSON index is still written
beside it, for readers of earlier versions.

The index pack holds the binary indexes once more, together: a reader fetching many small
shards from an object store reads it once (one request, in the background) rather than one
index object per shard, which would double its requests (an index is read at each use of
its shard). Its size and CRC-32 are in the manifest; a dataset whose indexes total more than
``PACK_LIMIT`` (shards of many samples each, where an index's request is small beside its
shard's) has none, nor do datasets written before it: their shards' own indexes are read.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator, Sequence
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
    "BINARY_INDEX_SUFFIX",
    "FORMAT",
    "INDEX_PACK",
    "MANIFEST",
    "PACK_LIMIT",
    "IndexPack",
    "Manifest",
    "PackEntry",
    "PackWriter",
    "ShardEntry",
    "ShardIndex",
    "binary_index_path",
    "check_objects",
    "checksum",
    "file_checksum",
    "index_pack_path",
    "index_path",
    "key_list",
    "manifest_path",
    "pack_indexes",
    "read_index",
    "read_manifest",
    "read_pack",
    "shard_name",
    "shard_path",
    "shards_prefix",
]

#: the manifest's object name, under ``{dataset_id}/shards/``
MANIFEST = "index.json"
#: what the manifest's ``format`` says: tars as webdataset writes them
FORMAT = "webdataset-tar"
_INDEX_SUFFIX = ".index.json"
#: the binary index's suffix after the shard's name
BINARY_INDEX_SUFFIX = ".index.bin"
_VERSION = 1
#: the binary index's first bytes (its version in the last)
_MAGIC = b"STRSIDX1"
_HEAD = struct.Struct("<8sQ")  # the magic, the JSON header's length
#: the index pack's object name, under ``{dataset_id}/shards/``
INDEX_PACK = "index.pack"
#: a dataset's binary indexes are packed (as well) while they total at most this many bytes
PACK_LIMIT = 64 * 2**20
_PACK_MAGIC = b"STRSPAK1"
_PACK_HEAD = struct.Struct("<8sQ")  # the magic, the number of indexes


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


def binary_index_path(dataset_id: str, name: str) -> str:
    """The path of the binary index object of shard ``name``."""
    return shards_prefix(dataset_id) + name + BINARY_INDEX_SUFFIX


def index_pack_path(dataset_id: str) -> str:
    """The path of the dataset's index pack."""
    return shards_prefix(dataset_id) + INDEX_PACK


def manifest_path(dataset_id: str) -> str:
    """The path of the dataset's manifest."""
    return shards_prefix(dataset_id) + MANIFEST


def checksum(data: bytes | memoryview) -> str:
    """A shard's checksum as the indexes record it: ``"crc32:<8 hex digits>"``."""
    return crc.format_checksum(zlib.crc32(data))


def file_checksum(fd: int, chunk: int = 256 * 1024) -> str:
    """``checksum`` of the bytes of the open file ``fd`` from its current offset on, read a
    chunk at a time into one buffer (no mapping: a thread checking a file takes no page
    faults in the address space the training thread works in, and the chunk stays in cache).
    """
    value = 0
    with memoryview(bytearray(chunk)) as buf:
        while n := os.readv(fd, [buf]):
            value = zlib.crc32(buf[:n], value)
    return crc.format_checksum(value)


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
    keys: Sequence[str] = field(repr=False)
    offsets: list[int] = field(repr=False)
    sizes: list[int] = field(repr=False)
    fields: Sequence[Sequence[tuple[str, int, int]]] | None = field(default=None, repr=False)

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
        fields = None if self.fields is None else [list(sample) for sample in self.fields]
        return orjson.dumps({
            "version": _VERSION, "name": self.name, "size": self.size, "checksum": self.checksum,
            "keys": list(self.keys), "offsets": self.offsets, "sizes": self.sizes,
            **({} if fields is None else {"fields": fields}),
        })  # fmt: skip

    def to_binary(self) -> bytes:
        """The index in binary form (``from_binary``): a JSON header (name, size, checksum,
        count, field names) and int64 arrays: each sample's offset and size, its first member
        (``count + 1`` bounds), each member's field name (a number in the header's names),
        data offset from its sample's first byte and size, each key's end in the keys' UTF-8
        bytes; then those bytes.

        Raises:
            ValueError: an index without ``fields`` (one only a tar's headers can be read by).
        """
        if self.fields is None:
            raise ValueError(f"the index of {self.name!r} has no fields: no binary form")
        names: dict[str, int] = {}
        bounds = [0]
        member_name: list[int] = []
        member_at: list[int] = []
        member_size: list[int] = []
        for sample in self.fields:
            for name, at, size in sample:
                member_name.append(names.setdefault(name, len(names)))
                member_at.append(at)
                member_size.append(size)
            bounds.append(len(member_name))
        encoded = [key.encode("utf-8", "surrogateescape") for key in self.keys]
        key_ends = np.cumsum([len(k) for k in encoded], dtype=np.int64)
        header = orjson.dumps({
            "name": self.name, "size": self.size, "checksum": self.checksum,
            "count": self.count, "members": len(member_name), "names": list(names),
        })  # fmt: skip
        header += b" " * (-len(header) % 8)  # (the arrays start 8-aligned)
        arrays = [self.offsets, self.sizes, bounds, member_name, member_at, member_size]
        return b"".join([
            _HEAD.pack(_MAGIC, len(header)), header,
            *(np.asarray(a, dtype="<i8").tobytes() for a in arrays),
            key_ends.astype("<i8").tobytes(), b"".join(encoded),
        ])  # fmt: skip

    @classmethod
    def from_binary(cls, raw: bytes, *, dataset: str, path: str, backend: str) -> ShardIndex:
        """Read an index's binary form (``to_binary``), checked as arrays: no Python loop over
        its samples but for slicing their keys (their fields are made when asked for).

        Raises:
            ShardFormatError: it is not a binary index of this version, or its spans are not
                inside the tar.
        """
        try:
            magic, length = _HEAD.unpack_from(raw)
            if magic != _MAGIC:
                raise ValueError(f"it starts {magic!r}, not {_MAGIC!r}")
            doc: dict[str, Any] = orjson.loads(raw[_HEAD.size : _HEAD.size + length])
            count, members = int(doc["count"]), int(doc["members"])
            names = tuple(str(n) for n in doc["names"])
            if count < 0 or members < 0:
                raise ValueError("a negative count")
            at = _HEAD.size + length
            lengths = (count, count, count + 1, members, members, members, count)
            end = at + 8 * sum(lengths)
            if len(raw) < end:
                raise ValueError(f"{len(raw)} bytes, its arrays need {end}")
            flat = np.frombuffer(raw, dtype="<i8", count=sum(lengths), offset=at)
            parts, cut = [], 0
            for n in lengths:  # (slices of one array: np.split costs ~90 us a call)
                parts.append(flat[cut : cut + n])
                cut += n
            offsets, sizes, bounds, member_name, member_at, member_size, key_ends = parts
            blob = raw[end:]
            name, size, checksum_ = str(doc["name"]), _tar_size(doc["size"]), str(doc["checksum"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, struct.error) as exc:
            raise ShardFormatError(
                f"not a binary shard index: {exc}", dataset=dataset, path=path, backend=backend
            ) from None
        # (each check one reduction, none on an empty array: min/max of none raise)
        per_sample = np.diff(bounds)
        ok = (
            bounds[0] == 0 and bounds[-1] == members
            and (count == 0 or per_sample.min() >= 0)
            and (members == 0 or (member_name.min() >= 0 and member_name.max() < len(names)))
            and (count == 0 or (key_ends[0] >= 0 and key_ends[-1] == len(blob)))
            and (count < 2 or np.diff(key_ends).min() >= 0)
        )  # fmt: skip
        if ok and count:  # (compared, not summed: no int64 overflow can pass a bad span)
            ok = bool(offsets.min() >= 0 and sizes.min() > 0 and (offsets <= size - sizes).all())
        if ok and members:
            owner = np.repeat(np.arange(count), per_sample)
            ok = bool(
                member_at.min() >= 0 and member_size.min() >= 0
                and (member_at <= sizes[owner] - member_size).all()
            )  # fmt: skip
        if not ok:
            raise ShardFormatError(
                f"the binary index's arrays do not fit together or in its {size}-byte tar",
                dataset=dataset, path=path, backend=backend,
            )  # fmt: skip
        fields = _Fields(names, bounds, member_name, member_at, member_size)
        index = cls(name, size, checksum_, _Keys(blob, key_ends), offsets.tolist(),
                    sizes.tolist(), fields)  # fmt: skip
        # the columns straight from the arrays (``columns`` would walk ``fields``)
        index.__dict__["columns"] = fields.columns(offsets)
        return index

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
            # (an empty list is no float array: a shard of no samples is an index too)
            starts = np.asarray(offsets) if offsets else np.zeros(0, dtype=np.int64)
            lengths = np.asarray(sizes) if sizes else np.zeros(0, dtype=np.int64)
            if (
                not isinstance(keys, list) or not set(map(type, keys)) <= {str}
                or starts.dtype.kind != "i" or lengths.dtype.kind != "i"
                or starts.ndim != 1 or lengths.ndim != 1
            ):  # fmt: skip
                raise ValueError("keys, offsets or sizes are not lists of strings and integers")
            index = cls(str(doc["name"]), _tar_size(doc["size"]), str(doc["checksum"]), keys,
                        offsets, sizes, _fields(doc.get("fields")))  # fmt: skip
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ShardFormatError(
                f"not a shard index: {exc}", dataset=dataset, path=path, backend=backend
            ) from None
        spans_ok = len(starts) == len(lengths) == index.count and bool(
            # (start <= size - length: start + length could wrap past int64's range)
            (starts >= 0).all() and (lengths > 0).all() and (starts <= index.size - lengths).all()
        )
        columns = None
        if spans_ok and index.fields is not None and len(index.fields) == index.count:
            columns = index.columns
        if columns is not None:  # the usual index: checked as one array
            table = columns[1]
            at = table[:, :, 0] - starts[:, None]  # each field's offset in its sample
            spans_ok = spans_ok and bool(
                (at >= 0).all() and (table[:, :, 1] >= 0).all()
                and (table[:, :, 1] <= lengths[:, None] - at).all()
            )  # fmt: skip
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


class _Keys(Sequence[str]):
    """A binary index's keys, decoded when first asked for (a reader of one field, which
    hands out no keys, never asks): ``_keys`` of its blob, then held."""

    def __init__(self, blob: bytes, ends: np.ndarray) -> None:
        self._blob, self._ends = blob, ends

    def __len__(self) -> int:
        return len(self._ends)

    @cached_property
    def decoded(self) -> list[str]:
        return _keys(self._blob, self._ends.tolist())

    def __getitem__(self, i: Any) -> Any:
        return self.decoded[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self.decoded)

    def __eq__(self, other: object) -> bool:
        return list(self) == (list(other) if isinstance(other, Sequence) else other)

    __hash__ = None  # type: ignore[assignment]


def key_list(keys: Sequence[str]) -> list[str]:
    """``keys`` as a list (a binary index's, decoded once): what ``_pick`` slices at C speed."""
    if isinstance(keys, _Keys):
        return keys.decoded
    return keys if isinstance(keys, list) else list(keys)  # (a list is not copied each batch)


def _keys(blob: bytes, ends: list[int]) -> list[str]:
    """The keys in ``blob`` (UTF-8, each ending at ``ends``): sliced from its text when it is
    ASCII (a character per byte: the usual keys), else decoded one by one."""
    starts = [0, *ends[:-1]]
    text = blob.decode("utf-8", "surrogateescape")
    if len(text) == len(blob):
        return [text[a:b] for a, b in zip(starts, ends, strict=True)]
    return [blob[a:b].decode("utf-8", "surrogateescape") for a, b in zip(starts, ends, strict=True)]


class _Fields(Sequence[Sequence[tuple[str, int, int]]]):
    """A binary index's fields: each sample's ``(name, data offset in the sample, size)``,
    made as they are asked for (a reader with ``columns`` never asks)."""

    def __init__(self, names: tuple[str, ...], bounds: np.ndarray, member_name: np.ndarray,
                 member_at: np.ndarray, member_size: np.ndarray) -> None:  # fmt: skip
        self._names, self._bounds = names, bounds
        self._name, self._at, self._size = member_name, member_at, member_size

    def __len__(self) -> int:
        return len(self._bounds) - 1

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        lo, hi = int(self._bounds[i]), int(self._bounds[i + 1])
        names = self._names
        members = zip(self._name[lo:hi].tolist(), self._at[lo:hi].tolist(),
                      self._size[lo:hi].tolist(), strict=True)  # fmt: skip
        return [(names[n], at, size) for n, at, size in members]

    def columns(self, offsets: np.ndarray) -> tuple[tuple[str, ...], np.ndarray] | None:
        """``ShardIndex.columns`` from the arrays: None unless every sample has the same
        fields in the same order."""
        count = len(self)
        if count == 0:
            return None
        width = int(self._bounds[1])
        if width == 0 or len(self._name) != count * width:
            return None
        slots = self._name.reshape(count, width)
        if not (slots == slots[0]).all() or not bool((np.diff(self._bounds) == width).all()):
            return None
        table = np.empty((count, width, 2), dtype=np.int64)
        table[:, :, 0] = self._at.reshape(count, width) + offsets[:, None]
        table[:, :, 1] = self._size.reshape(count, width)
        return tuple(self._names[n] for n in slots[0].tolist()), table


def _tar_size(raw: Any) -> int:
    """An index's tar size: an int in ``[0, 2**63)`` (the span checks compare ``size -
    length`` in int64: a size outside it would wrap past them)."""
    size = int(raw)
    if not 0 <= size < 2**63:
        raise ValueError(f"a tar size of {size} bytes")
    return size


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
class PackEntry:
    """The index pack as the manifest describes it: its size and CRC-32."""

    size: int
    checksum: str


@dataclass(frozen=True)
class Manifest:
    """A dataset's manifest: its shards in order (shard ``i`` of the registered dataset is
    ``shards[i]``).

    Attributes:
        dataset: the dataset id.
        shards: the shards, in order.
        binary_index: every shard has its index in binary form too (``.index.bin``);
            False in a manifest written before it (the JSON indexes are read).
        index_pack: the index pack's size and checksum; None: there is none (the indexes
            total more than ``PACK_LIMIT``, or the manifest was written before packs).
    """

    dataset: str
    shards: list[ShardEntry]
    binary_index: bool = False
    index_pack: PackEntry | None = None

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
            "binary_index": self.binary_index,
            **({} if self.index_pack is None else {"index_pack": {
                "size": self.index_pack.size, "checksum": self.index_pack.checksum}}),
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
            binary = doc.get("binary_index", False) is True
            packed = doc.get("index_pack")
            pack = None if packed is None else PackEntry(int(packed["size"]),
                                                         str(packed["checksum"]))  # fmt: skip
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ShardManifestError(
                f"not a shard manifest: {exc}", dataset=dataset, path=path, backend=backend
            ) from None
        if named != dataset:
            raise ShardManifestError(f"the manifest is of dataset {named!r}", dataset=dataset,
                                     path=path, backend=backend)  # fmt: skip
        return cls(dataset, shards, binary, pack)


def read_manifest(storage: Storage, dataset_id: str) -> Manifest:
    """The dataset's manifest, read from ``storage``.

    Raises:
        StorageNotFoundError: no manifest (write the dataset, or ``index_tar_shards``).
        ShardManifestError: it does not parse.
    """
    raw = storage.read(manifest_path(dataset_id))
    return Manifest.from_json(raw, dataset=dataset_id, backend=storage.describe())


def read_index(
    storage: Storage, dataset_id: str, entry: ShardEntry, *, binary: bool = False
) -> ShardIndex:
    """The index of the manifest's shard ``entry``, checked against the manifest.

    Args:
        binary: read its binary form (the manifest's ``binary_index``); else its JSON.

    Raises:
        StorageNotFoundError: no index object.
        ShardFormatError: it does not parse, or disagrees with the manifest.
    """
    path = (binary_index_path if binary else index_path)(dataset_id, entry.name)
    backend = storage.describe()
    parse = ShardIndex.from_binary if binary else ShardIndex.from_json
    index = parse(storage.read(path), dataset=dataset_id, path=path, backend=backend)
    return _as_listed(index, entry, dataset=dataset_id, path=path, backend=backend)


def _as_listed(
    index: ShardIndex, entry: ShardEntry, *, dataset: str, path: str, backend: str
) -> ShardIndex:
    """``index``, if it describes the manifest's shard ``entry``.

    Raises:
        ShardFormatError: it describes another.
    """
    if (index.name, index.count, index.size, index.checksum) != (
        entry.name,
        entry.count,
        entry.size,
        entry.checksum,
    ):
        raise ShardFormatError(
            f"the index says {index.name!r}, {index.count} samples, {index.size} bytes, "
            f"{index.checksum}; the manifest {entry.name!r}, {entry.count}, {entry.size}, "
            f"{entry.checksum}",
            dataset=dataset, path=path, backend=backend,
        )  # fmt: skip
    return index


def pack_indexes(binary_indexes: Sequence[bytes]) -> bytes:
    """The index pack of these binary indexes (``ShardIndex.to_binary``), in shard order: a
    magic, their number, each one's end (little-endian int64), then the indexes."""
    ends = np.cumsum([len(b) for b in binary_indexes], dtype=np.int64)
    return b"".join([_PACK_HEAD.pack(_PACK_MAGIC, len(binary_indexes)),
                     ends.astype("<i8").tobytes(), *binary_indexes])  # fmt: skip


class PackWriter:
    """A dataset's binary indexes, collected in shard order for its index pack while they
    total at most ``limit`` bytes; ``write`` stores the pack and returns what the manifest
    says of it (None, writing nothing, past the limit)."""

    def __init__(self, limit: int = PACK_LIMIT) -> None:
        self.limit = limit
        self._indexes: list[bytes] | None = []
        self._size = 0

    def add(self, binary_index: bytes) -> None:
        self._size += len(binary_index)
        if self._indexes is not None and self._size <= self.limit:
            self._indexes.append(binary_index)
        else:
            self._indexes = None  # (past the limit: none held)

    def write(self, storage: Storage, dataset_id: str) -> PackEntry | None:
        """Store the pack (``index_pack_path``) and return its entry, or None.

        Raises:
            StorageError: the write failed.
        """
        if not self._indexes:
            return None
        pack = pack_indexes(self._indexes)
        storage.write(index_pack_path(dataset_id), pack)
        return PackEntry(len(pack), checksum(pack))


class IndexPack:
    """A dataset's index pack, read whole and checked against its manifest; ``index(shard)``
    reads one shard's index out of it (as ``read_index`` would its own object).

    Raises:
        ShardFormatError: the bytes are not the manifest's pack (size, checksum, or not a
            pack of its shards).
    """

    def __init__(self, raw: bytes, manifest: Manifest, *, backend: str) -> None:
        self.manifest, self.backend = manifest, backend
        self.path = path = index_pack_path(manifest.dataset)
        expected = manifest.index_pack
        try:
            if expected is None:
                raise ValueError("the manifest names no index pack")
            if len(raw) != expected.size or checksum(raw) != expected.checksum:
                raise ValueError(
                    f"{len(raw)} bytes of checksum {checksum(raw)}, the manifest says "
                    f"{expected.size} of {expected.checksum}"
                )
            magic, count = _PACK_HEAD.unpack_from(raw)
            if magic != _PACK_MAGIC or count != len(manifest.shards):
                raise ValueError(f"it starts {magic!r} and holds {count} indexes, not "
                                 f"{len(manifest.shards)}")  # fmt: skip
            at = _PACK_HEAD.size + 8 * count
            ends = np.frombuffer(raw, dtype="<i8", count=count, offset=_PACK_HEAD.size)
            starts = np.concatenate(([0], ends[:-1]))
            if count and (ends[-1] != len(raw) - at or bool((ends < starts).any())):
                raise ValueError("its indexes' ends do not fit in it")
        except (ValueError, struct.error) as exc:
            raise ShardFormatError(f"not the manifest's index pack: {exc}",
                                   dataset=manifest.dataset, path=path,
                                   backend=backend) from None  # fmt: skip
        self._raw = raw
        self._spans = [(at + int(a), at + int(b)) for a, b in zip(starts, ends, strict=True)]

    @property
    def size(self) -> int:
        return len(self._raw)

    def index(self, shard: int) -> ShardIndex:
        """Shard ``shard``'s index (the manifest's ``shards[shard]``).

        Raises:
            ShardFormatError: it does not parse, or disagrees with the manifest.
        """
        start, end = self._spans[shard]
        dataset, backend = self.manifest.dataset, self.backend
        index = ShardIndex.from_binary(self._raw[start:end], dataset=dataset, path=self.path,
                                       backend=backend)  # fmt: skip
        return _as_listed(index, self.manifest.shards[shard], dataset=dataset, path=self.path,
                          backend=backend)  # fmt: skip


def read_pack(storage: Storage, manifest: Manifest) -> IndexPack:
    """The dataset's index pack (the manifest's ``index_pack``), read whole.

    Raises:
        StorageNotFoundError: no pack object.
        ShardFormatError: it is not the manifest's pack.
    """
    raw = storage.read(index_pack_path(manifest.dataset))
    return IndexPack(raw, manifest, backend=storage.describe())


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
    if manifest.binary_index:
        suffix = BINARY_INDEX_SUFFIX
        missing += [n + suffix for n in named if n + suffix not in stored]
    if manifest.index_pack is not None and INDEX_PACK not in stored:
        missing.append(INDEX_PACK)
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

"""``ShardWriter``: samples in, webdataset tars with their indexes and a manifest out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType

from ..storage import Storage, as_byte_view
from ..validate import check_id, check_int
from .index import (
    Manifest,
    PackWriter,
    ShardEntry,
    ShardIndex,
    binary_index_path,
    checksum,
    index_path,
    manifest_path,
    shard_name,
    shard_path,
)
from .tarball import BLOCK, END, encode_member, split_key

__all__ = ["ShardSet", "ShardWriter"]

#: the field a sample given as bytes is stored under (``<key>.bin``)
BYTES_FIELD = "bin"


@dataclass(frozen=True)
class ShardSet:
    """A written dataset, as ``ShardWriter.close()`` describes it.

    Attributes:
        dataset: the dataset id.
        storage: the storage's description (``s3://bucket/prefix``, ``file:///root``).
        manifest: the manifest written (its shards, their counts, sizes and checksums).
    """

    dataset: str
    storage: str
    manifest: Manifest

    @property
    def total(self) -> int:
        """Samples written."""
        return self.manifest.total

    @property
    def num_shards(self) -> int:
        """Shards written."""
        return len(self.manifest.shards)

    @property
    def samples_per_shard(self) -> int:
        """Samples of every shard but the last."""
        return self.manifest.samples_per_shard


class ShardWriter:
    """Write samples as webdataset-compatible tars of ``samples_per_shard`` samples each,
    with an index per shard (JSON and binary), the index pack (every binary index in one
    object, while they total at most ``index.PACK_LIMIT``) and the dataset's manifest
    (``shards/index.py``), to ``storage``.

    Each full shard is written as soon as it is full (its tar, then its index); ``close``
    writes the last, shorter one, the index pack and then the manifest, which is what
    readers and ``register_shards`` go by: a writer that dies leaves no manifest (or the
    previous one).

    Example::

        with ShardWriter(storage, "my-data", samples_per_shard=1000) as writer:
            for image, label in source:
                writer.write({"jpg": image, "cls": str(label).encode()})
        print(writer.shard_set.total)

    Args:
        storage: where the dataset goes (its ``{dataset_id}/shards/``).
        dataset_id: the dataset id (a ``validate.check_id`` id; the registered name).
        samples_per_shard: samples in every shard but the last.

    Raises:
        TypeError, ValueError: a bad argument, naming it.
    """

    def __init__(self, storage: Storage, dataset_id: str, *, samples_per_shard: int) -> None:
        if not isinstance(storage, Storage):
            raise TypeError(f"storage must be a Storage, got {type(storage).__name__}")
        self.storage = storage
        self.dataset = check_id("dataset_id", dataset_id)
        self.samples_per_shard = check_int("samples_per_shard", samples_per_shard, low=1,
                                           high=2**31)  # fmt: skip
        self._entries: list[ShardEntry] = []
        self._pack = PackWriter()  # the binary indexes, for the index pack
        self._parts: list[bytes] = []
        self._size = 0
        self._keys: list[str] = []
        self._offsets: list[int] = []
        self._sizes: list[int] = []
        self._fields: list[list[tuple[str, int, int]]] = []
        self._written = 0
        self._closed: ShardSet | None = None

    def __repr__(self) -> str:
        return f"ShardWriter({self.dataset!r}, {self.storage.describe()!r})"

    def write(self, sample: bytes | Mapping[str, object]) -> None:
        """Add one sample: ``bytes`` (stored as the field ``bin``) or a mapping of field name
        to bytes (any buffer: numpy arrays too; ``str`` is UTF-8 encoded), with an optional
        ``"__key__"`` (default: the sample's number, 9 digits).

        Raises:
            TypeError, ValueError: a bad sample (a field that is no buffer, a key or field
                name a tar member name cannot carry); RuntimeError: after ``close``.
            StorageError: writing a full shard failed.
        """
        if self._closed is not None:
            raise RuntimeError(f"{self!r} is closed")
        fields: Mapping[str, object]
        if isinstance(sample, (bytes, bytearray, memoryview)):
            fields = {BYTES_FIELD: sample}
        elif isinstance(sample, Mapping):
            fields = sample
        else:
            raise TypeError(
                f"sample must be bytes or a mapping of fields, got {type(sample).__name__}"
            )
        key = fields.get("__key__", f"{self._written:09d}")
        if not isinstance(key, str) or not key or "." in key.rpartition("/")[2]:
            raise ValueError(
                f"sample key {key!r} must be a non-empty str with no '.' in its last name"
            )
        parts: list[bytes] = []
        spans: list[tuple[str, int, int]] = []
        at = 0
        for name, value in fields.items():
            if name == "__key__":
                continue
            if not isinstance(name, str) or not name or "/" in name:
                raise ValueError(f"field name {name!r} must be a non-empty str without '/'")
            data = value.encode() if isinstance(value, str) else as_byte_view(value, arg=name)
            member = f"{key}.{name}"
            if split_key(member) != (key, name):
                raise ValueError(f"field {name!r} of sample {key!r} makes an unreadable name")
            part = encode_member(member, data)
            spans.append((name, at + BLOCK, len(data)))  # (a ustar header is one block)
            at += len(part)
            parts.append(part)
        if not parts:
            raise ValueError(f"sample {key!r} has no field")
        size = sum(len(p) for p in parts)
        self._keys.append(key)
        self._offsets.append(self._size)
        self._sizes.append(size)
        self._fields.append(spans)
        self._parts.extend(parts)
        self._size += size
        self._written += 1
        if len(self._keys) == self.samples_per_shard:
            self._flush()

    def _flush(self) -> None:
        if not self._keys:
            return
        name = shard_name(len(self._entries))
        self._parts.append(END)
        data = b"".join(self._parts)
        index = ShardIndex(name, len(data), checksum(data), self._keys, self._offsets, self._sizes,
                           self._fields)  # fmt: skip
        self.storage.write(shard_path(self.dataset, name), data)
        self.storage.write(index_path(self.dataset, name), index.to_json())
        binary = index.to_binary()
        self.storage.write(binary_index_path(self.dataset, name), binary)
        self._pack.add(binary)
        self._entries.append(ShardEntry(name, index.count, index.size, index.checksum))
        self._parts, self._size = [], 0
        self._keys, self._offsets, self._sizes, self._fields = [], [], [], []

    def close(self) -> ShardSet:
        """Write the last shard and the manifest; return the dataset written (again: the same).

        Raises:
            ValueError: no sample was written.
            StorageError: a write failed.
        """
        if self._closed is not None:
            return self._closed
        self._flush()
        if not self._entries:
            raise ValueError(f"{self!r}: no sample was written")
        pack = self._pack.write(self.storage, self.dataset)
        manifest = Manifest(self.dataset, list(self._entries), binary_index=True, index_pack=pack)
        self.storage.write(manifest_path(self.dataset), manifest.to_json())
        self._closed = ShardSet(self.dataset, self.storage.describe(), manifest)
        return self._closed

    @property
    def shard_set(self) -> ShardSet:
        """The dataset written (after ``close``, or the ``with`` block).

        Raises:
            RuntimeError: not closed yet.
        """
        if self._closed is None:
            raise RuntimeError(f"{self!r} is not closed yet")
        return self._closed

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:  # a failed block writes no manifest: the dataset is not there
            self.close()

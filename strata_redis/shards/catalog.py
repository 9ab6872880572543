"""A dataset's shards as a job knows them: existing tars indexed in place, and the dataset
registered with the sample count and shard size its manifest gives."""

from __future__ import annotations

from typing import Any

from ..data.sharding import DatasetParams
from ..errors import ShardFormatError, ShardManifestError
from ..shard_manager import ShardManager
from ..storage import Storage
from .index import (
    Manifest,
    PackWriter,
    ShardEntry,
    ShardIndex,
    binary_index_path,
    check_objects,
    checksum,
    index_path,
    manifest_path,
    read_manifest,
    shard_path,
    shards_prefix,
)
from .tarball import TarError, parse_members, split_key

__all__ = ["index_tar_shards", "register_shards"]

#: bytes one ranged read of a scan fetches at least (headers of small members come together)
WINDOW = 256 * 1024


class _Window:
    """``read(offset, length)`` over an object through ranged reads of ``WINDOW`` bytes at
    least: a scan of headers reads each stretch once and skips large members' data."""

    def __init__(self, storage: Storage, path: str) -> None:
        self.storage, self.path = storage, path
        self.start, self.data = 0, b""
        self.reads = 0

    def __call__(self, offset: int, length: int) -> bytes:
        end = offset + length
        if not (self.start <= offset and end <= self.start + len(self.data)):
            self.start = offset
            self.data = self.storage.read_range(self.path, offset, max(length, WINDOW))
            self.reads += 1
        return self.data[offset - self.start : end - self.start]

    def size_from(self, offset: int) -> int:
        """The object's size, knowing it has ``offset`` bytes at least."""
        while True:
            rest = self.storage.read_range(self.path, offset, WINDOW)
            self.reads += 1
            if len(rest) < WINDOW:
                return offset + len(rest)
            offset += len(rest)


def _index_tar(storage: Storage, dataset_id: str, name: str, *, checksums: bool) -> ShardIndex:
    path = shard_path(dataset_id, name)
    whole = storage.read(path) if checksums else None
    window = _Window(storage, path)

    def read(offset: int, length: int) -> bytes:
        return whole[offset : offset + length] if whole is not None else window(offset, length)

    keys: list[str] = []
    offsets: list[int] = []
    ends: list[int] = []
    fields: list[list[tuple[str, int, int]]] = []
    end = 0
    try:
        for member in parse_members(read, 0, None):
            split = split_key(member.name)
            end = member.end
            if split is None:
                continue
            if keys and keys[-1] == split[0] and ends[-1] == member.header:
                ends[-1] = member.end  # one more field of the same sample
                fields[-1].append((split[1], member.data - offsets[-1], member.size))
                continue
            if split[0] in keys[-1:]:
                raise TarError(f"the members of sample {split[0]!r} are not consecutive")
            keys.append(split[0])
            offsets.append(member.header)
            ends.append(member.end)
            fields.append([(split[1], member.data - member.header, member.size)])
        if end and not read(end - 1, 1):  # its last member's (padded) data is not all there
            raise TarError(f"truncated: the last member ends at byte {end}, past the end")
        size = len(whole) if whole is not None else window.size_from(end)
    except TarError as exc:
        raise ShardFormatError(str(exc), dataset=dataset_id, path=path,
                               backend=storage.describe()) from None  # fmt: skip
    sizes = [e - o for o, e in zip(offsets, ends, strict=True)]
    return ShardIndex(name, size, checksum(whole) if whole is not None else "", keys, offsets,
                      sizes, fields)  # fmt: skip


def index_tar_shards(storage: Storage, dataset_id: str, *, checksums: bool = False) -> Manifest:
    """Index the webdataset tars already under ``{dataset_id}/shards/`` in place: write each
    one's index (JSON and binary), the index pack and the dataset's manifest, converting
    nothing.

    The tars are taken in name order (shard ``i`` is the ``i``-th name). A scan reads the
    tar headers only, through ranged reads of ``WINDOW`` bytes (the data of members larger
    than that is skipped); ``checksums=True`` reads each tar whole once instead, to record
    its CRC-32 (then verified at every read, as for the shards ``ShardWriter`` writes; without
    it a read checks sizes and headers only).

    Returns:
        The manifest written.

    Raises:
        ShardManifestError: no ``.tar`` there.
        ShardFormatError: a tar does not parse (naming it).
        StorageError: the storage failed.
    """
    prefix = shards_prefix(dataset_id)
    names = sorted(
        p[len(prefix) :] for p in storage.list(prefix)
        if p.endswith(".tar") and "/" not in p[len(prefix) :]
    )  # fmt: skip
    if not names:
        raise ShardManifestError("no .tar shard to index", dataset=dataset_id, path=prefix,
                                 backend=storage.describe())  # fmt: skip
    entries = []
    pack = PackWriter()
    for name in names:
        index = _index_tar(storage, dataset_id, name, checksums=checksums)
        if not index.count:
            raise ShardFormatError("the tar holds no sample", dataset=dataset_id,
                                   path=shard_path(dataset_id, name),
                                   backend=storage.describe())  # fmt: skip
        storage.write(index_path(dataset_id, name), index.to_json())
        binary = index.to_binary()
        storage.write(binary_index_path(dataset_id, name), binary)
        pack.add(binary)
        entries.append(ShardEntry(name, index.count, index.size, index.checksum))
    Manifest(dataset_id, entries).check_counts(backend=storage.describe())
    manifest = Manifest(dataset_id, entries, binary_index=True,
                        index_pack=pack.write(storage, dataset_id))  # fmt: skip
    storage.write(manifest_path(dataset_id), manifest.to_json())
    return manifest


def register_shards(
    job_or_manager: Any, storage: Storage, dataset_id: str, *, shuffle: bool = True, seed: int = 0
) -> DatasetParams:
    """Register ``dataset_id`` with the job from its manifest in ``storage``: its real total,
    and samples per shard as its shards hold them (every shard but the last the same count).

    Args:
        job_or_manager: a ``ShardManager``, a ``Job``, a ``TrainingOrchestrator`` or a Redis
            URL (what ``ShardManager`` takes).
        storage: where the dataset is.
        dataset_id: the dataset (and the registered name).
        shuffle: reorder shards and samples every epoch (``register_dataset_params``).
        seed: the shuffle seed.

    Returns:
        The registered parameters.

    Raises:
        StorageNotFoundError: no manifest.
        ShardManifestError: the manifest's shards are not the ones in storage, or their
            counts are unequal (other than a shorter last one).
        DatasetConflictError: registered already with other parameters.
    """
    manifest = read_manifest(storage, dataset_id)
    manifest.check_counts(backend=storage.describe())
    check_objects(storage, manifest)
    manager = job_or_manager if isinstance(job_or_manager, ShardManager) else None
    owned = manager is None
    if manager is None:
        manager = ShardManager(job_or_manager)
    try:
        return manager.register_dataset_params(
            dataset_id, manifest.total, manifest.samples_per_shard, shuffle, seed
        )
    finally:
        if owned and not hasattr(job_or_manager, "context"):
            manager.job.close()  # a manager of our own on a URL: its connection too

"""``ShardFeed``: a worker's lease walk of a sharded dataset turned into work items, in the
one process that holds the leases.

The walk (``ShardStream``) hands out batches of sample ids, each within one shard, in the
epoch's shuffled order. For each, the feed makes sure the shard's bytes are on local disk
(``ShardFetcher``: demanded at the shard's first batch, the shards this worker expects next
fetched ahead) and hands out a ``WorkItem``: the ids with their byte spans in the local file.
Reading the samples of an item (``WorkItem.samples``) needs nothing but that file: a
``DataLoader`` worker process does it. A shard's first batch may start part-way (a resumed
position, a part another worker handed back): only the samples still to train are fetched
then, by ranged reads. Done shards are never read.

The shards expected next are this worker's own shards of the round's assignment in the
epoch's order, less those done when the walk began and those before the shard just leased
(the lease walk leases its own shards in that order); a shard stolen from another worker is
fetched on demand.
"""

from __future__ import annotations

import mmap
import multiprocessing
import operator
import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..data.sharding import DatasetParams, assignment
from ..data.stream import ShardStream
from ..errors import ShardChecksumError, ShardFormatError, ShardManifestError
from ..storage import Storage
from .fetcher import Fetched, ShardFetcher
from .index import Manifest, ShardIndex, key_list, manifest_path, read_manifest, shard_path
from .tarball import TarError, sample_fields

__all__ = ["ShardFeed", "WorkItem"]


@dataclass(frozen=True)
class WorkItem:
    """One batch's samples: where their bytes are on local disk. Picklable: what a
    ``DataLoader`` worker gets in place of indices.

    Attributes:
        dataset: the dataset id.
        shard: the shard's name (``shard-000000.tar``).
        path: the local file holding the shard's bytes at their tar offsets.
        ids: the samples' dataset-wide ids, in the epoch's order.
        spans: each sample's (offset, size) in the tar (unused with ``columns``).
        fields: each sample's fields as (name, offset in its span, size), when the index
            has them (then no tar header is parsed); None: parse the headers.
        keys: each sample's key, with ``fields`` or ``columns`` (None in an item made for
            one field: ``ShardFeed(field=)``).
        backend, object_path: where the shard is in storage (for errors).
        columns: when every sample has the same fields (``ShardIndex.columns``): their
            names, and an array ``(len(ids), fields, 2)`` of each field's offset in the tar
            and size (then ``spans`` and ``fields`` are not used).
        stamp: for a storage's own file read in place, its (device, inode, size, mtime)
            when its checksum was checked: a file found changed since is refused (a dataset
            rewritten under a running job), not read unchecked.
    """

    dataset: str
    shard: str
    path: str
    ids: list[int]
    spans: Sequence[tuple[int, int]]
    backend: str = ""
    object_path: str = ""
    fields: Sequence[list[tuple[str, int, int]]] | None = None
    keys: Sequence[str] | None = None
    columns: tuple[tuple[str, ...], np.ndarray] | None = None
    stamp: tuple[int, int, int, int] | None = None

    def samples(self) -> list[dict[str, Any]]:
        """The samples: ``{"__key__": key, "__id__": id, field: bytes, ...}`` each.

        Raises:
            ShardFormatError: a span is not a sample's tar members.
            ShardChecksumError: the storage's own file, read in place, changed since its
                checksum was checked.
        """
        view = self._view()
        keys = self.keys or [""] * len(self.ids)
        if self.columns is not None:
            names, table = self.columns
            if len(names) == 1:  # the usual sample: one field
                name = names[0]
                starts, ends = _bounds(table[:, 0])
                return [
                    {"__key__": key, name: view[at:end], "__id__": sample_id}
                    for sample_id, key, at, end in zip(self.ids, keys, starts, ends, strict=True)
                ]
            out: list[dict[str, Any]] = []
            for sample_id, key, row in zip(self.ids, keys, table.tolist(), strict=True):
                sample: dict[str, Any] = {"__key__": key}
                for name, (at, n) in zip(names, row, strict=True):
                    sample[name] = view[at : at + n]
                sample["__id__"] = sample_id
                out.append(sample)
            return out
        return self._parsed(view, keys)

    def field(self, name: str) -> list[bytes]:
        """Each sample's field ``name`` (its bytes), in the samples' order: no dict is made
        when every sample has the same fields (``columns``).

        Raises:
            ShardFormatError: a sample has no such field, or a span is not a sample's tar
                members.
            ShardChecksumError: as ``samples``.
        """
        if self.columns is not None and name in self.columns[0]:
            view = self._view()
            starts, ends = _bounds(self.columns[1][:, self.columns[0].index(name)])
            return [view[at:end] for at, end in zip(starts, ends, strict=True)]
        out: list[bytes] = []
        for sample in self.samples():
            if name not in sample:
                raise ShardFormatError(
                    f"sample {sample['__id__']} has no field {name!r} (it has "
                    f"{sorted(k for k in sample if not k.startswith('__'))})",
                    dataset=self.dataset, path=self.object_path or self.shard,
                    backend=self.backend,
                )  # fmt: skip
            out.append(sample[name])
        return out

    def _view(self) -> mmap.mmap | bytes:
        """The local file's bytes (mapped), checked unchanged since its checksum was."""
        view, stamp = _mapped(self.path)
        if self.stamp is not None and stamp != self.stamp:
            raise ShardChecksumError(
                "the file changed after its checksum was checked (a shard read in place "
                "must not change while a job trains from it)", dataset=self.dataset,
                path=self.object_path or self.shard, backend=self.backend,
            )  # fmt: skip
        return view

    def _parsed(self, view: mmap.mmap | bytes, keys: Sequence[str]) -> list[dict[str, Any]]:
        """The samples from the index's per-sample fields, or else by their tar headers."""
        out: list[dict[str, Any]] = []
        if self.fields is not None:
            for sample_id, key, (offset, _), members in zip(
                self.ids, keys, self.spans, self.fields, strict=True
            ):
                sample: dict[str, Any] = {"__key__": key}
                for name, at, n in members:
                    sample[name] = view[offset + at : offset + at + n]
                sample["__id__"] = sample_id
                out.append(sample)
            return out
        for sample_id, (offset, size) in zip(self.ids, self.spans, strict=True):
            try:
                fields = sample_fields(view[offset : offset + size], offset)
            except TarError as exc:
                raise ShardFormatError(
                    f"sample {sample_id}: {exc}", dataset=self.dataset,
                    path=self.object_path or self.shard, backend=self.backend,
                ) from None  # fmt: skip
            fields["__id__"] = sample_id
            out.append(fields)
        return out


#: a shard file of at most this many bytes is read whole, not mapped, in a process that is
#: not a DataLoader worker (daemonic): one that reads every batch of the shard, where one
#: read costs less than the page faults of a map (a local num_workers=0 epoch of the
#: bench's 2.5 MB shards: 0.47-0.52 s mapped, 0.29-0.38 s read); a loader worker, which
#: reads a few of a shard's batches, maps it
READ_WHOLE = 64 * 1024 * 1024

#: this process's last mapped shard file: (path, (device, inode, size, mtime), its map)
_MAPPED: list[tuple[str, tuple[int, int, int, int], mmap.mmap | bytes]] = []


def _mapped(path: str) -> tuple[mmap.mmap | bytes, tuple[int, int, int, int]]:
    """The file at ``path``, mapped read-only (or read whole: ``READ_WHOLE``); the last one
    stays mapped (a loader worker reads a shard's batches one after the other: one map per
    shard, not an open and a read per sample). A file replaced at the same path (a new
    inode) is mapped anew; at most one shard's file stays mapped per process (deleted, its
    space is freed once the next is). Returns the map and the file's (device, inode, size,
    mtime)."""
    if _MAPPED and _MAPPED[0][0] == path:  # the usual case: one stat, no open
        st = os.stat(path)
        if _MAPPED[0][1] == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns):
            return _MAPPED[0][2], _MAPPED[0][1]
    with open(path, "rb", buffering=0) as file:
        st = os.fstat(file.fileno())
        stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if not st.st_size:
            view: mmap.mmap | bytes = b""
        elif st.st_size <= READ_WHOLE and not multiprocessing.current_process().daemon:
            view = file.readall()  # (see READ_WHOLE)
        else:
            view = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    _MAPPED[:] = [(path, stamp, view)]  # (the old map is unmapped once no reader holds it)
    return view, stamp


def _bounds(spans: np.ndarray) -> tuple[list[int], list[int]]:
    """Each (offset, size) row of ``spans`` as its start and end offsets, two lists."""
    starts = spans[:, 0]
    return starts.tolist(), (starts + spans[:, 1]).tolist()


class ShardFeed:
    """Work items from a lease walk of a sharded dataset (see the module docstring).

    Args:
        stream: the worker's ``ShardStream`` of the dataset (the orchestrator's
            ``get_shards``).
        storage: where the dataset's shards are.
        members: the round's worker ids, and this worker's (for the shards expected next):
            a callable, read at each walk's start.
        worker_id: this worker.
        prefetch: shards fetched ahead at most (``ShardFetcher``).
        cache_dir: a cache directory of whole shards (``ShardFetcher``).
        cache_bytes: its size limit (``ShardFetcher``).
        storage_wait: seconds a fetch retries while the storage fails (``ShardFetcher``).
        processes: from a remote storage (S3), helper processes that copy the shards
            (``ShardFetcher``; default 2; 0: the fetch threads copy them).
        field: the one field the items are read for (``WorkItem.field``): when every sample
            has it, an item holds that field's spans alone, and no keys.

    Raises:
        StorageNotFoundError: the dataset has no manifest.
        ShardManifestError: the dataset was registered with a total or a shard size its
            manifest does not have.
    """

    def __init__(
        self,
        stream: ShardStream,
        storage: Storage,
        *,
        members: Callable[[], tuple[str, ...]],
        worker_id: str,
        prefetch: int = 2,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int | None = None,
        storage_wait: float = 60.0,
        field: str | None = None,
        processes: int = 2,
    ) -> None:
        self.stream = stream
        self.field = field
        self.params: DatasetParams = stream.params
        self.storage = storage
        self.manifest: Manifest = read_manifest(storage, self.params.name)
        _check_registration(self.params, self.manifest, storage)
        self.fetcher = ShardFetcher(storage, self.manifest, prefetch=prefetch,
                                    cache_dir=cache_dir, cache_bytes=cache_bytes,
                                    storage_wait=storage_wait, processes=processes)  # fmt: skip
        self._members = members
        self._worker_id = worker_id
        self._backend = storage.describe()
        self._expected: list[int] = []
        # per item handed out and not consumed: its shard; per shard, items out, and
        # whether its last item is out (its demands are released once both say so), and its
        # demands (a shard leased again in one walk, its lease taken back meanwhile, is
        # demanded again while its first items may still be out: each demand is released)
        self._pending: deque[int] = deque()
        self._out: dict[int, int] = {}
        self._closed_shards: set[int] = set()
        self._demands: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"ShardFeed({self.params.name!r}, {self.storage.describe()!r})"

    def items(self, batches: Iterator[Any]) -> Iterator[WorkItem]:
        """The work items of one walk's batches (numpy arrays of sample ids); the walk is
        closed when they end (an error included)."""
        self._forget_walk()
        per = self.params.samples_per_shard
        current = -1
        left = 0
        fetched: Fetched | None = None
        index: ShardIndex | None = None
        columns: tuple[tuple[str, ...], np.ndarray] | None = None
        object_path = ""
        first = True
        # the walk's first item goes out before the shards after it are asked for (their
        # fetches start threads: on a busy machine that waits, and a resume waits for its
        # first batch only)
        later: tuple[int, int] | None = None
        try:
            for batch in batches:
                ids = batch.tolist()
                shard = ids[0] // per
                if shard != current:
                    self._close_shard(current)
                    position = self.stream.position
                    assert position is not None
                    if first:
                        self._plan(position.epoch, position.done())
                        first = False
                    order = self.params.shard(shard, position.epoch).indices()
                    start = int(np.flatnonzero(order == ids[0])[0])
                    positions = None if start == 0 else (order[start:] - shard * per).tolist()
                    future = self.fetcher.demand(shard, positions)
                    self._demands[shard] = self._demands.get(shard, 0) + 1
                    self._out.setdefault(shard, 0)
                    self._closed_shards.discard(shard)
                    if self._pending or later is not None:
                        self._advance(shard, position.epoch)
                    else:
                        later = (shard, position.epoch)
                    fetched = future.result()
                    current, left = shard, len(order) - start
                    index = fetched.index
                    columns = index.columns
                    object_path = shard_path(self.params.name, index.name)
                assert fetched is not None and index is not None
                at = np.asarray(batch) - shard * per
                if columns is not None and self.field in columns[0]:  # one field's spans
                    field = self.field
                    column = columns[1][at, columns[0].index(field)][:, None]
                    item = WorkItem(self.params.name, index.name, fetched.path, ids, (),
                                    self._backend, object_path, None, None,
                                    ((field,), column), fetched.stamp)  # fmt: skip
                elif columns is not None:
                    names, table = columns
                    item = WorkItem(self.params.name, index.name, fetched.path, ids, (),
                                    self._backend, object_path, None,
                                    _pick(key_list(index.keys), at), (names, table[at]),
                                    fetched.stamp)  # fmt: skip
                else:
                    where = at.tolist()
                    spans = [(index.offsets[p], index.sizes[p]) for p in where]
                    fields = None if index.fields is None else _pick(index.fields, at)
                    keys = None if index.fields is None else _pick(key_list(index.keys), at)
                    item = WorkItem(self.params.name, index.name, fetched.path, ids, spans,
                                    self._backend, object_path, fields, keys,
                                    stamp=fetched.stamp)  # fmt: skip
                left -= len(ids)
                self._pending.append(shard)
                self._out[shard] += 1
                yield item
                if later is not None and later[0] >= 0:
                    self._advance(*later)
                    later = (-1, 0)
                if left <= 0:
                    self._close_shard(shard)
                    current = -1
        finally:
            self._close_shard(current)
            # a failed fetch ends the walk here: its leases go back to the pool now (their
            # renewals stop), not whenever the suspended walk is collected
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def consumed(self) -> None:
        """The training step took the oldest item handed out (the stream's position moves,
        with ``track_consumption``; the shard's local copy goes once its last item is
        taken)."""
        self.stream.consumed(1)
        if not self._pending:
            return
        shard = self._pending.popleft()
        self._out[shard] -= 1
        self._maybe_release(shard)

    def stats(self) -> dict[str, Any]:
        """The fetcher's bounds and counts (``ShardFetcher.stats``)."""
        return self.fetcher.stats()

    def close(self) -> None:
        """Stop fetching and delete the temporary files (and this process's map of the last
        one read here: its space is freed)."""
        self.fetcher.close()
        _MAPPED.clear()

    # -- inside -----------------------------------------------------------------------------
    def _forget_walk(self) -> None:
        """A walk begins: what an earlier walk handed out and nobody consumed (a loop that
        broke off) is forgotten, as the stream forgets it, and its shards' local copies are
        released (else this walk's consumptions would be counted against them)."""
        for shard, demands in self._demands.items():
            for _ in range(demands):
                self.fetcher.release(shard)
        self._pending.clear()
        self._out.clear()
        self._closed_shards.clear()
        self._demands.clear()

    def _close_shard(self, shard: int) -> None:
        if shard < 0 or shard in self._closed_shards or shard not in self._out:
            return
        self._closed_shards.add(shard)
        self._maybe_release(shard)

    def _maybe_release(self, shard: int) -> None:
        if shard in self._closed_shards and self._out.get(shard) == 0:
            del self._out[shard]
            self._closed_shards.discard(shard)
            for _ in range(self._demands.pop(shard, 0)):
                self.fetcher.release(shard)

    def _plan(self, epoch: int, done: set[int]) -> None:
        """This walk's expected shards: the worker's own, in the epoch's order, not done."""
        members = self._members()
        try:
            plan = assignment(self.params, members)
            ids, owners = plan.grouped(epoch)
            own = ids[owners == plan.index(self._worker_id)].tolist()
        except ValueError:  # not a member (yet): nothing to expect
            own = []
        self._expected = [s for s in own if s not in done]

    def _advance(self, shard: int, epoch: int) -> None:
        """``shard`` was leased: expect the ones after it (those a resume starts part-way:
        only what is left of them)."""
        if shard in self._expected:
            del self._expected[: self._expected.index(shard) + 1]
        per = self.params.samples_per_shard
        expected: list[tuple[int, list[int] | None]] = []
        for s in self._expected[: self.fetcher.prefetch]:
            start = self.stream.starts.get(s, 0)
            if start:
                order = self.params.shard(s, epoch).indices()
                expected.append((s, (order[start:] - s * per).tolist()))
            else:
                expected.append((s, None))
        self.fetcher.expect(expected)


def _pick(values: Sequence[Any], at: np.ndarray) -> list[Any]:
    """``[values[p] for p in at]``, at C speed."""
    if len(at) == 1:
        return [values[int(at[0])]]
    return list(operator.itemgetter(*at.tolist())(values))


def _check_registration(params: DatasetParams, manifest: Manifest, storage: Storage) -> None:
    manifest.check_counts(backend=storage.describe())
    if (params.total_samples, params.samples_per_shard) != (
        manifest.total,
        manifest.samples_per_shard,
    ):
        raise ShardManifestError(
            f"the dataset is registered with {params.total_samples} samples in shards of "
            f"{params.samples_per_shard} ({params.num_shards} shards), but its manifest has "
            f"{manifest.total} in {len(manifest.shards)} shards of "
            f"{manifest.samples_per_shard}: register it with register_shards",
            dataset=params.name, path=manifest_path(params.name), backend=storage.describe(),
        )  # fmt: skip

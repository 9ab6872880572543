"""``ShardFetcher``: shards' bytes from storage to local files, ahead of use, bounded, checked,
optionally kept in a size-limited cache directory.

One fetcher lives in the process that holds the leases. A shard is fetched whole (one read,
its CRC-32 checked against its index) or, for a shard a resume starts part-way, only the
byte spans of the samples still to train (ranged reads, the gaps under ``GAP`` bytes read
through). The bytes go to a local file at their offsets in the tar, so the loader's worker
processes read samples from it (mapped) and the bytes cross no process boundary twice. A
storage whose objects are local files already (``LocalStorage``: ``Storage.local_file``) is
read in place, not copied, when no ``cache_dir`` is given: a whole shard's checksum is
checked on the storage's own file, and a part-way one needs no read at all. Once its index
is at hand and its checksum checked (or it has none), such a shard has nothing left to
fetch: its demand is met in the demanding thread, and it is not fetched ahead. Other storages'
shards (S3) are copied by helper processes forked from this one (``copier.CopyProcesses``),
so their requests' client CPU does not take this process's GIL.

A shard's index comes from the dataset's index pack when it has one (``index.IndexPack``:
every index in one object, read once in a thread of its own, started once the first fetch
is done and never waited for): the copies then make one request a shard, not two. Until it
is loaded, or without one, each shard's own index is read.

Bounds: at most ``prefetch`` shards are fetched ahead of use (a later call re-targets them:
shards no longer expected are dropped); the shards in use are those with batches handed out
and not consumed (one or two at a time). Files outside ``cache_dir`` are deleted once their
shard is released; in ``cache_dir`` whole, verified shards stay, the least recently used
evicted beyond ``cache_bytes`` (never one in use or ahead). ``stats()`` reports both bounds
and what crossed them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..errors import ShardChecksumError, ShardFormatError
from ..storage import Storage, retry_call
from ..validate import check_int, check_seconds
from .copier import GAP, CopyJob, CopyProcesses, copy_shard
from .index import (
    PACK_LIMIT,
    IndexPack,
    Manifest,
    ShardIndex,
    file_checksum,
    read_index,
    read_pack,
    shard_path,
)

__all__ = ["GAP", "Fetched", "ShardFetcher"]

log = logging.getLogger("strata_redis.shards")


@dataclass(frozen=True)
class Fetched:
    """A shard's bytes on local disk.

    Attributes:
        shard: the shard's number in the manifest.
        index: its index (sample offsets and sizes in the tar).
        path: the local file: the tar's bytes at their offsets (a part-way fetch holds only
            the spans of the samples it was asked for; the rest of the file reads as zeros).
        whole: the file holds the whole, verified tar.
        owned: the file is the fetcher's copy (deleted or cached when released); False: the
            storage's own file, read in place (never deleted).
        stamp: for a file read in place, its (device, inode, size, mtime) when it was
            checked: a reader finding another refuses it (``feed.WorkItem``).
    """

    shard: int
    index: ShardIndex
    path: str
    whole: bool
    owned: bool = True
    stamp: tuple[int, int, int, int] | None = None


class _Entry:
    """One shard's local copy and what holds it."""

    def __init__(self, shard: int, future: Future[Fetched], positions: list[int] | None) -> None:
        self.shard, self.future = shard, future
        # the samples (positions in the shard) the copy holds; None: all of them
        self.positions = None if positions is None else frozenset(positions)
        self.users = 0  # demands not yet released
        self.ahead = False  # fetched ahead, not yet demanded
        self.size = 0


class ShardFetcher:
    """Fetch a dataset's shards to local files ahead of use (see the module docstring).

    Args:
        storage: where the shards are.
        manifest: the dataset's manifest.
        prefetch: shards fetched ahead of use at most (0: none; each demand then waits).
        cache_dir: keep whole shards here between uses (and runs); None: a private temporary
            directory, each file deleted once its shard is released.
        cache_bytes: with ``cache_dir``, its size limit (least recently used evicted first);
            None: no limit.
        storage_wait: seconds a fetch keeps retrying while the storage fails (an outage),
            from its first failure, pausing 0.1 s doubling to 2 s; then the storage's error
            is raised. A missing
            object and a bad checksum are not retried (a bad checksum is read twice).
        threads: fetches at once (default ``prefetch + 1``).
        processes: for a ``remote`` storage (S3), helper processes that copy the shards
            (``copier.CopyProcesses``; default 2; 0, or in a daemonic process, which may
            have none: the fetch threads copy them, with the storage's client CPU here).
            They are forked at the first demand after a fetch is done (the first shard,
            a resume's first batch, is copied here without waiting for them).

    Raises:
        TypeError, ValueError: a bad argument.
    """

    def __init__(
        self,
        storage: Storage,
        manifest: Manifest,
        *,
        prefetch: int = 2,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int | None = None,
        storage_wait: float = 60.0,
        threads: int | None = None,
        processes: int = 2,
    ) -> None:
        self.storage = storage
        self.manifest = manifest
        self.dataset = manifest.dataset
        self.prefetch = check_int("prefetch", prefetch, low=0, high=1024)
        self.storage_wait = check_seconds("storage_wait", storage_wait, high=86400)
        if cache_bytes is not None:
            check_int("cache_bytes", cache_bytes, low=0, high=2**62)
        self.cache_bytes = cache_bytes
        self._temp = tempfile.mkdtemp(prefix="strata-shards-")
        if cache_dir is None:
            self.cache_dir: str | None = None
        else:
            self.cache_dir = os.path.join(os.fspath(cache_dir), self.dataset)
            os.makedirs(self.cache_dir, exist_ok=True)
        workers = threads if threads is not None else self.prefetch + 1
        self._pool = ThreadPoolExecutor(check_int("threads", workers, low=1, high=256),
                                        thread_name_prefix="strata-fetch")  # fmt: skip
        # (reentrant: a dropped fetch that ends while _drop attaches its callback runs the
        # callback at once, in _drop's thread, under this lock)
        self._lock = threading.RLock()
        self._entries: dict[int, _Entry] = {}
        self._cached: OrderedDict[int, int] = OrderedDict()  # idle cached shard -> bytes, LRU first
        self._indexes: dict[int, ShardIndex] = {}
        # shard read in place -> its file's stamp when its checksum was checked
        self._verified: dict[int, tuple[int, int, int, int]] = {}
        # the dataset's index pack (one read for every shard's index), once loaded
        pack = manifest.index_pack
        self._pack_wanted = manifest.binary_index and pack is not None and pack.size <= PACK_LIMIT
        self._pack: IndexPack | None = None
        self._stats: dict[str, int] = dict.fromkeys((
            "fetched_shards", "fetched_bytes", "reads", "ranged_reads", "partial_shards",
            "prefetched",
            "prefetch_hits", "prefetch_dropped", "cache_hits", "evicted", "retries",
            "checksum_rereads", "max_ahead_shards", "max_held_shards", "max_held_bytes",
            "helper_copies", "index_pack_bytes", "index_reads",
        ), 0)  # fmt: skip
        self._closed = False
        check_int("processes", processes, low=0, high=64)
        # (a daemonic process may not have children: its fetch threads copy)
        helpers = storage.remote and processes and not multiprocessing.current_process().daemon
        # (forked at the first demand once a fetch is done: a resume's first batch, which
        # they are not ready for, does not wait for the forks)
        self._processes = processes if helpers else 0
        self._helpers: CopyProcesses | None = None
        self._fetched_one = False
        if self.cache_dir is not None:
            self._scan_cache()

    def __repr__(self) -> str:
        return (
            f"ShardFetcher({self.dataset!r}, {self.storage.describe()!r}, prefetch={self.prefetch})"
        )

    # -- what the feed calls ------------------------------------------------------------------
    def demand(self, shard: int, positions: list[int] | None = None) -> Future[Fetched]:
        """The shard's local copy, fetched now unless it is here or on its way: whole, or
        (``positions``: the samples, by position in the shard, still to read) only theirs.
        Each demand holds the copy until ``release(shard)``.

        Raises:
            RuntimeError: the fetcher is closed; or the shard is held part-way (a demand
                not released) and more of it is asked for.
            ShardChecksumError, ShardFormatError, StorageNotFoundError, StorageError: from
                the future.
        """
        if self._processes and self._fetched_one:
            self._start_helpers()
        inline: Future[Fetched] | None = None
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            entry = self._entries.get(shard)
            if entry is not None and entry.future.done() and entry.future.exception() is not None:
                del self._entries[shard]  # a failed fetch is tried again on a new demand
                entry = None
            if (
                entry is not None and entry.positions is not None
                and (positions is None or not entry.positions.issuperset(positions))
            ):  # a part-way copy, and more of it is wanted now  # fmt: skip
                if entry.users:  # (the feed releases a shard before it asks for more of it)
                    raise RuntimeError(
                        f"{self!r}: shard {shard} is held part-way and more of it is asked "
                        "for: release it first"
                    )
                self._drop(entry)  # fetched ahead part-way: fetched again
                entry = None
            if entry is None and shard in self._cached:
                self._cached.pop(shard)
                entry = self._from_cache(shard)
                self._stats["cache_hits"] += 1
            if entry is None:
                if self._inline(shard):
                    inline = Future()  # (made below, in this thread)
                future = inline if inline is not None else self._submit(shard, positions)
                entry = self._entries[shard] = _Entry(shard, future, positions)
            elif entry.ahead:
                self._stats["prefetch_hits"] += 1
            entry.ahead = False
            entry.users += 1
            self._account()
            future = entry.future
        if inline is not None and inline.set_running_or_notify_cancel():
            # (here, off the lock: no thread woken for it; not if close() cancelled it)
            try:
                inline.set_result(self._fetch(shard, positions))
            except BaseException as exc:
                inline.set_exception(exc)
        return future

    def expect(self, shards: list[tuple[int, list[int] | None]]) -> None:
        """The shards expected next, in order, each with the samples (positions) still to
        read of it (None: all): the first ``prefetch`` of them are fetched ahead; shards
        fetched ahead earlier and no longer expected are dropped."""
        wanted = dict(shards[: self.prefetch])
        with self._lock:
            if self._closed:
                return
            for entry in list(self._entries.values()):
                if entry.ahead and entry.shard not in wanted:
                    self._drop(entry)
                    self._stats["prefetch_dropped"] += 1
            for shard, positions in wanted.items():
                if shard in self._entries or shard in self._cached or self._inline(shard):
                    continue
                entry = _Entry(shard, self._submit(shard, positions), positions)
                entry.ahead = True
                self._entries[shard] = entry
                self._stats["prefetched"] += 1
            self._account()

    def release(self, shard: int) -> None:
        """One demand of ``shard`` is over (its batches were consumed, or dropped)."""
        with self._lock:
            entry = self._entries.get(shard)
            if entry is None or entry.users == 0:
                return
            entry.users -= 1
            if entry.users == 0:
                self._drop(entry)
            self._account()

    def stats(self) -> dict[str, Any]:
        """The bounds and what was fetched: ``prefetch_shards`` (the bound on shards ahead),
        ``ahead_shards``/``held_shards``/``held_bytes`` now and their maxima (``held_bytes``:
        of local copies; shards read in place from a ``LocalStorage`` hold none),
        ``fetched_shards``/``fetched_bytes``/``reads`` (storage reads of shard bytes; of them
        ``ranged_reads`` for shards fetched part-way),
        ``partial_shards`` (fetched part-way), ``prefetched``/``prefetch_hits``/
        ``prefetch_dropped``, ``cache_hits``/``cached_bytes``/``evicted``, ``retries``,
        ``helper_copies`` (copies made by helper processes: ``processes``),
        ``index_reads`` (shards' own index objects read) and ``index_pack_bytes`` (the index
        pack, once loaded: every shard's index in one read, held until each index is out of
        it; the indexes are kept while the fetcher lives)."""
        with self._lock:
            held = [e for e in self._entries.values()]
            return {
                **self._stats,
                "prefetch_shards": self.prefetch,
                "ahead_shards": sum(1 for e in held if e.ahead),
                "held_shards": len(held),
                "held_bytes": sum(e.size for e in held),
                "cache_bytes": self.cache_bytes,
                "cached_bytes": sum(self._cached.values()),
            }

    def close(self) -> None:
        """Stop fetching; delete the temporary files (the cache directory stays)."""
        with self._lock:
            self._closed = True
            for entry in self._entries.values():
                entry.future.cancel()
        if self._helpers is not None:
            self._helpers.close()
        self._pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self._temp, ignore_errors=True)

    # -- inside ---------------------------------------------------------------------------------
    def _inline(self, shard: int) -> bool:
        """The shard is read in place with nothing to fetch: a ``LocalStorage``'s own file
        (no ``cache_dir``), its index at hand (already out of the pack, or the pack loaded),
        and no checksum to check (none, or checked already: ``_in_place`` looks at the
        file's stamp again). Its demand then makes its ``Fetched`` in the caller's thread,
        and nothing is fetched ahead for it: a thread woken for a few microseconds of work
        takes the GIL from the training thread for longer than the work (an epoch of 200
        local shards: 0.05-0.08 s of the training process's CPU, 0.25-0.4 ms a shard)."""
        if self.cache_dir is not None or self.storage.remote:
            return False
        if shard not in self._indexes and self._pack is None:
            return False
        return not self.manifest.shards[shard].checksum or shard in self._verified

    def _submit(self, shard: int, positions: list[int] | None) -> Future[Fetched]:
        # (its callers, demand and expect, hold the lock and have looked at _closed)
        return self._pool.submit(self._fetch, shard, positions)

    def _account(self) -> None:
        entries = self._entries.values()
        stats = self._stats
        stats["max_ahead_shards"] = max(stats["max_ahead_shards"], sum(e.ahead for e in entries))
        stats["max_held_shards"] = max(stats["max_held_shards"], len(self._entries))
        held = sum(e.size for e in entries)
        stats["max_held_bytes"] = max(stats["max_held_bytes"], held)

    def _drop(self, entry: _Entry) -> None:
        """Forget an entry no one holds: its file goes (or, cached, joins the LRU)."""
        self._entries.pop(entry.shard, None)
        if not entry.future.done():
            entry.future.cancel()
            entry.future.add_done_callback(lambda f: self._discard(f))
            return
        if entry.future.cancelled() or entry.future.exception() is not None:
            return
        fetched = entry.future.result()
        if not fetched.owned:
            return
        if self.cache_dir is not None and fetched.whole:
            self._cached[entry.shard] = self.manifest.shards[entry.shard].size
            self._evict()
        else:
            _unlink(fetched.path)

    def _discard(self, future: Future[Fetched]) -> None:
        """A dropped fetch finished after all: a whole shard in the cache directory joins
        the cache; a temporary file goes."""
        if future.cancelled() or future.exception() is not None:
            return
        fetched = future.result()
        if not fetched.owned:
            return
        if fetched.path.startswith(self._temp):
            _unlink(fetched.path)
            return
        with self._lock:
            if fetched.shard not in self._entries:
                self._cached[fetched.shard] = self.manifest.shards[fetched.shard].size
                self._evict()

    def _evict(self) -> None:
        if self.cache_bytes is None:
            return
        while self._cached and sum(self._cached.values()) > self.cache_bytes:
            shard, _ = self._cached.popitem(last=False)
            _unlink(self._cache_path(shard))
            self._stats["evicted"] += 1

    def _cache_path(self, shard: int) -> str:
        assert self.cache_dir is not None
        return os.path.join(self.cache_dir, self.manifest.shards[shard].name)

    def _scan_cache(self) -> None:
        """Whole shards a previous run left in the cache directory (by size: they were
        verified when written), oldest use first."""
        found = []
        for shard, entry in enumerate(self.manifest.shards):
            path = self._cache_path(shard)
            with contextlib.suppress(OSError):
                st = os.stat(path)
                if st.st_size == entry.size:
                    found.append((st.st_mtime, shard, entry.size))
        for _, shard, size in sorted(found):
            self._cached[shard] = size
        self._evict()

    def _from_cache(self, shard: int) -> _Entry:
        path = self._cache_path(shard)
        with contextlib.suppress(OSError):
            os.utime(path)  # its last use, for the next run's LRU order
        future: Future[Fetched] = Future()
        entry = _Entry(shard, future, None)
        entry.size = self.manifest.shards[shard].size
        self._entries[shard] = entry
        index = self._indexes.get(shard)
        if index is not None:
            future.set_result(Fetched(shard, index, path, True))
        else:  # the index is read off the lock

            def load() -> Fetched:
                return Fetched(shard, self._index(shard), path, True)

            inner = self._pool.submit(self._retrying, load)
            inner.add_done_callback(lambda f: _chain(f, future))
        return entry

    def _index(self, shard: int) -> ShardIndex:
        index = self._indexes.get(shard)
        if index is None:
            index = self._packed(shard)
        if index is None:
            index = read_index(self.storage, self.dataset, self.manifest.shards[shard],
                               binary=self.manifest.binary_index)  # fmt: skip
            self._indexes[shard] = index
            with self._lock:
                self._stats["index_reads"] += 1
        return index

    def _packed(self, shard: int) -> ShardIndex | None:
        """Shard ``shard``'s index out of the index pack, once it is loaded; None before (or
        with no pack): the shard's own index is read."""
        pack = self._pack
        if pack is None:
            return None
        try:
            index = pack.index(shard)
        except ShardFormatError as exc:  # (the shard's own index may still be good)
            log.warning("%s: %s; reading the shard's own index", self.dataset, exc)
            return None
        self._indexes[shard] = index
        if len(self._indexes) == len(self.manifest.shards):
            self._pack = None  # (every index is out of it: its bytes go)
        return index

    def _start_helpers(self) -> None:
        with self._lock:
            processes, self._processes = self._processes, 0
            if not processes or self._closed:
                return
        helpers = CopyProcesses(self.storage, processes)
        with self._lock:
            closed = self._closed
            if not closed:
                self._helpers = helpers
        if closed:  # (meanwhile)
            helpers.close()

    def _fetched(self) -> None:
        """After each fetch: the helper processes may be forked (at the next demand), and
        the index pack starts loading, in a thread of its own, once (after the first fetch,
        which it would slow: a resume waits for that one only; never waited for)."""
        with self._lock:
            self._fetched_one = True
            wanted, self._pack_wanted = self._pack_wanted, False
        if wanted:
            threading.Thread(target=self._load_pack, name="strata-index-pack",
                             daemon=True).start()  # fmt: skip

    def _load_pack(self) -> None:
        try:
            pack = self._retrying(read_pack, self.storage, self.manifest)
        except Exception as exc:  # (each shard's own index is read instead)
            if not self._closed:
                log.warning("%s: its index pack was not read (%s: %s): reading each shard's "
                            "own index", self.dataset, type(exc).__name__, exc)  # fmt: skip
            return
        with self._lock:
            self._pack = pack
            self._stats["index_pack_bytes"] = pack.size

    def _retrying(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, again while the storage fails (not for a missing object) for up to
        ``storage_wait`` seconds from the first failure, or until the fetcher closes; then
        the storage's error (``storage.retry_call``)."""
        return retry_call(f"shards of {self.dataset!r}", self.storage_wait,
                          functools.partial(fn, *args), on_retry=self._count_retry,
                          give_up=lambda: self._closed)  # fmt: skip

    def _count_retry(self) -> None:
        with self._lock:
            self._stats["retries"] += 1

    def _fetch(self, shard: int, positions: list[int] | None) -> Fetched:
        entry = self.manifest.shards[shard]
        if self.cache_dir is None and not self.storage.remote:  # in place, if it checks out
            index = self._retrying(self._index, shard)
            in_place = self.storage.local_file(shard_path(self.dataset, index.name))
            stamp = (
                None if in_place is None
                else self._in_place(shard, index, in_place, verify=positions is None)
            )  # fmt: skip
            if in_place is not None and stamp is not None:
                _ = index.columns  # (worked out here: off the training thread, but inline)
                with self._lock:
                    self._stats["fetched_shards"] += 1
                    self._stats["reads"] += positions is None
                    self._stats["fetched_bytes"] += index.size if positions is None else 0
                    self._stats["partial_shards"] += positions is not None
                self._fetched()
                return Fetched(shard, index, in_place, positions is None, owned=False, stamp=stamp)
        index = self._indexes.get(shard)
        if index is None:
            index = self._packed(shard)  # (None: the copy reads it)
        job = CopyJob(
            self.dataset, shard, entry, self.manifest.binary_index, index, positions, self._temp,
            None if self.cache_dir is None else self._cache_path(shard), self.storage_wait,
        )  # fmt: skip
        helpers = self._helpers
        try:
            if helpers is not None and helpers.ready and not self._closed:
                copied = helpers.copy(job, give_up=lambda: self._closed)
                with self._lock:
                    self._stats["helper_copies"] += 1
            else:
                copied = copy_shard(self.storage, job, give_up=lambda: self._closed)
        except ShardChecksumError as exc:
            log.error("%s: shard %r: %s", self.dataset, entry.name, exc)
            raise
        index = copied.index
        _ = index.columns  # (worked out here, off the training thread)
        with self._lock:
            self._indexes[shard] = index
            stats = self._stats
            stats["fetched_shards"] += 1
            stats["index_reads"] += job.index is None  # (the copy read the shard's index)
            stats["fetched_bytes"] += copied.size
            stats["reads"] += copied.reads
            stats["ranged_reads"] += copied.reads if positions is not None else 0
            stats["partial_shards"] += positions is not None
            stats["checksum_rereads"] += copied.rereads
            stats["retries"] += copied.retries
            held = self._entries.get(shard)
            wanted = None if positions is None else frozenset(positions)
            if held is not None and held.positions == wanted:  # (not a later fetch's entry)
                held.size = copied.size
            self._account()
        self._fetched()
        if copied.rereads:
            log.warning("%s: shard %r read twice: its first read did not have its checksum",
                        self.dataset, entry.name)  # fmt: skip
        return Fetched(shard, index, copied.path, positions is None)

    def _in_place(
        self, shard: int, index: ShardIndex, file: str, *, verify: bool
    ) -> tuple[int, int, int, int] | None:
        """The stamp (device, inode, size, mtime) of the storage's own file of the shard when
        it can be read in place: it is there, of the index's size and, to be read whole
        (``verify``), of its checksum (read a chunk at a time, not copied; once while the
        file keeps its stamp). None: the ordinary fetch reads it
        (and raises the storage's error, or the shard's, naming the object)."""
        try:
            with open(file, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                if st.st_size != index.size or st.st_size == 0:
                    return None
                if not verify or not index.checksum or self._verified.get(shard) == stamp:
                    return stamp
                if file_checksum(f.fileno()) != index.checksum:
                    return None
                self._verified[shard] = stamp  # (unchanged since: not read again to check)
                return stamp
        except (OSError, ValueError):
            return None


def _chain(source: Future[Fetched], target: Future[Fetched]) -> None:
    if target.cancelled():
        return
    exc = source.exception()
    if exc is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)

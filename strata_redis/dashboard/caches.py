"""What the dashboard's reader keeps between reads, so each read asks Redis only for what
is new: the job list's ``SCAN`` sweep (``JobDirectory``), the newest entries of capped
streams (``StreamTail``), and per job its samples-trained points, its datasets' completions
and its committed steps' summaries (``ReadCaches``). Thread-safe; each cache is bounded.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import redis

from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.connection import StreamPage, is_cluster
from strata_redis.coordination.registry import list_jobs, scan_jobs

from .progress import TrainedHistory

#: jobs shown in detail in the all-jobs view (the rest are counted in ``jobs_listing``)
MAX_JOBS: Final = 20
#: the completion record is read for the distribution chart at most this often (seconds)
DISTRIBUTION_EVERY_S: Final = 5.0
#: SCAN calls per document while the job list is being refreshed, and keys asked per call
SCAN_CALLS: Final = 8
SCAN_COUNT: Final = 1000
JOBS_REFRESH_S: Final = 30.0
#: committed-step summaries kept decoded (they never change)
COMMITTED_CACHE: Final = 4096
#: streams whose newest entries are kept between documents (three per job)
TAILS_KEPT: Final = 3 * 4 * MAX_JOBS


@dataclass(frozen=True)
class Committed:
    """A committed step's metadata as the dashboard keeps it (files and checksums left
    out: a count only)."""

    world_size: int
    nbytes: int
    files: int
    workers: dict[str, str]
    acked_ms: int
    location: str | None


class JobDirectory:
    """The ids of the jobs in one Redis, from a ``SCAN`` spread over many documents.

    Each ``advance`` makes at most ``SCAN_CALLS`` ``SCAN`` calls; when the cursor comes back
    to 0 the sweep is complete and its jobs replace the known ones. A new sweep starts
    ``JOBS_REFRESH_S`` seconds after the last one completed. Until the first sweep completes,
    the jobs found so far are shown and ``complete`` is false.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.jobs: list[str] = []
        self.complete = False
        self.as_of: float | None = None  # time.monotonic() of the last complete sweep
        self._cursor = 0
        self._found: set[str] = set()
        self._sweeping = False

    def advance(self, client: redis.Redis) -> int:
        """Continue (or start) the sweep by at most ``SCAN_CALLS`` calls, if one is due.

        Returns:
            The number of ``SCAN`` calls made.
        """
        with self._lock:
            due = self.as_of is None or time.monotonic() - self.as_of >= JOBS_REFRESH_S
            if not self._sweeping and not due:
                return 0
            if not self._sweeping:
                self._sweeping, self._cursor, self._found = True, 0, set()
            if is_cluster(client):  # every primary, in one sweep (redis-py walks them)
                self._found = set(list_jobs(client))
                self.jobs = sorted(self._found)
                self.complete, self.as_of, self._sweeping = True, time.monotonic(), False
                return len(client.get_primaries())  # type: ignore[attr-defined]
            for calls in range(1, SCAN_CALLS + 1):
                self._cursor, found = scan_jobs(client, self._cursor, SCAN_COUNT)
                self._found.update(found)
                if self._cursor == 0:
                    self.jobs = sorted(self._found)
                    self.complete, self.as_of, self._sweeping = True, time.monotonic(), False
                    return calls
            if not self.complete:
                self.jobs = sorted(self._found | set(self.jobs))
            return SCAN_CALLS


T = TypeVar("T")


def _entry_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class StreamTail(Generic[T]):
    """The newest ``cap`` entries of one capped stream, kept between documents.

    Stream entries never change: each read asks its owner only for the entries after the
    newest one kept (``after``; ``connection.queue_stream_page``) and the stream's length. A
    stream that holds fewer entries than are kept (trimmed, deleted or flushed) keeps only
    that many of the newest, so nothing gone from Redis is shown for long. (A stream deleted
    and written again within the same millisecond as the newest entry kept would not be told
    apart from the old one until a newer entry arrives.)
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.entries: list[tuple[str, T]] = []  # newest first
        self._lock = threading.Lock()
        self._memo: dict[str, Any] = {}  # what was derived from the entries, until they change

    @property
    def after(self) -> str | None:
        """The id of the newest entry kept: the next read asks for newer ones only."""
        with self._lock:
            return self.entries[0][0] if self.entries else None

    def take(self, page: StreamPage[T]) -> list[tuple[str, T]]:
        """Merge a read's new entries (newest first); return the kept ones, newest first."""
        new = page.entries
        with self._lock:
            if self.entries:  # a concurrent document may have merged some of them already
                top = _entry_key(self.entries[0][0])
                new = [e for e in new if _entry_key(e[0]) > top]
            merged = new if len(new) >= self.cap else new + self.entries
            kept = merged[: min(self.cap, page.length)]
            if len(kept) != len(self.entries) or (kept and kept[0][0] != self.entries[0][0]):
                self._memo = {}
            self.entries = kept
            return self.entries

    def derived(self, name: str, make: Callable[[list[tuple[str, T]]], Any]) -> Any:
        """``make(entries)``, computed once per change of the kept entries."""
        with self._lock:
            memo, entries = self._memo, self.entries
        if name not in memo:
            memo[name] = make(entries)
        return memo[name]


class ReadCaches:
    """One reader's kept values, per job: stream tails, samples-trained points, dataset
    completions, committed-step summaries (each bounded; the least recently used go)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._committed_cache: OrderedDict[tuple[str, CheckpointId], Committed | None] = (
            OrderedDict()
        )
        self._tails: OrderedDict[tuple[str, str], StreamTail[Any]] = OrderedDict()
        # (job, dataset, epoch) -> (time.monotonic() of the read, workers' completed shards)
        self._completed: dict[tuple[str, str, int], tuple[float, Counter[str]]] = {}
        self._trained: OrderedDict[str, TrainedHistory] = OrderedDict()

    def tail(self, job_id: str, stream: str, cap: int) -> StreamTail[Any]:
        """The kept newest entries of ``job_id``'s stream ``stream`` (a name of this reader's)."""
        key = (job_id, stream)
        with self._lock:
            tail = self._tails.get(key)
            if tail is None:
                tail = self._tails[key] = StreamTail[Any](cap)
                while len(self._tails) > TAILS_KEPT:
                    self._tails.popitem(last=False)
            self._tails.move_to_end(key)
            return tail

    def trained(self, job_id: str) -> TrainedHistory:
        """The kept samples-trained points of ``job_id`` (at most ``4 * MAX_JOBS`` jobs)."""
        with self._lock:
            history = self._trained.get(job_id)
            if history is None:
                history = self._trained[job_id] = TrainedHistory()
                while len(self._trained) > 4 * MAX_JOBS:
                    self._trained.popitem(last=False)
            self._trained.move_to_end(job_id)
            return history

    def completed(self, key: tuple[str, str, int]) -> Counter[str] | None:
        """The kept per-worker completions of a dataset epoch, if read recently enough."""
        with self._lock:
            kept = self._completed.get(key)
        if kept is None or time.monotonic() - kept[0] >= DISTRIBUTION_EVERY_S:
            return None
        return kept[1]

    def keep_completed(self, key: tuple[str, str, int], counts: Counter[str]) -> None:
        with self._lock:
            if len(self._completed) > 4 * MAX_JOBS:
                self._completed.clear()
            self._completed[key] = (time.monotonic(), counts)

    # -- the committed-step cache --------------------------------------------------------
    def cached_committed(self, job_id: str, step: CheckpointId) -> tuple[bool, Committed | None]:
        with self._lock:
            key = (job_id, step)
            if key in self._committed_cache:
                self._committed_cache.move_to_end(key)
                return True, self._committed_cache[key]
        return False, None

    def cache_committed(self, job_id: str, step: CheckpointId, summary: Committed | None) -> None:
        with self._lock:
            self._committed_cache[(job_id, step)] = summary
            while len(self._committed_cache) > COMMITTED_CACHE:
                self._committed_cache.popitem(last=False)

"""Every Redis read of the dashboard: one job's (or every job's) state as one JSON-ready document.

This module is the only place where the dashboard touches Redis, and it only reads. What it
reads is bounded by what the page shows, never by a job's history:

- workers: the live ones (the heartbeat ZSET) and those that failed or left within
  ``gone_window`` seconds (found in the newest ``EVENTS_READ`` membership events), with
  registration details only for the requested page of them;
- membership events, barrier releases and save records: the newest ``EVENTS_READ``,
  ``LATENCIES_READ`` and ``RECORDS_READ`` entries of their capped streams, read
  incrementally: stream entries never change, so each document asks only for the entries
  newer than the newest it kept (``StreamTail``);
- checkpoints: the newest ``CHECKPOINTS_READ`` committed steps of the index, and the steps
  of the save records read; a committed step's summary never changes, so it is decoded once
  and kept (``_committed_cache``);
- datasets: every registered dataset's progress in the job's current epoch (three O(1)
  counts, exact in every document), the leases held now (the lease hash: about one per
  live worker), and the per-worker distribution of completed shards (the completion hash),
  read at most every ``DISTRIBUTION_EVERY_S`` seconds and only for datasets of at most
  ``DISTRIBUTION_MAX_SHARDS`` shards, so no read holds Redis for more than a few
  milliseconds;
- training progress: each dataset's lifetime lease counts (``record.LeaseTotals``: samples
  trained, by live worker, and steals; one ``HMGET`` bounded by the live workers); the
  samples/s of the job and of each worker are the deltas of those counts between documents
  (``progress.py``: the reader keeps a few points per job), so the first document has none;
- the list of jobs (the all-jobs view only): the registry's ``SCAN`` for jobs
  (``registry.scan_jobs``), advanced by at most ``SCAN_CALLS`` steps per document and
  repeated every ``JOBS_REFRESH_S`` seconds (``JobDirectory``); with a job given there is
  no ``SCAN``.

A document costs two pipelined round trips (plus the bounded ``SCAN`` steps of the job list)
and about 25 commands per job; what they return grows with the workers listed and the
shards of the datasets (at most ``DISTRIBUTION_MAX_SHARDS``), not with the job's history.

Every read goes through the owner of what it reads: this module passes its pipelines to the
owners' queue/take pairs (``queue_x(pipe, ...)`` before a round trip, ``take_x(replies, ...)``
after it: ``strata_redis.connection`` describes the convention) and gets their typed values
back (``WorkerInfo``, ``MembershipEvent``, ``LeaseHolder``, ``EpochProgress``,
``CheckpointInfo``, ``StepState``, ``SaveRecord``, ``BarrierLatency``, ``DatasetParams``).
It knows no key and no stored value format: a change of either is made in its owner alone.
What is derived from the values read lives beside it: rates, ETA and the slowest worker in
``progress.py``, percentiles and chart series in ``series.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar

import redis

from strata_redis import era
from strata_redis.checkpoint import commit, index, records
from strata_redis.checkpoint.commit import StepState
from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.checkpoint.manifest import CheckpointInfo
from strata_redis.checkpoint.records import SaveRecord
from strata_redis.connection import Replies, StreamPage, describe, is_cluster, take_reply
from strata_redis.coordination import epochs, latency, lifecycle, registry
from strata_redis.coordination.latency import BarrierLatency
from strata_redis.coordination.lifecycle import JobRecord
from strata_redis.coordination.registry import (
    SETTABLE_STATUSES,
    STATUSES,
    MembershipEvent,
    WorkerInfo,
    list_jobs,
    scan_jobs,
)
from strata_redis.dashboard import progress, series
from strata_redis.dashboard.progress import TrainedHistory
from strata_redis.data import datasets, record
from strata_redis.data.record import EpochProgress, LeaseHolder, LeaseTotals
from strata_redis.data.sharding import DatasetParams
from strata_redis.validate import check_id

SCHEMA: Final = "strata-dashboard/1"
LIVE_STATUSES: Final = SETTABLE_STATUSES
#: newest membership events read per job (the timeline, and who failed or left lately)
EVENTS_READ: Final = 500
#: newest barrier releases read per job (latency percentiles and their series)
LATENCIES_READ: Final = 500
#: newest save records read per job (checkpoint MB/s, aborted saves)
RECORDS_READ: Final = 200
#: newest committed steps read per job
CHECKPOINTS_READ: Final = 10
#: datasets with more shards than this show progress counts but no per-worker distribution
DISTRIBUTION_MAX_SHARDS: Final = 20_000
#: the completion record is read for the distribution chart at most this often (seconds)
DISTRIBUTION_EVERY_S: Final = 5.0
#: jobs shown in detail in the all-jobs view (the rest are counted in ``jobs_listing``)
MAX_JOBS: Final = 20
#: the largest page of workers
MAX_LIMIT: Final = 5000
#: SCAN calls per document while the job list is being refreshed, and keys asked per call
SCAN_CALLS: Final = 8
SCAN_COUNT: Final = 1000
JOBS_REFRESH_S: Final = 30.0
#: committed-step summaries kept decoded (they never change)
COMMITTED_CACHE: Final = 4096
#: streams whose newest entries are kept between documents (three per job)
TAILS_KEPT: Final = 3 * 4 * MAX_JOBS


class JobNotFoundError(LookupError):
    """A job id that is malformed or has no state in this Redis (HTTP 404)."""

    def __init__(self, message: str, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


def check_job_id(job_id: str) -> str:
    """``job_id`` if it can be a job's id, else ``JobNotFoundError`` saying why not."""
    try:
        return check_id("job_id", job_id, job=True)
    except (TypeError, ValueError) as exc:
        raise JobNotFoundError(f"no job {job_id!r}: not a valid job id ({exc})", job_id) from None


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


class DashboardState:
    """Reads dashboard documents from one Redis. Thread-safe; keeps small caches.

    Args:
        client: a decoding redis-py client (``strata_redis.connection.make_client``).
        heartbeat_timeout: seconds without a heartbeat after which a live worker is shown
            as ``stale`` (not yet declared failed by any reaper), for a job that has no
            timeout stored with it (``coordination/lifecycle.py``: jobs store their own,
            and it is the one used).
        gone_window: seconds during which a worker that failed or left is still listed
            (and exported to Prometheus); older ones drop out.
    """

    def __init__(
        self, client: redis.Redis, *, heartbeat_timeout: float = 10.0, gone_window: float = 600.0
    ) -> None:
        if not heartbeat_timeout > 0 or not math.isfinite(heartbeat_timeout):
            raise ValueError(f"heartbeat_timeout must be > 0 seconds, got {heartbeat_timeout!r}")
        if not gone_window > 0 or not math.isfinite(gone_window):
            raise ValueError(f"gone_window must be > 0 seconds, got {gone_window!r}")
        self.client = client
        self.heartbeat_timeout = float(heartbeat_timeout)
        self.gone_window = float(gone_window)
        self.directory = JobDirectory()
        self._lock = threading.Lock()
        self._committed_cache: OrderedDict[tuple[str, CheckpointId], dict[str, Any] | None] = (
            OrderedDict()
        )
        self._tails: OrderedDict[tuple[str, str], StreamTail[Any]] = OrderedDict()
        # (job, dataset, epoch) -> (time.monotonic() of the read, workers' completed shards)
        self._completed: dict[tuple[str, str, int], tuple[float, Counter[str]]] = {}
        # (redis ms, total commands processed, commands this reader sent so far)
        self._samples: deque[tuple[int, int, int]] = deque(maxlen=series.SERIES_POINTS * 10)
        self._trained: OrderedDict[str, TrainedHistory] = OrderedDict()
        self._sent = 0
        self._info_allowed = True

    @property
    def redis_description(self) -> str:
        """Where the client connects, without credentials."""
        return describe(self.client)

    # -- the document ------------------------------------------------------------------------
    def read(self, job: str | None = None, *, offset: int = 0, limit: int = 1000) -> dict[str, Any]:
        """The dashboard document (see ``schema.json``) of ``job``, or of every job.

        Args:
            job: a job id; None for every job in this Redis (at most ``MAX_JOBS`` in detail).
            offset, limit: the page of workers (ordered by job id, then worker id).

        Raises:
            JobNotFoundError: ``job`` is malformed or has no state in this Redis.
            ValueError: a bad ``offset`` or ``limit``.
            redis.RedisError: Redis failed.
        """
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"limit must be an int in [1, {MAX_LIMIT}], got {limit!r}")
        started = time.perf_counter()
        commands = scan_calls = 0
        listing: dict[str, Any] | None = None
        if job is None:
            scan_calls = self.directory.advance(self.client)
            commands += scan_calls
            known = self.directory.jobs
            ids = known[:MAX_JOBS]
            listing = {"known": len(known), "shown": len(ids), "complete": self.directory.complete}
        else:
            check_job_id(job)
            ids = [job]
        jobs = [_JobRead(j, self) for j in ids]

        # Round 1: the clock, the server's counters, and each job's bounded heads.
        # (redis-py refuses TIME and INFO in a cluster pipeline: with Redis Cluster the clock
        # is read apart, from the node of the first job shown, and there is no request rate)
        cluster = is_cluster(self.client)
        round1 = self.client.pipeline(transaction=False)
        if not cluster:
            round1.time()
        with self._lock:
            info = self._info_allowed and not cluster
        if info:
            round1.info("stats")
        for j in jobs:
            j.queue_heads(round1)
        replies = round1.execute(raise_on_error=False)
        commands += len(replies) + cluster
        rest = iter(replies)
        if cluster:
            sec, usec = registry.job_clock(self.client, jobs[0].job_id if jobs else None)
        else:
            sec, usec = take_reply(rest)
        now_ms = int(sec) * 1000 + int(usec) // 1000
        stats: dict[str, Any] | None = None
        if info:
            stats = self._stats(next(rest))
        for j in jobs:
            j.take_heads(rest, self.client)
            j.settle(now_ms, self.heartbeat_timeout)
        if job is not None and not jobs[0].exists:
            raise JobNotFoundError(
                f"no job {job!r} in this Redis ({self.redis_description}): it has no "
                "workers, datasets or checkpoints", job,
            )  # fmt: skip

        # Round 2: statuses of the shown workers, a page of their details, each dataset's
        # progress and distribution, and the checkpoint steps not decoded before.
        gone_since = now_ms - int(self.gone_window * 1000)
        candidates = [(j.job_id, w) for j in jobs for w in j.candidates(gone_since)]
        page = set(candidates[offset : offset + limit])
        round2 = self.client.pipeline(transaction=False)
        for j in jobs:
            j.queue_details(round2, {w for jid, w in page if jid == j.job_id}, self)
        replies = round2.execute()
        commands += len(replies)
        rest = iter(replies)
        for j in jobs:
            j.take_details(rest, now_ms, self)

        workers = [w for j in jobs for w in j.worker_rows(now_ms)]
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "redis": self.redis_description,
            "time_ms": now_ms,
            "job": job,
            "jobs": [j.summary() for j in jobs],
            "jobs_listing": listing,
            "page": {"offset": offset, "limit": limit, "total": len(candidates)},
            "workers": workers,
            "events": [e for j in jobs for e in j.events_out()],
            "datasets": [d for j in jobs for d in j.datasets_out()],
            "checkpoints": [c for j in jobs for c in j.checkpoints_out()],
            "metrics": {
                "redis": self._redis_metrics(now_ms, stats, commands),
                "jobs": [j.metrics(now_ms) for j in jobs],
            },
            "read": {
                "commands": commands,
                "round_trips": 2 + scan_calls,
                "ms": round((time.perf_counter() - started) * 1000, 3),
            },
        }
        return doc

    # -- the server's request rate -------------------------------------------------------
    def _stats(self, reply: Any) -> dict[str, Any] | None:
        if isinstance(reply, redis.exceptions.NoPermissionError):
            with self._lock:
                self._info_allowed = False  # an ACL user without INFO: no request rate
            return None
        if isinstance(reply, Exception):
            raise reply
        return dict(reply)

    def _redis_metrics(
        self, now_ms: int, stats: dict[str, Any] | None, commands: int
    ) -> dict[str, Any]:
        """Commands per second on the whole server, not counting this reader's own."""
        if stats is None:
            return {"commands_per_s": None, "ops_per_s": None, "series": []}
        total = int(stats.get("total_commands_processed", 0))
        with self._lock:
            self._sent += commands
            # Keep a sample at most every second: the rate over at least one second.
            if not self._samples or now_ms - self._samples[-1][0] >= 1000:
                self._samples.append((now_ms, total, self._sent))
            samples = list(self._samples)
        points: list[list[float]] = []
        for (t0, c0, s0), (t1, c1, s1) in itertools.pairwise(samples):
            rate = max(0.0, ((c1 - c0) - (s1 - s0)) / ((t1 - t0) / 1000))
            points.append([t1 / 1000, round(rate, 1)])
        return {
            "commands_per_s": points[-1][1] if points else None,
            "ops_per_s": int(stats.get("instantaneous_ops_per_sec", 0)),
            "series": series.thin(points),
        }

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
    def cached_committed(
        self, job_id: str, step: CheckpointId
    ) -> tuple[bool, dict[str, Any] | None]:
        with self._lock:
            key = (job_id, step)
            if key in self._committed_cache:
                self._committed_cache.move_to_end(key)
                return True, self._committed_cache[key]
        return False, None

    def cache_committed(
        self, job_id: str, step: CheckpointId, summary: dict[str, Any] | None
    ) -> None:
        with self._lock:
            self._committed_cache[(job_id, step)] = summary
            while len(self._committed_cache) > COMMITTED_CACHE:
                self._committed_cache.popitem(last=False)


class _JobRead:
    """One job's part of a document: what to queue on each round, and what came back."""

    def __init__(self, job_id: str, state: DashboardState) -> None:
        self.job_id = job_id
        self._event_tail: StreamTail[MembershipEvent] = state.tail(job_id, "events", EVENTS_READ)
        self._latency_tail: StreamTail[BarrierLatency] = state.tail(
            job_id, "barrier_latency", LATENCIES_READ
        )
        self._record_tail: StreamTail[SaveRecord] = state.tail(job_id, "records", RECORDS_READ)
        self.window_s = state.gone_window
        self.beats: dict[str, float] = {}
        self.registered = 0
        self.generation = 0
        self.epoch = 0
        self.fence = 0
        self.failures = 0
        self.totals = records.CheckpointTotals()
        self.dataset_params: list[DatasetParams] = []
        self.events: list[tuple[str, MembershipEvent]] = []
        self.committed_steps: list[CheckpointId] = []
        self.records: list[tuple[str, SaveRecord]] = []
        self.exists = False
        self.record: JobRecord | None = None
        self.era = False
        self.timeout_s = 10.0
        self.state = "idle"
        self.status: dict[str, str | None] = {}
        self.info: dict[str, WorkerInfo] = {}
        self.progress: dict[str, dict[str, Any]] = {}
        self.lease_totals: dict[str, LeaseTotals] = {}
        self.training: dict[str, Any] = {}
        self.holders: dict[str, dict[int, LeaseHolder]] = {}
        self.distribution: dict[str, list[dict[str, Any]] | None] = {}
        self.committed: dict[CheckpointId, dict[str, Any] | None] = {}
        self.step_state: dict[CheckpointId, StepState] = {}
        self._candidates: list[str] = []
        self._page: list[str] = []
        self._details: list[tuple[DatasetParams, bool, tuple[str, str, int], Any]] = []
        self._uncached: list[CheckpointId] = []
        self._open_steps: list[CheckpointId] = []

    # -- round 1 ---------------------------------------------------------------------------
    def queue_heads(self, pipe: Any) -> None:
        job = self.job_id
        # live workers with their last heartbeat: the first page here, the others (one
        # bounded command each) when it is taken
        registry.queue_heartbeats(pipe, job)
        registry.queue_registered(pipe, job)
        registry.queue_generation(pipe, job)
        epochs.queue_epoch(pipe, job)
        datasets.queue_datasets(pipe, job)
        registry.queue_events(pipe, job, EVENTS_READ, self._event_tail.after)
        latency.queue_latencies(pipe, job, LATENCIES_READ, self._latency_tail.after)
        index.queue_newest_steps(pipe, job, CHECKPOINTS_READ)
        records.queue_save_records(pipe, job, RECORDS_READ, self._record_tail.after)
        record.queue_lease_grants(pipe, job)
        registry.queue_failures(pipe, job)
        records.queue_totals(pipe, job)
        lifecycle.queue_record(pipe, job)
        era.queue_era_state(pipe, job)

    def take_heads(self, replies: Replies, client: Any) -> None:
        self.beats = registry.take_heartbeats(replies, client, self.job_id)
        self.registered = registry.take_registered(replies)
        self.generation = registry.take_generation(replies)
        self.epoch = epochs.take_epoch(replies)
        self.dataset_params = datasets.take_datasets(replies)
        events = registry.take_events(replies)
        self.events = self._event_tail.take(events)
        latencies = latency.take_latencies(replies)
        self._latency_tail.take(latencies)
        self.committed_steps = index.take_newest_steps(replies)
        saves = records.take_save_records(replies)
        self.records = self._record_tail.take(saves)
        self.fence = record.take_lease_grants(replies)
        self.failures = registry.take_failures(replies)
        self.totals = records.take_totals(replies)
        self.record = lifecycle.take_record(replies)
        self.era = era.take_era_state(replies)
        self.exists = bool(
            self.registered or self.generation or self.dataset_params or self.committed_steps
            or saves.length or events.length or self.epoch or self.fence
            or self.record is not None
        )  # fmt: skip

    def settle(self, now_ms: int, default_timeout: float) -> None:
        """The job's heartbeat timeout (stored with the job, else ``default_timeout``) and
        its lifecycle state, from round 1's reads."""
        rec = self.record
        self.timeout_s = (
            rec.heartbeat_timeout_s if rec is not None and rec.heartbeat_timeout_s
            else default_timeout
        )  # fmt: skip
        cutoff = now_ms - self.timeout_s * 1000
        fresh = sum(1 for seen in self.beats.values() if seen >= cutoff)
        last = self.events[0][1].type if self.events else None
        self.state = lifecycle.job_state(
            rec, era=self.era, live=len(self.beats), fresh=fresh, registered=self.registered,
            last_event=last,
        )  # fmt: skip

    def candidates(self, gone_since_ms: int) -> list[str]:
        """The workers to list: live ones, and those whose failure or leave is recent."""
        ids = set(self.beats)
        for entry_id, event in self.events:
            if event.type in ("fail", "leave") and series.entry_ms(entry_id) >= gone_since_ms:
                ids.add(event.worker_id)
        ids.discard("")
        self._candidates = sorted(ids)
        return self._candidates

    # -- round 2 ---------------------------------------------------------------------------
    def queue_details(self, pipe: Any, page: set[str], state: DashboardState) -> None:
        job = self.job_id
        self._page = sorted(page)
        self._details = []
        registry.queue_statuses(pipe, job, self._candidates)
        registry.queue_worker_infos(pipe, job, self._page)
        live = sorted(self.beats)
        for params in self.dataset_params:
            record.queue_progress(pipe, job, params.name, self.epoch)
            record.queue_lease_totals(pipe, job, params.name, live)
            small = params.num_shards <= DISTRIBUTION_MAX_SHARDS
            key = (job, params.name, self.epoch)
            kept = state.completed(key) if small else None
            if small:  # both reads return at most num_shards values
                record.queue_holders(pipe, job, params.name, self.epoch)
                if kept is None:
                    record.queue_completed_by(pipe, job, params.name, self.epoch)
            self._details.append((params, small, key, kept))
        record_steps = {r.checkpoint for _, r in self.records}
        self._uncached = []
        for step in self.committed_steps:
            hit, summary = state.cached_committed(job, step)
            if hit:
                self.committed[step] = summary
            else:
                self._uncached.append(step)
        index.queue_infos(pipe, job, self._uncached)
        # The steps shown: the newest CHECKPOINTS_READ of the committed ones read and those
        # of the save records read. Those not committed: their state hash tells aborted (who
        # and why) or still open.
        shown = sorted(record_steps | set(self.committed_steps), reverse=True)[:CHECKPOINTS_READ]
        self._open_steps = [s for s in shown if s not in self.committed_steps]
        for step in self._open_steps:
            commit.queue_step_state(pipe, job, step)

    def take_details(self, replies: Replies, now_ms: int, state: DashboardState) -> None:
        self.status = registry.take_statuses(replies, self._candidates)
        self.info = registry.take_worker_infos(replies, self._page, self.status, self.beats, now_ms)
        live = sorted(self.beats)
        for params, small, key, kept in self._details:
            self.progress[params.name] = _progress(record.take_progress(replies, params.num_shards))
            self.lease_totals[params.name] = record.take_lease_totals(replies, live)
            if small:
                holders = record.take_holders(replies)
                if kept is None:
                    kept = record.take_completed_by(replies)
                    state.keep_completed(key, kept)
                self.holders[params.name] = holders
                self.distribution[params.name] = _distribution(holders, kept)
            else:
                self.holders[params.name] = {}
                self.distribution[params.name] = None
        for step, info in index.take_infos(replies, self.job_id, self._uncached).items():
            summary = _committed_summary(info)
            self.committed[step] = summary
            if summary is not None:
                state.cache_committed(self.job_id, step, summary)
        for step in self._open_steps:
            self.step_state[step] = commit.take_step_state(replies)
        # the job's training progress (``schema.json``'s ``jobs[].progress``)
        self.training = progress.training(
            now_ms, state.trained(self.job_id), epoch=self.epoch, live=live, beats=self.beats,
            timeout_s=self.timeout_s, page=set(self._page), datasets=self.dataset_params,
            progress=self.progress, totals=self.lease_totals,
            checkpoints=[
                {**step.as_dict(), "location": (self.committed.get(step) or {}).get("location")}
                for step in self.committed_steps
            ],
        )  # fmt: skip

    # -- the document's parts -----------------------------------------------------------------
    def worker_rows(self, now_ms: int) -> list[dict[str, Any]]:
        """The rows of this job's workers on the requested page: a live worker silent past
        the job's heartbeat timeout shows status ``stale`` (whatever it last set), even if
        no reaper declared it failed."""
        timeout_s = self.timeout_s
        held: dict[str, list[dict[str, Any]]] = {}
        for name, holders in self.holders.items():
            for h in holders.values():
                held.setdefault(h.worker_id, []).append({
                    "dataset": name, "epoch": self.epoch, "shard_id": h.shard_id,
                    "token": h.token, "expires_in_s": (h.expires_ms - now_ms) / 1000,
                })  # fmt: skip
        for shards in held.values():
            if len(shards) > 1:
                shards.sort(key=lambda s: (s["dataset"], s["shard_id"]))
        rows = []
        for w in self._page:
            info = self.info[w]
            seen = info.last_seen_s
            stale = seen is not None and seen > timeout_s and info.status in LIVE_STATUSES
            rows.append({
                "job_id": self.job_id,
                "worker_id": w,
                "status": "stale" if stale else info.status,
                "stale": stale,
                "last_seen_s": seen,
                "host": info.host,
                "address": info.address,
                "gpu_count": info.gpu_count,
                "labels": info.labels,
                "incarnation": info.incarnation,
                "shards": held.get(w, []),
            })  # fmt: skip
        return rows

    def counts(self, now_ms: int) -> dict[str, int]:
        """Workers by status; a live one silent past the job's timeout counts as ``stale``
        only (not under the status it last set)."""
        counts = dict.fromkeys((*STATUSES, "stale"), 0)
        timeout_ms = self.timeout_s * 1000
        for w in self._candidates:
            status = self.status.get(w)
            seen = self.beats.get(w)
            if seen is not None and now_ms - seen > timeout_ms and status in LIVE_STATUSES:
                counts["stale"] += 1
            elif status in counts:
                counts[status] += 1
        return counts

    def summary(self) -> dict[str, Any]:
        live = len(self.beats)
        newest = self.committed_steps[0].as_dict() if self.committed_steps else None
        return {
            "job_id": self.job_id,
            "state": self.state,
            "heartbeat_timeout_s": self.timeout_s,
            "epoch": self.epoch,
            "membership_generation": self.generation,
            "live_workers": live,
            "registered_workers": self.registered,
            "gone_workers": max(0, self.registered - live),
            "datasets": len(self.dataset_params),
            "latest_checkpoint": newest,
            "progress": self.training,
        }

    def events_out(self) -> list[dict[str, Any]]:
        return list(self._event_tail.derived("events", self._events_out))

    def _events_out(self, entries: list[tuple[str, MembershipEvent]]) -> list[dict[str, Any]]:
        out = []
        for _, e in reversed(entries):
            event: dict[str, Any] = {
                "job_id": self.job_id,
                "id": e.id,
                "type": e.type,
                "worker_id": e.worker_id,
                "generation": e.generation,
                "ms": e.ms,
            }
            if e.last_seen_ms is not None:
                event["last_seen_ms"] = e.last_seen_ms
            out.append(event)
        return out

    def datasets_out(self) -> list[dict[str, Any]]:
        return [
            {
                "job_id": self.job_id,
                "name": p.name,
                "total_samples": p.total_samples,
                "samples_per_shard": p.samples_per_shard,
                "num_shards": p.num_shards,
                "shuffle": p.shuffle,
                "seed": p.seed,
                "epoch": self.epoch,
                "progress": self.progress[p.name],
                "distribution": self.distribution[p.name],
            }
            for p in self.dataset_params
        ]

    def checkpoints_out(self) -> list[dict[str, Any]]:
        saves: dict[CheckpointId, list[SaveRecord]] = {}
        for _, r in self.records:
            saves.setdefault(r.checkpoint, []).append(r)
        steps = sorted({*self.committed_steps, *self._open_steps}, reverse=True)[:CHECKPOINTS_READ]
        out = []
        for step in steps:
            rows = saves.get(step, [])
            uploaded = [r for r in rows if r.outcome == "uploaded"]
            rate = series.throughput(uploaded)
            row: dict[str, Any] = {
                "job_id": self.job_id, "step": step.step, "state": "unknown",
                "epoch": step.epoch, "run": step.run, "label": step.label,
                "world_size": None, "ranks_saved": rate["ranks"], "bytes": rate["bytes"],
                "files": None, "workers": {}, "seconds": rate["seconds"], "mb_s": rate["mb_s"],
                "at_ms": max((r.at_ms for r in rows), default=None),
                "culprit": None, "reason": None,
            }  # fmt: skip
            summary = self.committed.get(step) if step in self.committed_steps else None
            if summary is not None:
                row.update(summary)
                row["state"] = "committed"
                row["at_ms"] = summary["acked_ms"]
            else:
                st = self.step_state.get(step) or StepState()
                if st.state:
                    row["state"] = st.state
                if st.world_size is not None:
                    row["world_size"] = st.world_size
                row["culprit"] = st.culprit
                row["reason"] = st.reason
                row["workers"] = {str(r.rank): r.worker_id for r in uploaded}
            row.pop("acked_ms", None)
            row.pop("location", None)  # shown in the job's progress (``jobs[].progress``)
            out.append(row)
        return out

    def _last_commit_ms(self) -> int | None:
        """When the newest committed checkpoint's last rank acked (its metadata's
        ``acked_ms``), None if none is committed or its metadata is unreadable."""
        if not self.committed_steps:
            return None
        summary = self.committed.get(self.committed_steps[0])
        return None if summary is None else int(summary["acked_ms"])

    def recent(self, now_ms: int) -> dict[str, Any]:
        """Failures and leaves in the window (the dashboard's ``gone_window``), counted from
        the membership events whose time lies in it: a worker declared failed that has
        rejoined since still counts. ``complete`` is false when the events read (the newest
        ``EVENTS_READ``) may not reach back to the window's start: the counts are then at
        least these."""
        since = now_ms - int(self.window_s * 1000)
        kinds = Counter(e.type for _, e in self.events if e.ms >= since)
        full = len(self.events) >= EVENTS_READ
        return {
            "window_s": self.window_s,
            "failed": kinds["fail"],
            "left": kinds["leave"],
            "complete": not (full and self.events[-1][1].ms >= since),
        }

    def metrics(self, now_ms: int) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "workers": self.counts(now_ms),
            "membership_generation": self.generation,
            "lease_grants_total": self.fence,
            "worker_failures_total": self.failures,
            "recent": self.recent(now_ms),
            "checkpoint_totals": dataclasses.asdict(self.totals),
            "last_commit_ms": self._last_commit_ms(),
            "shards": {
                key: sum(p[key] for p in self.progress.values())
                for key in ("done", "leased", "todo")
            },
            "barrier": self._latency_tail.derived("barrier", series.barrier_metrics),
            "checkpoint": series.checkpoint_metrics(self.records, self.step_state),
            "membership": {"series": self._event_tail.derived("series", series.membership_series)},
        }


def _progress(p: EpochProgress) -> dict[str, Any]:
    return {
        "initialized": p.initialized,
        "total": p.total,
        "done": p.done,
        "leased": p.leased,
        "todo": p.todo if p.initialized else p.total,
        "steals": p.steals,
    }


def _distribution(holders: dict[int, LeaseHolder], completed: Counter[str]) -> list[dict[str, Any]]:
    """Per worker: shards it completed in the epoch, and shards it holds a lease on now."""
    leased = Counter(h.worker_id for h in holders.values())
    return [
        {"worker_id": w, "done": completed.get(w, 0), "leased": leased.get(w, 0)}
        for w in sorted(completed.keys() | leased.keys())
    ]


def _committed_summary(info: CheckpointInfo | None) -> dict[str, Any] | None:
    """The dashboard's view of a committed step's metadata (checksums left out)."""
    if info is None:
        return None
    return {
        "epoch": info.epoch,
        "world_size": info.world_size,
        "bytes": info.nbytes,
        "files": len(info.files),
        "workers": {str(r): w for r, w in info.workers.items()},
        "acked_ms": info.acked_ms,
        "location": info.location or None,
    }

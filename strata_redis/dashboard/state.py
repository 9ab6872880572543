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
- the list of jobs (the all-jobs view only): a ``SCAN`` for ``strata:{*}:generation`` keys,
  advanced by at most ``SCAN_CALLS`` calls per document and repeated every
  ``JOBS_REFRESH_S`` seconds (``JobDirectory``); with a job given there is no ``SCAN``.

A document costs two pipelined round trips (plus the bounded ``SCAN`` steps of the job list)
and about 25 commands per job; what they return grows with the workers listed and the
shards of the datasets (at most ``DISTRIBUTION_MAX_SHARDS``), not with the job's history.
Reads go through the public key schema (``strata_redis.keys.Keys``) where the core has no
read API for what the page needs; each such place is marked ``# direct read``.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import orjson
import redis

import strata_redis
from strata_redis.connection import describe, is_cluster, server_time, zrange_pages
from strata_redis.coordination.registry import LIVE_PAGE, list_jobs
from strata_redis.keys import PREFIX, Keys

SCHEMA: Final = "strata-dashboard/1"
STATUSES: Final = ("idle", "training", "checkpointing", "failed", "left")
LIVE_STATUSES: Final = ("idle", "training", "checkpointing")
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
#: registration details kept decoded (raw JSON -> dict; they change only on registration)
INFO_CACHE: Final = 20_000
#: jobs shown in detail in the all-jobs view (the rest are counted in ``jobs_listing``)
MAX_JOBS: Final = 20
#: the largest page of workers
MAX_LIMIT: Final = 5000
#: SCAN calls per document while the job list is being refreshed, and keys asked per call
SCAN_CALLS: Final = 8
SCAN_COUNT: Final = 1000
JOBS_REFRESH_S: Final = 30.0
#: points in a chart's series at most
SERIES_POINTS: Final = 60
#: committed-step summaries kept decoded (they never change)
COMMITTED_CACHE: Final = 4096
#: streams whose newest entries are kept between documents (three per job)
TAILS_KEPT: Final = 3 * 4 * MAX_JOBS

_STEP_FIELDS: Final = (
    "state", "world_size", "epoch", "opened_ms", "leader", "acked_ms", "committed_ms",
    "aborted_ms", "culprit", "reason",
)  # fmt: skip


class JobNotFoundError(LookupError):
    """A job id that is malformed or has no state in this Redis (HTTP 404)."""

    def __init__(self, message: str, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


def check_job_id(job_id: str) -> Keys:
    """The key schema of ``job_id``, or ``JobNotFoundError`` saying why it cannot be a job."""
    try:
        return Keys(job_id)
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
            pattern = f"{PREFIX}:{{*}}:generation"
            if is_cluster(client):  # every primary, in one sweep (redis-py walks them)
                self._found = set(list_jobs(client))
                self.jobs = sorted(self._found)
                self.complete, self.as_of, self._sweeping = True, time.monotonic(), False
                return len(client.get_primaries())  # type: ignore[attr-defined]
            for calls in range(1, SCAN_CALLS + 1):
                self._cursor, keys = client.scan(self._cursor, match=pattern, count=SCAN_COUNT)
                for key in map(str, keys):
                    self._found.add(key[key.index("{") + 1 : key.rindex("}")])
                if self._cursor == 0:
                    self.jobs = sorted(self._found)
                    self.complete, self.as_of, self._sweeping = True, time.monotonic(), False
                    return calls
            if not self.complete:
                self.jobs = sorted(self._found | set(self.jobs))
            return SCAN_CALLS


Entry = tuple[str, dict[str, str]]


def _entry_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class StreamTail:
    """The newest ``cap`` entries of one capped stream, kept between documents.

    Stream entries never change: each read asks only for the entries after the newest one
    kept (``XREVRANGE key + (<id> COUNT cap``) and the stream's length. A stream that holds
    fewer entries than are kept (trimmed, deleted or flushed) keeps only that many of the
    newest, so nothing gone from Redis is shown for long. (A stream deleted and written
    again within the same millisecond as the newest entry kept would not be told apart
    from the old one until a newer entry arrives.)
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.entries: list[Entry] = []  # newest first
        self._lock = threading.Lock()
        self._memo: dict[str, Any] = {}  # what was derived from the entries, until they change

    def queue(self, pipe: Any, key: str) -> None:
        with self._lock:
            newest = self.entries[0][0] if self.entries else None
        if newest is None:
            pipe.xrevrange(key, count=self.cap)
        else:
            pipe.xrevrange(key, max="+", min=f"({newest}", count=self.cap)
        pipe.xlen(key)

    def take(self, new: list[Entry], length: int) -> list[Entry]:
        """Merge a read's new entries (newest first); return the kept ones, newest first."""
        with self._lock:
            if self.entries:  # a concurrent document may have merged some of them already
                top = _entry_key(self.entries[0][0])
                new = [e for e in new if _entry_key(e[0]) > top]
            merged = new if len(new) >= self.cap else new + self.entries
            kept = merged[: min(self.cap, length)]
            if len(kept) != len(self.entries) or (kept and kept[0][0] != self.entries[0][0]):
                self._memo = {}
            self.entries = kept
            return self.entries

    def derived(self, name: str, make: Callable[[list[Entry]], Any]) -> Any:
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
            as ``stale`` (not yet declared failed by any reaper). Use the job's own timeout.
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
        self._committed_cache: OrderedDict[tuple[str, int], dict[str, Any] | None] = OrderedDict()
        self._tails: OrderedDict[str, StreamTail] = OrderedDict()
        self._infos: dict[str, dict[str, Any]] = {}
        # (job, dataset, epoch) -> (time.monotonic() of the read, workers' completed shards)
        self._completed: dict[tuple[str, str, int], tuple[float, Counter[str]]] = {}
        # (redis ms, total commands processed, commands this reader sent so far)
        self._samples: deque[tuple[int, int, int]] = deque(maxlen=SERIES_POINTS * 10)
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
        jobs = [_JobRead(j, Keys(j), self) for j in ids]

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
        if cluster:
            clock_key = jobs[0].k.generation if jobs else "strata:{clock}:x"
            (sec, usec), rest = server_time(self.client, clock_key), replies
        else:
            (sec, usec), rest = _ok(replies[0]), replies[1:]
        now_ms = int(sec) * 1000 + int(usec) // 1000
        stats: dict[str, Any] | None = None
        if info:
            stats, rest = self._stats(rest[0]), rest[1:]
        for j in jobs:
            rest = j.take_heads(rest, self.client)
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
        for j in jobs:
            replies = j.take_details(replies, self)

        workers = [w for j in jobs for w in j.worker_rows(now_ms, self.heartbeat_timeout)]
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
                "jobs": [j.metrics(now_ms, self.heartbeat_timeout) for j in jobs],
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
            "series": _thin(points),
        }

    def tail(self, key: str, cap: int) -> StreamTail:
        """The kept newest entries of stream ``key``."""
        with self._lock:
            tail = self._tails.get(key)
            if tail is None:
                tail = self._tails[key] = StreamTail(cap)
                while len(self._tails) > TAILS_KEPT:
                    self._tails.popitem(last=False)
            self._tails.move_to_end(key)
            return tail

    def decode_info(self, raw: str | None) -> dict[str, Any]:
        """A worker's registration details (JSON), decoded once per distinct value."""
        if not raw:
            return {}
        info = self._infos.get(raw)
        if info is None:
            info = orjson.loads(raw)
            with self._lock:
                if len(self._infos) >= INFO_CACHE:
                    self._infos.clear()
                self._infos[raw] = info
        return info

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
    def cached_committed(self, job_id: str, step: int) -> tuple[bool, dict[str, Any] | None]:
        with self._lock:
            key = (job_id, step)
            if key in self._committed_cache:
                self._committed_cache.move_to_end(key)
                return True, self._committed_cache[key]
        return False, None

    def cache_committed(self, job_id: str, step: int, summary: dict[str, Any] | None) -> None:
        with self._lock:
            self._committed_cache[(job_id, step)] = summary
            while len(self._committed_cache) > COMMITTED_CACHE:
                self._committed_cache.popitem(last=False)


class _JobRead:
    """One job's part of a document: what to queue on each round, and what came back."""

    def __init__(self, job_id: str, keys: Keys, state: DashboardState) -> None:
        self.job_id = job_id
        self.k = keys
        self._event_tail = state.tail(keys.events, EVENTS_READ)
        # direct reads: the latency record and the save records (job.barrier_latencies() and
        # CheckpointManager.records() read them whole each time, one round trip each)
        self._latency_tail = state.tail(keys.barrier_latency, LATENCIES_READ)
        self._record_tail = state.tail(keys.checkpoint_records, RECORDS_READ)
        self.beats: list[tuple[str, float]] = []
        self.registered = 0
        self.generation = 0
        self.epoch = 0
        self.fence = 0
        self.dataset_params: list[strata_redis.DatasetParams] = []
        self.events: list[tuple[str, dict[str, str]]] = []
        self.latencies: list[tuple[str, dict[str, str]]] = []
        self.committed_steps: list[int] = []
        self.records: list[tuple[str, dict[str, str]]] = []
        self.exists = False
        self.status: dict[str, str | None] = {}
        self.info: dict[str, dict[str, Any]] = {}
        self.incarnation: dict[str, int] = {}
        self.progress: dict[str, dict[str, Any]] = {}
        self.holders: dict[str, dict[str, str]] = {}
        self.distribution: dict[str, list[dict[str, Any]] | None] = {}
        self.committed: dict[int, dict[str, Any] | None] = {}
        self.step_state: dict[int, dict[str, str | None]] = {}
        self._candidates: list[str] = []
        self._details: list[Any] = []

    # -- round 1 ---------------------------------------------------------------------------
    def queue_heads(self, pipe: Any) -> None:
        k = self.k
        # live workers with their last heartbeat (without zrange()'s score_cast_func
        # round, which takes twice as long at 1,000 workers): the first page here, the
        # others in take_heads (a page is one bounded command at 10^5 workers)
        pipe.execute_command("ZRANGE", k.heartbeats, 0, LIVE_PAGE - 1, "WITHSCORES")
        pipe.hlen(k.status)
        pipe.get(k.generation)
        pipe.get(k.epoch)  # direct read: Job.current_epoch() is one round trip of its own
        pipe.hgetall(k.datasets)
        self._event_tail.queue(pipe, k.events)
        self._latency_tail.queue(pipe, k.barrier_latency)
        pipe.zrange(k.checkpoints, 0, CHECKPOINTS_READ - 1, desc=True)  # direct read
        self._record_tail.queue(pipe, k.checkpoint_records)
        pipe.get(k.fence)  # direct read: lease grants so far (no API)

    def take_heads(self, replies: Sequence[Any], client: Any) -> list[Any]:
        (beats, registered, gen, epoch, datasets, events, events_len, lat, lat_len, steps,
         records, records_len, fence) = (_ok(r) for r in replies[:13])  # fmt: skip
        # the next pages, one bounded command each (a worker that moved between pages is
        # listed once)
        beats = zrange_pages(
            client, self.k.heartbeats, LIVE_PAGE, first=_pairs(beats), withscores=True
        )
        self.beats = list({str(w): float(s) for w, s in beats}.items())
        self.registered = int(registered)
        self.generation = int(gen or 0)
        self.epoch = int(epoch or 0)
        self.fence = int(fence or 0)
        self.dataset_params = sorted(
            (strata_redis.DatasetParams(name=n, **orjson.loads(v)) for n, v in datasets.items()),
            key=lambda p: p.name,
        )
        self.events = self._event_tail.take(events, events_len)
        self.latencies = self._latency_tail.take(lat, lat_len)
        self.committed_steps = [int(s) for s in steps]
        self.records = self._record_tail.take(records, records_len)
        self.exists = bool(
            registered or gen or datasets or steps or records_len or events_len or epoch or fence
        )
        return list(replies[13:])

    def candidates(self, gone_since_ms: int) -> list[str]:
        """The workers to list: live ones, and those whose failure or leave is recent."""
        ids = {w for w, _ in self.beats}
        for entry_id, f in self.events:
            if f.get("type") in ("fail", "leave") and _entry_ms(entry_id) >= gone_since_ms:
                ids.add(f.get("worker", ""))
        ids.discard("")
        self._candidates = sorted(ids)
        return self._candidates

    # -- round 2 ---------------------------------------------------------------------------
    def queue_details(self, pipe: Any, page: set[str], state: DashboardState) -> None:
        k = self.k
        self._page = sorted(page)
        self._details = []
        for chunk in _chunks(self._candidates, LIVE_PAGE):
            pipe.hmget(k.status, chunk)
        if self._page:
            pipe.hmget(k.info, self._page)
            pipe.hmget(k.incarnation, self._page)
        for params in self.dataset_params:
            lk = k.lease_keys(params.name, self.epoch)  # direct reads: the epoch's record
            pipe.hmget(lk.meta, ["created_ms", "steals"])
            pipe.hlen(lk.done)
            pipe.hlen(lk.holders)
            pipe.zcard(lk.todo)
            small = params.num_shards <= DISTRIBUTION_MAX_SHARDS
            key = (self.job_id, params.name, self.epoch)
            kept = state.completed(key) if small else None
            if small:  # both hashes hold at most num_shards fields
                pipe.hgetall(lk.holders)
                if kept is None:
                    pipe.hvals(lk.done)  # "<token> <worker>" per shard done: who did it
            self._details.append((params, small, key, kept))
        record_steps = {int(f["step"]) for _, f in self.records if "step" in f}
        self._uncached = []
        for step in self.committed_steps:
            hit, summary = state.cached_committed(self.job_id, step)
            if hit:
                self.committed[step] = summary
            else:
                self._uncached.append(step)
        if self._uncached:
            pipe.hmget(k.checkpoint_info, [str(s) for s in self._uncached])  # direct read
        # The steps shown: the newest CHECKPOINTS_READ of the committed ones read and those
        # of the save records read. Those not committed: their state hash tells aborted (who
        # and why) or still open.
        shown = sorted(record_steps | set(self.committed_steps), reverse=True)[:CHECKPOINTS_READ]
        self._open_steps = [s for s in shown if s not in self.committed_steps]
        for step in self._open_steps:
            pipe.hmget(k.checkpoint_step(step), _STEP_FIELDS)  # direct read

    def take_details(self, replies: Sequence[Any], state: DashboardState) -> list[Any]:
        replies = list(replies)
        self.status = {}
        for chunk in _chunks(self._candidates, LIVE_PAGE):
            self.status.update(zip(chunk, replies.pop(0), strict=True))
        if self._page:
            infos, incs = replies.pop(0), replies.pop(0)
            for w, raw, inc in zip(self._page, infos, incs, strict=True):
                self.info[w] = state.decode_info(raw)
                self.incarnation[w] = int(inc or 0)
        for params, small, key, kept in self._details:
            (created, steals), done, leased, todo = (replies.pop(0) for _ in range(4))
            total = params.num_shards
            started = created is not None
            self.progress[params.name] = {
                "initialized": started,
                "total": total,
                "done": int(done),
                "leased": int(leased),
                "todo": int(todo) if started else total,
                "steals": int(steals or 0),
            }
            if small:
                holders = replies.pop(0)
                if kept is None:
                    kept = Counter([v.partition(" ")[2] for v in replies.pop(0)])
                    state.keep_completed(key, kept)
                self.holders[params.name] = holders
                self.distribution[params.name] = _distribution(holders, kept)
            else:
                self.holders[params.name] = {}
                self.distribution[params.name] = None
        if self._uncached:
            for step, raw in zip(self._uncached, replies.pop(0), strict=True):
                summary = _committed_summary(raw, self.job_id, step)
                self.committed[step] = summary
                if summary is not None:
                    state.cache_committed(self.job_id, step, summary)
        for step in self._open_steps:
            self.step_state[step] = dict(zip(_STEP_FIELDS, replies.pop(0), strict=True))
        return replies

    # -- the document's parts -----------------------------------------------------------------
    def worker_rows(self, now_ms: int, timeout_s: float) -> list[dict[str, Any]]:
        """The rows of this job's workers on the requested page."""
        last = dict(self.beats)
        held: dict[str, list[dict[str, Any]]] = {}
        for name, holders in self.holders.items():
            for shard, value in holders.items():
                token, expires, _prio, worker = value.split(" ", 3)
                held.setdefault(worker, []).append({
                    "dataset": name, "epoch": self.epoch, "shard_id": int(shard),
                    "token": int(token), "expires_in_s": (int(expires) - now_ms) / 1000,
                })  # fmt: skip
        for shards in held.values():
            if len(shards) > 1:
                shards.sort(key=lambda s: (s["dataset"], s["shard_id"]))
        rows = []
        status, info, incarnation, job_id = self.status, self.info, self.incarnation, self.job_id
        timeout_ms = timeout_s * 1000
        for w in self._page:
            seen = last.get(w)
            age_ms = None if seen is None else max(0.0, now_ms - seen)
            meta = info.get(w) or {}
            rows.append({
                "job_id": job_id,
                "worker_id": w,
                "status": status.get(w) or "unknown",
                "stale": age_ms is not None and age_ms > timeout_ms,
                "last_seen_s": None if age_ms is None else age_ms / 1000,
                "host": meta.get("host"),
                "address": meta.get("address"),
                "gpu_count": meta.get("gpu_count", 0),
                "labels": meta.get("labels") or {},
                "incarnation": incarnation.get(w, 0),
                "shards": held.get(w, []),
            })  # fmt: skip
        return rows

    def counts(self, now_ms: int, timeout_s: float) -> dict[str, int]:
        counts = dict.fromkeys((*STATUSES, "stale"), 0)
        for w in self._candidates:
            status = self.status.get(w)
            if status in counts:
                counts[status] += 1
        timeout_ms = timeout_s * 1000
        counts["stale"] = sum(1 for _, seen in self.beats if now_ms - seen > timeout_ms)
        return counts

    def summary(self) -> dict[str, Any]:
        live = len(self.beats)
        newest = self.committed_steps[0] if self.committed_steps else None
        return {
            "job_id": self.job_id,
            "epoch": self.epoch,
            "membership_generation": self.generation,
            "live_workers": live,
            "registered_workers": self.registered,
            "gone_workers": max(0, self.registered - live),
            "datasets": len(self.dataset_params),
            "latest_checkpoint": newest,
        }

    def events_out(self) -> list[dict[str, Any]]:
        return list(self._event_tail.derived("events", self._events_out))

    def _events_out(self, entries: list[Entry]) -> list[dict[str, Any]]:
        out = []
        for entry_id, f in reversed(entries):
            event: dict[str, Any] = {
                "job_id": self.job_id,
                "id": entry_id,
                "type": f.get("type", ""),
                "worker_id": f.get("worker", ""),
                "generation": int(f.get("generation", 0)),
                "ms": int(f.get("ms", _entry_ms(entry_id))),
            }
            if "last_seen_ms" in f:
                event["last_seen_ms"] = int(float(f["last_seen_ms"]))
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
        saves: dict[int, list[dict[str, str]]] = {}
        for _, f in self.records:
            saves.setdefault(int(f["step"]), []).append(f)
        steps = sorted({*self.committed_steps, *self._open_steps}, reverse=True)[:CHECKPOINTS_READ]
        out = []
        for step in steps:
            records = saves.get(step, [])
            uploaded = [r for r in records if r.get("outcome") == "uploaded"]
            nbytes = sum(int(r["bytes"]) for r in uploaded)
            seconds = max((float(r["seconds"]) for r in uploaded), default=0.0)
            row: dict[str, Any] = {
                "job_id": self.job_id, "step": step, "state": "unknown", "epoch": None,
                "world_size": None, "ranks_saved": len(uploaded), "bytes": nbytes,
                "files": None, "workers": {}, "seconds": round(seconds, 6) if uploaded else None,
                "mb_s": round(nbytes / 1e6 / seconds, 3) if seconds > 0 else None,
                "at_ms": max((int(r["at_ms"]) for r in records), default=None),
                "culprit": None, "reason": None,
            }  # fmt: skip
            summary = self.committed.get(step) if step in self.committed_steps else None
            if summary is not None:
                row.update(summary)
                row["state"] = "committed"
                row["at_ms"] = summary["acked_ms"]
            else:
                st = self.step_state.get(step, {})
                if st.get("state"):
                    row["state"] = st["state"]
                if st.get("epoch"):
                    row["epoch"] = int(st["epoch"] or 0)
                if st.get("world_size"):
                    row["world_size"] = int(st["world_size"] or 0)
                row["culprit"] = st.get("culprit")
                row["reason"] = st.get("reason")
                row["workers"] = {r["rank"]: r["worker"] for r in uploaded}
            row.pop("acked_ms", None)
            out.append(row)
        return out

    def metrics(self, now_ms: int, timeout_s: float) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "workers": self.counts(now_ms, timeout_s),
            "membership_generation": self.generation,
            "lease_grants_total": self.fence,
            "shards": {
                key: sum(p[key] for p in self.progress.values())
                for key in ("done", "leased", "todo")
            },
            "barrier": self._latency_tail.derived("barrier", _barrier_metrics),
            "checkpoint": _checkpoint_metrics(self.records, self.step_state),
            "membership": {"series": self._event_tail.derived("series", _membership_series)},
        }


def _ok(reply: Any) -> Any:
    if isinstance(reply, Exception):
        raise reply
    return reply


def _entry_ms(entry_id: str) -> int:
    return int(entry_id.split("-", 1)[0])


def _distribution(holders: dict[str, str], completed: Counter[str]) -> list[dict[str, Any]]:
    """Per worker: shards it completed in the epoch, and shards it holds a lease on now."""
    leased = Counter(v.split(" ", 3)[3] for v in holders.values())
    return [
        {"worker_id": w, "done": completed.get(w, 0), "leased": leased.get(w, 0)}
        for w in sorted(completed.keys() | leased.keys())
    ]


def _committed_summary(raw: str | None, job_id: str, step: int) -> dict[str, Any] | None:
    """The dashboard's view of a committed step's metadata (checksums left out)."""
    if raw is None:
        return None
    try:
        doc = orjson.loads(raw)
        files = doc["files"]
        return {
            "epoch": doc.get("epoch"),
            "world_size": int(doc["world_size"]),
            "bytes": sum(int(f["size"]) for f in files.values()),
            "files": len(files),
            "workers": {str(r): str(w) for r, w in doc["workers"].items()},
            "acked_ms": int(doc["acked_ms"]),
        }
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0..100) of non-empty sorted values."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def _buckets(points: Iterable[tuple[int, Any]]) -> list[tuple[int, list[Any]]]:
    """``(ms, value)`` points grouped into at most ``SERIES_POINTS`` equal time buckets."""
    items = sorted(points, key=lambda p: p[0])
    if not items:
        return []
    first, last = items[0][0], items[-1][0]
    width = max(1000, math.ceil((last - first + 1) / SERIES_POINTS))
    groups: dict[int, list[Any]] = {}
    for ms, value in items:
        groups.setdefault(first + (ms - first) // width * width, []).append(value)
    return sorted(groups.items())


def _barrier_metrics(entries: list[tuple[str, dict[str, str]]]) -> dict[str, Any]:
    points = [(int(f["at_ms"]), int(f["release_us"]) / 1000) for _, f in entries]
    values = sorted(v for _, v in points)
    series = []
    for start, group in _buckets(points):
        group.sort()
        series.append([start / 1000, round(_percentile(group, 50), 3),
                       round(_percentile(group, 99), 3)])  # fmt: skip
    return {
        "releases": len(values),
        "p50_ms": round(_percentile(values, 50), 3) if values else None,
        "p99_ms": round(_percentile(values, 99), 3) if values else None,
        "max_ms": round(values[-1], 3) if values else None,
        "series": series,
    }


def _checkpoint_metrics(
    records: list[tuple[str, dict[str, str]]], step_state: dict[int, dict[str, str | None]]
) -> dict[str, Any]:
    uploaded = [f for _, f in records if f.get("outcome") == "uploaded"]
    aborted = [f for _, f in records if f.get("outcome") == "aborted"]
    aborted_steps = {int(f["step"]) for f in aborted}
    aborted_steps |= {s for s, st in step_state.items() if st.get("state") == "aborted"}
    newest = max(uploaded, key=lambda f: int(f["at_ms"]), default=None)
    # MB/s over time: the bytes of every save that ended in a bucket over the bucket's span.
    series = []
    for start, group in _buckets((int(f["at_ms"]), f) for f in uploaded):
        series.append([start / 1000, round(sum(float(f["mb_s"]) for f in group) / len(group), 3)])
    return {
        "saves": len(uploaded),
        "aborted_saves": len(aborted),
        "aborted_steps": len(aborted_steps),
        "bytes": sum(int(f["bytes"]) for f in uploaded),
        "seconds": round(sum(float(f["seconds"]) for f in uploaded), 6),
        "last_step": int(newest["step"]) if newest else None,
        "last_bytes": int(newest["bytes"]) if newest else None,
        "last_seconds": float(newest["seconds"]) if newest else None,
        "last_mb_s": float(newest["mb_s"]) if newest else None,
        "series": series,
    }


def _membership_series(events: list[tuple[str, dict[str, str]]]) -> list[list[float]]:
    kinds = {"join": 0, "replace": 0, "leave": 1, "fail": 2}
    series = []
    for start, group in _buckets((_entry_ms(i), f.get("type", "")) for i, f in events):
        counts = [0, 0, 0]
        for kind in group:
            if kind in kinds:
                counts[kinds[kind]] += 1
        series.append([start / 1000, *counts])
    return series


def _thin(points: list[list[float]]) -> list[list[float]]:
    """At most ``SERIES_POINTS`` of the newest points."""
    return points[-SERIES_POINTS:]


def _pairs(reply: Sequence[Any]) -> list[Any]:
    """A WITHSCORES reply as (member, score) pairs (redis-py < 6 gives it flat)."""
    if reply and not isinstance(reply[0], (list, tuple)):
        return list(zip(reply[::2], reply[1::2], strict=True))
    return list(reply)


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    """``items`` in lists of at most ``size`` (one bounded command each)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]

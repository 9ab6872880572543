"""The worker registry's reads and its reaper: who is in a job, and declaring the silent failed.

Registration and heartbeats belong to ``Worker`` (``workers.py``); everything here reads the
registry or runs the reaper step, and is what other features call (leases ask who is live,
barriers and heartbeats batch a reaper step with their own call).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import orjson

from ..connection import (
    SCAN_STEP,
    Replies,
    StreamPage,
    hash_items,
    is_cluster,
    queue_stream_page,
    run_read,
    score_pairs,
    server_time,
    take_reply,
    take_stream_page,
    zrange_pages,
)
from ..context import JobContext
from ..keys import JOBS_KEYS_PATTERN, Keys, job_of
from ..scripts import Call, check
from ..validate import check_int

__all__ = [
    "JOBS_PATTERN",
    "LIVE_PAGE",
    "REAP_BATCH",
    "STALL_FRACTION",
    "STATUSES",
    "Holder",
    "MembershipEvent",
    "RedisClock",
    "WorkerInfo",
    "events",
    "holder",
    "job_clock",
    "list_jobs",
    "live_workers",
    "membership_generation",
    "queue_events",
    "queue_generation",
    "queue_heartbeats",
    "queue_liveness",
    "queue_registered",
    "queue_statuses",
    "queue_worker_infos",
    "reap",
    "reap_call",
    "reaped",
    "scan_jobs",
    "take_events",
    "take_generation",
    "take_heartbeats",
    "take_liveness",
    "take_registered",
    "take_statuses",
    "take_worker_infos",
    "workers",
]

#: statuses a live worker may set; ``failed`` and ``left`` are set by the reaper and ``deregister``.
SETTABLE_STATUSES = ("idle", "training", "checkpointing")
STATUSES = (*SETTABLE_STATUSES, "failed", "left")
#: workers one reaper step declares failed at most (``reap`` repeats until none are left)
REAP_BATCH = 1000
#: a stamped reaper step that waited in Redis longer than this fraction of the heartbeat
#: timeout before running saw a Redis stall (see ``reap_call``)
STALL_FRACTION = 0.25


@dataclass(frozen=True)
class WorkerInfo:
    """A worker as ``Job.workers()`` reports it.

    Attributes:
        worker_id: the id it registered with.
        status: ``idle``, ``training``, ``checkpointing``, ``failed`` or ``left``.
        last_seen_s: seconds since its last heartbeat, on Redis' clock (None once failed/left).
        host, address, gpu_count, labels: what it registered with.
        incarnation: the membership generation of its latest registration.
        pid: the process id of its latest registration (None if made before pids were
            recorded).
    """

    worker_id: str
    status: str
    last_seen_s: float | None
    host: str | None = None
    address: str | None = None
    gpu_count: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    incarnation: int = 0
    pid: int | None = None


#: live workers read per command: one ZRANGE of 10^5 members held Redis for 16 ms, a page of
#: 10^4 with their scores 10 ms (2-vCPU VM)
LIVE_PAGE = 2_000


def workers(ctx: JobContext) -> list[WorkerInfo]:
    """Every worker the job has seen, sorted by id, with ages on Redis' clock.

    One round trip for a small job; at 10^5 workers the hashes are read by ``HSCAN`` steps
    and the live set by pages, each one bounded command (not one long ``HGETALL``)."""
    k = ctx.keys
    cluster = is_cluster(ctx.client)  # redis-py refuses TIME in a cluster pipeline
    with ctx.client.pipeline(transaction=False) as pipe:
        for key in (k.status, k.info, k.incarnation):
            pipe.hscan(key, 0, count=SCAN_STEP)
        queue_heartbeats(pipe, ctx.job_id)
        if not cluster:
            pipe.time()
        replies = iter(pipe.execute())
    status, info, incarnation = (
        hash_items(ctx.client, key, first=take_reply(replies))
        for key in (k.status, k.info, k.incarnation)
    )
    last = take_heartbeats(replies, ctx.client, ctx.job_id)
    sec, usec = server_time(ctx.client, k.heartbeats) if cluster else take_reply(replies)
    now_ms = int(sec) * 1000 + int(usec) / 1000
    return [
        _worker_info(w, status[w], info.get(w), incarnation.get(w), last.get(w), now_ms)
        for w in sorted(status)
    ]


@dataclass(frozen=True)
class _Registration:
    """What a worker registered with: the info hash's JSON value, decoded."""

    host: str | None
    address: str | None
    gpu_count: int
    labels: Mapping[str, str]
    pid: int | None  # None: registered before pids were recorded
    started: int | None = None  # the process's start time (None: not recorded)
    space: str | None = None  # the pid space it ran in (None: not recorded)
    attempt: str | None = None  # the registration's own mark (None: not recorded)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@lru_cache(maxsize=20_000)
def _registration(raw: str) -> _Registration:
    """Decode a registration (JSON {host, address, gpu_count, labels, pid, started,
    space, attempt}); kept decoded, as it changes only when the worker registers again."""
    meta = orjson.loads(raw)
    space, attempt = meta.get("space"), meta.get("attempt")
    return _Registration(
        meta.get("host"), meta.get("address"), int(meta.get("gpu_count", 0)),
        dict(meta.get("labels") or {}), _int(meta.get("pid")), _int(meta.get("started")),
        space if isinstance(space, str) and space else None,
        attempt if isinstance(attempt, str) and attempt else None,
    )  # fmt: skip


_UNREGISTERED = _Registration(None, None, 0, {}, None)


@dataclass(frozen=True)
class Holder:
    """The process that made a registration, as its info value records it (None: unknown,
    e.g. registered by code that did not record it).

    Attributes:
        host: the host it registered with (this machine's name unless the caller gave one).
        pid: its process id.
        started: its start time, in the kernel's clock ticks since boot (Linux
            ``/proc/<pid>/stat``): tells the process apart from a later one given its pid.
        space: the pid space its pid is valid in (the kernel boot and pid namespace): a
            process in the same space can ask the kernel whether that pid is still running.
        attempt: the registration's own mark (a send that lost its reply finds itself).
    """

    host: str | None
    pid: int | None
    started: int | None = None
    space: str | None = None
    attempt: str | None = None


def holder(raw_info: str) -> Holder:
    """The process that made a registration, from its info value ('' or a value written
    before pids were recorded: what is unknown is None)."""
    reg = _registration(raw_info) if raw_info else _UNREGISTERED
    return Holder(reg.host, reg.pid, reg.started, reg.space, reg.attempt)


def _worker_info(
    worker_id: str,
    status: str | None,
    raw_info: str | None,
    incarnation: str | None,
    seen_ms: float | None,
    now_ms: float,
) -> WorkerInfo:
    reg = _registration(raw_info) if raw_info else _UNREGISTERED
    return WorkerInfo(
        worker_id,
        status or "unknown",
        None if seen_ms is None else max(0.0, (now_ms - seen_ms) / 1000),
        reg.host,
        reg.address,
        reg.gpu_count,
        dict(reg.labels) if reg.labels else {},
        int(incarnation or 0),
        reg.pid,
    )


def live_workers(ctx: JobContext) -> list[str]:
    """Ids of the workers that are registered and not failed or left, sorted.

    Read in pages of ``LIVE_PAGE``, so a job of 10^5 workers never holds Redis long for
    this; a worker that joins or leaves during the read may be missed or included (the
    membership generation tells a caller that the set moved)."""
    return sorted(set(zrange_pages(ctx.client, ctx.keys.heartbeats, LIVE_PAGE)))


def membership_generation(ctx: JobContext) -> int:
    """The membership generation: moves by one on every join, leave and failure."""
    return run_read(ctx.client, lambda pipe: queue_generation(pipe, ctx.job_id), take_generation)


class RedisClock:
    """Redis' clock (ms) as estimated from this process's monotonic clock.

    Each sample is one round trip whose reply carried Redis' time; the estimate uses the
    sample with the shortest round trip among the last ``keep`` (within half of it), so a
    call that waited out a stall never skews it.
    """

    def __init__(self, keep: int = 16) -> None:
        self._samples: deque[tuple[float, float]] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def sample(self, sent: float, received: float, redis_ms: float) -> None:
        """One round trip: sent and received on ``time.monotonic()``, Redis' time in it."""
        with self._lock:
            self._samples.append((received - sent, redis_ms - (sent + received) * 500))

    def now_ms(self) -> float | None:
        """Redis' time now, ms; None before the first sample."""
        with self._lock:
            if not self._samples:
                return None
            offset = min(self._samples)[1]
        return time.monotonic() * 1000 + offset


def reap_call(ctx: JobContext, sent_ms: float | None = None) -> Call:
    """One reaper step as a script call, to batch with other calls (see ``reap``).

    Args:
        ctx: the job.
        sent_ms: when the call is sent, ms on Redis' clock (the caller's estimate). Given
            (heartbeat threads and barrier waiters do), the step detects a Redis stall: it
            waited to run longer than ``STALL_FRACTION`` of the heartbeat timeout, or no
            stamped step ran for half the timeout. For one timeout after a stall only
            workers silent since a timeout before it began are declared failed (see
            ``lua/reap_workers.lua``).
    """
    k = ctx.keys
    timeout_ms = int(ctx.heartbeat_timeout * 1000)
    sent = "" if sent_ms is None else int(sent_ms)
    return (
        "reap_workers",
        [k.heartbeats, k.status, k.generation, k.events, k.reaper, k.failures],
        [
            timeout_ms,
            ctx.events_cap,
            REAP_BATCH,
            sent,
            int(timeout_ms * STALL_FRACTION),
            timeout_ms // 2,
        ],
    )


def reaped(ctx: JobContext, reply: list[Any]) -> list[str]:
    """The ids newly declared failed, from the raw reply of a ``reap_call``."""
    return [str(x) for x in check(reply, {"job_id": ctx.job_id})[1:]]


def reap(ctx: JobContext) -> list[str]:
    """Declare failed every worker silent for longer than ``heartbeat_timeout``.

    Atomic and safe to run from any number of processes at once; every live worker's
    heartbeat thread runs it too, so no extra daemon is needed.

    Returns:
        The ids this call declared failed (each failure is reported once, to one caller).
    """
    ids: list[str] = []
    while True:
        batch = reaped(ctx, ctx.scripts.call(*reap_call(ctx)))
        ids += batch
        if len(batch) < REAP_BATCH:
            return ids


def events(ctx: JobContext, count: int = 100) -> list[dict[str, str]]:
    """The newest membership events (join, replace, leave, fail), oldest first, each as its
    stored fields (``MembershipEvent.fields``) with its stream ``id``."""
    count = check_int("count", count, low=1, high=100_000)
    page = run_read(ctx.client, lambda pipe: queue_events(pipe, ctx.job_id, count), take_events)
    return [event.fields() for _, event in reversed(page.entries)]


#: the keys a ``SCAN`` for jobs matches: every key of every job (so a job with checkpoints
#: only, or whose membership keys are gone, is found too)
JOBS_PATTERN = JOBS_KEYS_PATTERN


def _jobs_of(keys: Iterable[Any]) -> set[str]:
    found = set()
    for key in keys:
        job = job_of(key.decode() if isinstance(key, bytes) else str(key))
        if job:
            found.add(job)
    return found


def list_jobs(client: Any) -> list[str]:
    """The ids of every job with a key in this Redis (every primary of a cluster): a ``SCAN``
    in bounded steps, for operators, not hot paths."""
    return sorted(_jobs_of(client.scan_iter(match=JOBS_PATTERN, count=1000)))


def scan_jobs(client: Any, cursor: int = 0, count: int = 1000) -> tuple[int, list[str]]:
    """One ``SCAN`` step of the job list (one Redis, not a cluster: see ``list_jobs``).

    Args:
        client: the Redis.
        cursor: 0 to start a sweep, else the cursor the previous step returned.
        count: the ``COUNT`` hint of the step (keys looked at).

    Returns:
        ``(next cursor, the job ids this step found)``; the sweep is complete when the
        cursor is 0 (a job may be found by more than one step).
    """
    cursor, keys = client.scan(cursor, match=JOBS_PATTERN, count=count)
    return int(cursor), sorted(_jobs_of(keys))


def job_clock(client: Any, job_id: str | None = None) -> tuple[int, int]:
    """Redis' clock, ``(seconds, microseconds)``, on the node holding ``job_id`` (with Redis
    Cluster each node has its own clock; None: any node)."""
    return server_time(client, Keys(job_id or "clock").generation)


# -- batched reads (connection.py: the queue/take convention) ----------------------------------
@dataclass(frozen=True)
class MembershipEvent:
    """One entry of the membership event stream.

    Attributes:
        id: its stream entry id.
        type: ``join``, ``replace``, ``leave`` or ``fail``.
        worker_id: the worker it is about.
        generation: the membership generation it moved to.
        ms: when it happened, ms on Redis' clock.
        last_seen_ms: for ``fail``: the worker's last heartbeat, ms on Redis' clock.
    """

    id: str
    type: str
    worker_id: str
    generation: int
    ms: int
    last_seen_ms: int | None = None

    def fields(self) -> dict[str, str]:
        """The event as stored (``type``, ``worker``, ``generation``, ``ms``, ...), and ``id``."""
        out = {"id": self.id, "type": self.type, "worker": self.worker_id,
               "generation": str(self.generation), "ms": str(self.ms)}  # fmt: skip
        if self.last_seen_ms is not None:
            out["last_seen_ms"] = str(self.last_seen_ms)
        return out


def _event(entry_id: str, f: dict[str, str]) -> MembershipEvent:
    last_seen = f.get("last_seen_ms")
    return MembershipEvent(
        id=entry_id,
        type=f.get("type", ""),
        worker_id=f.get("worker", ""),
        generation=int(f.get("generation", 0)),
        ms=int(f["ms"]) if "ms" in f else int(entry_id.split("-", 1)[0]),
        last_seen_ms=None if last_seen is None else int(float(last_seen)),
    )


def queue_events(pipe: Any, job_id: str, count: int, after: str | None = None) -> None:
    """Queue a read of the newest ``count`` membership events (those after entry ``after``)."""
    queue_stream_page(pipe, Keys(job_id).events, count, after)


def take_events(replies: Replies) -> StreamPage[MembershipEvent]:
    """The events ``queue_events`` read, newest first, and the stream's length."""
    return take_stream_page(replies, _event)


def queue_heartbeats(pipe: Any, job_id: str) -> None:
    """Queue a read of the first ``LIVE_PAGE`` live workers and their last heartbeats."""
    # without zrange()'s score_cast_func round, which takes twice as long at 1,000 workers
    pipe.execute_command("ZRANGE", Keys(job_id).heartbeats, 0, LIVE_PAGE - 1, "WITHSCORES")


def take_heartbeats(replies: Replies, client: Any, job_id: str) -> dict[str, float]:
    """Live worker id -> its last heartbeat, ms on Redis' clock.

    The pages after the first are read here, one bounded ``ZRANGE`` each (a worker that
    moved between pages is listed once).
    """
    first = score_pairs(take_reply(replies))
    beats = zrange_pages(client, Keys(job_id).heartbeats, LIVE_PAGE, first=first, withscores=True)
    return {str(w): float(s) for w, s in beats}


def queue_liveness(pipe: Any, job_id: str, since_ms: int) -> None:
    """Queue a count of the live workers, of those that heartbeated at or after
    ``since_ms`` (Redis' clock), and a read of the newest heartbeat (three O(log N) reads)."""
    beats = Keys(job_id).heartbeats
    pipe.zcard(beats)
    pipe.zcount(beats, since_ms, "+inf")
    pipe.zrange(beats, -1, -1, withscores=True)


def take_liveness(replies: Replies) -> tuple[int, int, int | None]:
    """``(live workers, those fresh since the time asked, the newest heartbeat ms or None)``
    from ``queue_liveness``."""
    live, fresh = int(take_reply(replies)), int(take_reply(replies))
    newest = take_reply(replies)
    return live, fresh, int(float(newest[0][1])) if newest else None


def queue_registered(pipe: Any, job_id: str) -> None:
    """Queue a count of the workers the job has seen (live, failed and left)."""
    pipe.hlen(Keys(job_id).status)


def take_registered(replies: Replies) -> int:
    """The count ``queue_registered`` read."""
    return int(take_reply(replies))


def queue_generation(pipe: Any, job_id: str) -> None:
    """Queue a read of the membership generation."""
    pipe.get(Keys(job_id).generation)


def take_generation(replies: Replies) -> int:
    """The membership generation ``queue_generation`` read (0: none yet)."""
    return int(take_reply(replies) or 0)


def queue_failures(pipe: Any, job_id: str) -> None:
    """Queue a read of the job's failure count (workers declared failed over its life)."""
    pipe.get(Keys(job_id).failures)


def take_failures(replies: Replies) -> int:
    """The failure count ``queue_failures`` read (0: none yet); never goes back, a rejoin
    included."""
    return int(take_reply(replies) or 0)


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def queue_statuses(pipe: Any, job_id: str, worker_ids: Sequence[str]) -> None:
    """Queue a read of the statuses of ``worker_ids`` (one bounded ``HMGET`` per
    ``LIVE_PAGE`` of them)."""
    status = Keys(job_id).status
    for chunk in _chunks(worker_ids, LIVE_PAGE):
        pipe.hmget(status, chunk)


def take_statuses(replies: Replies, worker_ids: Sequence[str]) -> dict[str, str | None]:
    """Worker id -> its status (None: not registered), for the ids ``queue_statuses`` got."""
    out: dict[str, str | None] = {}
    for chunk in _chunks(worker_ids, LIVE_PAGE):
        out.update(zip(chunk, take_reply(replies), strict=True))
    return out


def queue_worker_infos(pipe: Any, job_id: str, worker_ids: Sequence[str]) -> None:
    """Queue a read of what ``worker_ids`` registered with (a page of workers: the caller
    bounds it) and their incarnations."""
    if worker_ids:
        k = Keys(job_id)
        pipe.hmget(k.info, worker_ids)
        pipe.hmget(k.incarnation, worker_ids)


def take_worker_infos(
    replies: Replies,
    worker_ids: Sequence[str],
    statuses: Mapping[str, str | None],
    last_seen_ms: Mapping[str, float],
    now_ms: float,
) -> dict[str, WorkerInfo]:
    """Worker id -> ``WorkerInfo`` for the ids ``queue_worker_infos`` got.

    Args:
        replies: the pipeline's replies.
        worker_ids: the ids given to ``queue_worker_infos``.
        statuses: their statuses (``take_statuses``); a missing one is ``unknown``.
        last_seen_ms: live workers' last heartbeats (``take_heartbeats``).
        now_ms: Redis' time of the read, ms.
    """
    if not worker_ids:
        return {}
    infos, incarnations = take_reply(replies), take_reply(replies)
    return {
        w: _worker_info(w, statuses.get(w), raw, inc, last_seen_ms.get(w), now_ms)
        for w, raw, inc in zip(worker_ids, infos, incarnations, strict=True)
    }

"""The worker registry's reads and its reaper: who is in a job, and declaring the silent failed.

Registration and heartbeats belong to ``Worker`` (``workers.py``); everything here reads the
registry or runs the reaper step, and is what other features call (leases ask who is live,
barriers and heartbeats batch a reaper step with their own call).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..connection import SCAN_STEP, hash_items, is_cluster, server_time, zrange_pages
from ..context import JobContext
from ..keys import PREFIX
from ..scripts import Call, check
from ..validate import check_int

__all__ = [
    "REAP_BATCH",
    "STALL_FRACTION",
    "STATUSES",
    "RedisClock",
    "WorkerInfo",
    "events",
    "list_jobs",
    "live_workers",
    "membership_generation",
    "reap",
    "reap_call",
    "reaped",
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
        pipe.zrange(k.heartbeats, 0, LIVE_PAGE - 1, withscores=True)
        if not cluster:
            pipe.time()
        replies = pipe.execute()
    status, info, incarnation = (
        hash_items(ctx.client, key, first=step)
        for key, step in zip((k.status, k.info, k.incarnation), replies, strict=False)
    )
    last = dict(
        zrange_pages(ctx.client, k.heartbeats, LIVE_PAGE, first=replies[3], withscores=True)
    )
    sec, usec = server_time(ctx.client, k.heartbeats) if cluster else replies[4]
    now_ms = sec * 1000 + usec / 1000
    out = []
    for worker_id in sorted(status):
        meta = orjson.loads(info[worker_id]) if worker_id in info else {}
        seen = last.get(worker_id)
        out.append(
            WorkerInfo(
                worker_id=worker_id,
                status=status[worker_id],
                last_seen_s=None if seen is None else max(0.0, (now_ms - seen) / 1000),
                host=meta.get("host"),
                address=meta.get("address"),
                gpu_count=int(meta.get("gpu_count", 0)),
                labels=dict(meta.get("labels", {})),
                incarnation=int(incarnation.get(worker_id, 0)),
                pid=meta.get("pid"),
            )
        )
    return out


def live_workers(ctx: JobContext) -> list[str]:
    """Ids of the workers that are registered and not failed or left, sorted.

    Read in pages of ``LIVE_PAGE``, so a job of 10^5 workers never holds Redis long for
    this; a worker that joins or leaves during the read may be missed or included (the
    membership generation tells a caller that the set moved)."""
    return sorted(set(zrange_pages(ctx.client, ctx.keys.heartbeats, LIVE_PAGE)))


def membership_generation(ctx: JobContext) -> int:
    """The membership generation: moves by one on every join, leave and failure."""
    return int(ctx.client.get(ctx.keys.generation) or 0)


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
        [k.heartbeats, k.status, k.generation, k.events, k.reaper],
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
    """The newest membership events (join, replace, leave, fail), oldest first."""
    count = check_int("count", count, low=1, high=100_000)
    entries = ctx.client.xrevrange(ctx.keys.events, count=count)
    return [{"id": entry_id, **fields} for entry_id, fields in reversed(entries)]


def list_jobs(client: Any) -> list[str]:
    """The ids of every job with state in this Redis (a ``SCAN``: for operators, not hot paths)."""
    jobs = set()
    for key in client.scan_iter(match=f"{PREFIX}:{{*}}:generation", count=1000):
        start, end = key.index("{") + 1, key.rindex("}")
        jobs.add(key[start:end])
    return sorted(jobs)

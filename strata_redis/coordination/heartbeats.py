"""Batched heartbeats: many workers of one job in one script call, and the background thread.

The background heartbeats of a process's workers are batched: every worker of one job
context that beats at one interval joins that interval's ``HeartbeatGroup``, one thread that
heartbeats them all in one script call (``lua/heartbeat_workers.lua``) and runs one reaper
step with it, so a process running one worker per GPU costs Redis one call per tick, not one
per worker.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import redis

from ..context import JobContext
from ..errors import StateLostError, StrataError, WorkerError, from_status
from ..scripts import Call, check
from ..status import Status
from .registry import RedisClock, reap_call, reaped

if TYPE_CHECKING:
    from .workers import Worker

__all__ = ["HEARTBEAT_BATCH", "HeartbeatGroup", "heartbeat_workers", "heartbeat_workers_call"]

# the workers' logger: a heartbeat is a worker's (``workers.py``)
log = logging.getLogger("strata_redis.workers")

#: workers one batched heartbeat call carries at most: its ``HMGET``s and ``ZADD`` stay well
#: under a millisecond of Redis' time, and its arguments under Lua's ``unpack`` limit
HEARTBEAT_BATCH = 1000
#: worker ids a heartbeat thread's log line names at most (then "and N more")
_NAMED = 10


def _outage(exc: Exception) -> str:
    """What a failed heartbeat tick met, as the heartbeat thread logs it (once per change)."""
    if isinstance(exc, redis.exceptions.MaxConnectionsError):
        # a limit of this process (PoolExhaustedError says which), not of Redis
        return "connection pool limit"
    if isinstance(exc, redis.exceptions.OutOfMemoryError):  # RedisMemoryFullError too
        return "Redis is at its memory limit (maxmemory): writes refused"
    if isinstance(exc, redis.TimeoutError):
        return "Redis did not answer in time"
    if isinstance(exc, redis.ConnectionError):
        return "Redis unreachable"
    return "an unexpected error"


def heartbeat_workers_call(ctx: JobContext, workers: Sequence[Worker]) -> Call:
    """One batched heartbeat of ``workers`` (at most ``HEARTBEAT_BATCH``, all of job ``ctx``)
    as a script call, to batch with other calls; ``batch_verdicts`` reads its raw reply.

    A single worker's is its own ``heartbeat`` call: ``heartbeat_workers`` of one costs Redis
    ~2.5 us more (perf/capacity.py), and both judge a worker alike."""
    if not 0 < len(workers) <= HEARTBEAT_BATCH:
        raise ValueError(f"workers must hold 1..{HEARTBEAT_BATCH} workers, got {len(workers)}")
    if len(workers) == 1 and workers[0].context.job_id == ctx.job_id:
        return workers[0].heartbeat_call()
    for worker in workers:
        if worker.context.job_id != ctx.job_id:
            raise ValueError(f"workers must belong to job {ctx.job_id!r}, got {worker!r}")
    args: list[Any] = [w.worker_id for w in workers] + [w.incarnation for w in workers]
    k = ctx.keys
    return "heartbeat_workers", [k.heartbeats, k.status, k.incarnation], args


def batch_verdicts(
    ctx: JobContext, workers: Sequence[Worker], reply: Sequence[Any]
) -> tuple[int | None, list[StrataError | None]]:
    """``(Redis' time ms, each worker's verdict)`` from the raw reply of a
    ``heartbeat_workers_call``: None for a heartbeat recorded, else the exception a single
    ``heartbeat`` would have raised (the worker failed, left, was replaced, is unknown).
    The time is None when a lone worker's heartbeat was refused (its reply has none)."""
    if len(workers) == 1:  # a lone worker's call is its ``heartbeat``
        try:
            (now_ms,) = check(reply, workers[0]._context)
        except WorkerError as exc:
            return None, [exc]
        return int(now_ms), [None]
    now_ms, *codes = check(reply, {"job_id": ctx.job_id})
    if len(codes) != len(workers):
        raise RuntimeError(f"heartbeat_workers answered {len(codes)} codes for {len(workers)}")
    verdicts: list[StrataError | None] = []
    for worker, code in zip(workers, codes, strict=True):
        status = Status(int(code))
        verdicts.append(None if status is Status.OK else from_status(status, worker._context))
    return int(now_ms), verdicts


def heartbeat_workers(ctx: JobContext, workers: Iterable[Worker]) -> list[StrataError | None]:
    """Heartbeat several workers of one job in one round trip: one script call per
    ``HEARTBEAT_BATCH`` of them (what a process running one worker per GPU sends).

    A worker that was declared failed, left, or was replaced is refused as ``heartbeat``
    refuses it, and never resurrected; the others' heartbeats are recorded all the same.

    Args:
        ctx: the job.
        workers: its workers (``Worker`` handles of this job).

    Returns:
        One verdict per worker, in order: None (heartbeat recorded) or the exception a
        single ``heartbeat`` would have raised (``WorkerFailedError``, ``WorkerLeftError``,
        ``WorkerReplacedError``, ``WorkerNotRegisteredError``).

    Raises:
        StateLostError: the job's state in Redis is not this context's era's.
        ValueError: a worker of another job.
    """
    workers = list(workers)
    if not workers:
        return []
    chunks = [workers[i : i + HEARTBEAT_BATCH] for i in range(0, len(workers), HEARTBEAT_BATCH)]
    replies = ctx.heartbeat_scripts.run_many([heartbeat_workers_call(ctx, c) for c in chunks])
    verdicts: list[StrataError | None] = []
    for chunk, reply in zip(chunks, replies, strict=True):
        verdicts += batch_verdicts(ctx, chunk, reply)[1]
    return verdicts


def _names(workers: Sequence[Worker]) -> str:
    named = ", ".join(repr(w.worker_id) for w in workers[:_NAMED])
    more = len(workers) - _NAMED
    return f"{'worker' if len(workers) == 1 else 'workers'} {named}" + (
        f" and {more} more" if more > 0 else ""
    )


class HeartbeatGroup:
    """The background heartbeats of a job's workers in this process that beat at one
    interval: one thread, one script call per tick for all of them (per ``HEARTBEAT_BATCH``)
    and one reaper step, in one round trip on the context's heartbeat client (a small pool
    of its own, never behind blocking waits). ``Worker.start_heartbeat`` joins it.

    It survives Redis blips (redis-py reconnects on the next tick); a worker it learns was
    declared failed, left, or was replaced leaves the group, gets ``lost`` set and its
    ``on_lost`` called; a lost era stops every worker of the group. Each tick also learns
    the membership generation (the reaper step's reply): every worker keeps it in
    ``generation`` and its ``on_generation`` (if set) is called with it from the thread.
    The thread ends when the group is empty and starts again when a worker joins.
    """

    def __init__(self, ctx: JobContext, interval: float) -> None:
        self.context = ctx
        self.interval = interval
        self._members: dict[Worker, None] = {}  # insertion-ordered set
        self._lock = threading.Lock()  # the members and the thread
        self._tick = threading.Lock()  # held while a tick's calls are in flight
        self._telling = threading.Lock()  # held while a tick's callbacks run
        self._thread: threading.Thread | None = None
        self._clock = RedisClock()

    def __repr__(self) -> str:
        return f"HeartbeatGroup(job={self.context.job_id!r}, interval={self.interval})"

    def add(self, worker: Worker) -> None:
        """Beat ``worker`` from the next tick on (the thread starts if it does not run)."""
        with self._lock:
            self._members[worker] = None
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run,
                    name=f"strata-heartbeat-{self.context.job_id}-{self.interval:g}s",
                    daemon=True,
                )
                self._thread.start()

    def remove(self, worker: Worker, timeout: float = 5.0) -> None:
        """Stop beating ``worker``; wait (up to ``timeout`` s) for a tick in flight."""
        with self._lock:
            self._members.pop(worker, None)
            thread = self._thread
        elsewhere = thread is not None and thread is not threading.current_thread()
        deadline = time.monotonic() + timeout
        for lock in (self._tick, self._telling) if elsewhere else ():
            if lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                lock.release()

    def beating(self, worker: Worker) -> bool:
        """Whether ``worker`` is in the group and its thread runs."""
        with self._lock:
            thread = self._thread
            return worker in self._members and thread is not None and thread.is_alive()

    def _run(self) -> None:
        outage = ""  # what stopped the last tick, logged once until one gets through
        while True:
            # the members are read inside the tick: a worker removed before it is not beaten,
            # and remove() waits for a tick (and its callbacks) that carries the worker
            with self._tick:
                with self._lock:
                    members = list(self._members)
                    if not members:
                        self._thread = None
                        return
                outage, told = self._beat(members, outage)
                self._telling.acquire()  # before the tick ends: remove() never falls between
            # callbacks run after the tick: one may stop another worker's heartbeats
            try:
                for tell in told:
                    try:
                        tell()
                    except Exception:  # one worker's callback never stops the others' beats
                        log.exception("a heartbeat callback failed")
            finally:
                self._telling.release()
            time.sleep(self.interval)

    def _tell_generation(self, worker: Worker, generation: int) -> None:
        """Call ``worker.on_generation`` as it is now, if the worker is still beaten."""
        with self._lock:
            member = worker in self._members
        callback = worker.on_generation
        if member and callback is not None:
            callback(generation)

    def _beat(self, members: list[Worker], outage: str) -> tuple[str, list[Callable[[], None]]]:
        """One tick: every member's heartbeat and a reaper step, in one round trip. Returns
        what it met (``_outage``, "" for a tick that got through) and the callbacks to call."""
        ctx = self.context
        chunks = [members[i : i + HEARTBEAT_BATCH] for i in range(0, len(members), HEARTBEAT_BATCH)]
        try:
            # the reaper step says when it was sent: if Redis stalls before running it,
            # it judges nobody (live workers' heartbeats may be queued behind it)
            sent = time.monotonic()
            replies = ctx.heartbeat_scripts.run_many(
                [*(heartbeat_workers_call(ctx, c) for c in chunks),
                 reap_call(ctx, self._clock.now_ms())]
            )  # fmt: skip
            received = time.monotonic()
            lost: list[tuple[Worker, StrataError]] = []
            for chunk, reply in zip(chunks, replies[:-1], strict=True):
                now_ms, verdicts = batch_verdicts(ctx, chunk, reply)
                lost += [(w, v) for w, v in zip(chunk, verdicts, strict=True) if v is not None]
                if now_ms is not None:
                    self._clock.sample(sent, received, now_ms)
            reaped(ctx, replies[-1])
            generation = int(replies[-1][1])
        except StateLostError as exc:  # the era is gone (or went back): every worker stops
            return "", self._lose([(w, exc) for w in members])
        except Exception as exc:  # the thread must keep beating whatever a tick hits
            what = _outage(exc)
            if what != outage:  # one line per change of state, not one per tick
                if what == "an unexpected error":
                    log.exception("%s: heartbeat tick failed", _names(members))
                else:
                    log.warning(
                        "%s: heartbeats failing (%s: %s); retrying every %.3gs",
                        _names(members), what, exc, self.interval,
                    )  # fmt: skip
            return what, []
        told = self._lose(lost)
        gone = {w for w, _ in lost}
        for worker in members:
            if worker not in gone:
                worker.generation = generation
                if worker.on_generation is not None:
                    told.append(functools.partial(self._tell_generation, worker, generation))
        if outage:
            log.warning("%s: heartbeats recovered (after: %s)", _names(members), outage)
        return "", told

    def _lose(self, lost: Sequence[tuple[Worker, StrataError]]) -> list[Callable[[], None]]:
        """Take the refused workers that are still in the group out, mark them lost; their
        ``on_lost`` callbacks, to call."""
        with self._lock:
            mine = [(w, exc) for w, exc in lost if w in self._members]
            for worker, _ in mine:
                del self._members[worker]
        told: list[Callable[[], None]] = []
        for worker, exc in mine:
            worker.lost = exc
            log.error("worker %r: heartbeat refused, stopping: %s", worker.worker_id, exc)
            if worker.on_lost is not None:
                told.append(functools.partial(worker.on_lost, exc))
        return told

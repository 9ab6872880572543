"""A worker: registering it, heartbeats (by hand or from a background thread), status, leaving.

The background heartbeats of a process's workers are batched: every worker of one job
context that beats at one interval joins that interval's ``HeartbeatGroup``, one thread that
heartbeats them all in one script call (``lua/heartbeat_workers.lua``) and runs one reaper
step with it, so a process running one worker per GPU costs Redis one call per tick, not one
per worker.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import orjson
import redis

from ..context import JobContext
from ..errors import StateLostError, StrataError, WorkerError, from_status
from ..outage import ride_out
from ..scripts import Call, check
from ..status import Status
from ..validate import check_id, check_int, check_seconds
from .lifecycle import open_job
from .registry import SETTABLE_STATUSES, Holder, RedisClock, holder, reap_call, reaped

__all__ = [
    "HEARTBEAT_BATCH",
    "HeartbeatGroup",
    "Worker",
    "heartbeat_workers",
    "heartbeat_workers_call",
    "register_worker",
]

log = logging.getLogger("strata_redis.workers")

#: workers one batched heartbeat call carries at most: its ``HMGET``s and ``ZADD`` stay well
#: under a millisecond of Redis' time, and its arguments under Lua's ``unpack`` limit
HEARTBEAT_BATCH = 1000
#: worker ids a heartbeat thread's log line names at most (then "and N more")
_NAMED = 10


def register_worker(
    ctx: JobContext,
    worker_id: str,
    *,
    host: str | None = None,
    address: str | None = None,
    gpu_count: int = 0,
    labels: Mapping[str, str] | None = None,
    replace: bool = False,
    heartbeat_interval: float | None = 2.0,
    on_lost: Callable[[StrataError], None] | None = None,
) -> Worker:
    """Register a worker (or re-register one that failed or left) and start heartbeats.

    A live registration of the id (its holder) is taken over when it is stale: its last
    heartbeat older than the job's heartbeat timeout (judged on Redis' clock, in the same
    script as the takeover), or its process gone on this host (same pid space: the process
    recorded at its registration, pid and start time, no longer runs). So a dead rank
    relaunched at once under its id takes its place; a holder that looks alive is refused,
    unless ``replace`` is set. A takeover supersedes the holder's incarnation, as
    ``replace=True`` does: its heartbeats, rendezvous calls and leave are refused
    (``WorkerReplacedError``).

    Args:
        ctx: the job.
        worker_id: the worker's id (see ``strata_redis.validate`` for what is allowed).
        host, address: where it runs, for people reading the state (``host`` default:
            this machine's host name). The registering process is recorded too (pid, start
            time, pid space), so a refused duplicate can name the live holder and a later
            registration on this host can tell that this process is gone.
        gpu_count: GPUs it has (0..1024).
        labels: free-form str -> str labels.
        replace: take over the id even if its holder looks alive (a restarted process
            whose old self may still be running).
        heartbeat_interval: seconds between background heartbeats; ``None`` for none
            (then call ``heartbeat()`` yourself more often than the timeout).
        on_lost: called from the heartbeat thread if the worker is declared failed.

    Returns:
        The worker handle; its ``incarnation`` is the new membership generation.

    Raises:
        WorkerExistsError: the id is registered, its holder looks alive (a fresh heartbeat,
            and its process running here or on another host), and ``replace`` is false (the
            message names the holder's host and pid and says how to take it over; the
            holder is untouched).
        RedisMemoryFullError: Redis refused writes at its memory limit for longer than the
            job's ``redis_retry`` (a shorter refusal is waited out).
        RedisUnavailableError: Redis could not be reached for longer than ``redis_retry``
            (a shorter restart or failover is waited out, and the registration sent again).
        ValueError, TypeError: a bad argument, named in the message.
    """
    check_id("worker_id", worker_id)
    gpu_count = check_int("gpu_count", gpu_count, low=0, high=1024)
    pid = os.getpid()
    info = {
        "host": socket.gethostname() if host is None else _optional_text("host", host),
        "address": _optional_text("address", address),
        "gpu_count": gpu_count,
        "labels": _labels(labels),
        "pid": pid,
        "started": _started(pid),
        "space": _pid_space(),
        # this registration's own mark: a send whose reply was lost with the connection
        # may have applied; the next send, finding the id held by this mark, knows it was
        # itself (and takes the id from its unanswered self, not from someone else)
        "attempt": secrets.token_hex(8),
    }
    if heartbeat_interval is not None:
        check_seconds("heartbeat_interval", heartbeat_interval, high=ctx.heartbeat_timeout)
    # the job's record: made by its first registration; an ended job is opened again
    what = f"registration of worker {worker_id!r}"
    ride_out(ctx, what, open_job, ctx)  # (opening an open job again changes nothing)
    k = ctx.keys
    timeout_ms = int(ctx.heartbeat_timeout * 1000)

    def call(gone: str) -> Any:
        # waited out and sent again after a restart, failover or memory limit: a refused
        # script applied nothing, and a send whose reply was lost with its connection is
        # known by its mark (``info['attempt']``, random per call) when the next one finds it
        return ride_out(
            ctx, what, ctx.scripts.call, "register_worker",
            [k.heartbeats, k.status, k.incarnation, k.info, k.generation, k.events, k.reaper],
            [worker_id, orjson.dumps(info), "1" if replace else "0", ctx.events_cap,
             timeout_ms, gone],
        )  # fmt: skip

    reply = call("")
    ids: dict[str, Any] = {"job_id": ctx.job_id, "worker_id": worker_id}
    mine: int | None = None  # the incarnation of this call's own send, its reply lost
    for retry in (True, False):
        if int(reply[0]) != Status.WORKER_EXISTS:
            break
        held = holder(reply[1])
        if held.attempt == info["attempt"]:
            mine = int(reply[2])
            break
        process = _process_state(held)
        if retry and process == _GONE:  # take the id, unless it was registered anew since
            reply = call(str(reply[2]))
            continue
        ids.update(
            holder=(held.host, held.pid), last_seen_s=int(reply[3]) / 1000,
            timeout_s=ctx.heartbeat_timeout, process=process,
        )  # fmt: skip
        break
    generation, how = (mine, "itself") if mine is not None else _joined(reply, ids)
    if how in ("gone", "stale"):
        log.warning(
            "worker %r of job %r: took the id over from its previous holder, %s (incarnation "
            "%s); that holder is refused from now on",
            worker_id, ctx.job_id,
            "whose process is gone on this host" if how == "gone"
            else "silent past the heartbeat timeout", generation,
        )  # fmt: skip
    worker = Worker(ctx, worker_id, int(generation), on_lost=on_lost)
    if heartbeat_interval is not None:
        worker.start_heartbeat(heartbeat_interval)
    return worker


def _joined(reply: Any, ids: dict[str, Any]) -> tuple[int, str]:
    """The incarnation and the ``how`` of a registration's reply (its refusal raised)."""
    generation, _now, how = check(reply, ids)
    return int(generation), str(how)


# -- the registering process: is a holder's process still running? ----------------------------
#: ``_process_state`` of a holder whose process no longer runs (on this host)
_GONE = "its process is gone on this host"


def _proc(pid: int) -> tuple[str, int] | None:
    """The state letter and start time of process ``pid`` (``/proc/<pid>/stat`` fields 3 and
    22: the start in clock ticks since boot), or None where it cannot be read (no such
    process, no ``/proc``). With the pid, the start time names one process: a pid is given
    again to a later process, the pair is not."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may hold ")"
    try:
        return fields[0], int(fields[19])  # the list starts at field 3
    except (IndexError, ValueError):
        return None


def _started(pid: int) -> int | None:
    """The start time of process ``pid`` (``_proc``), or None where unknown."""
    proc = _proc(pid)
    return None if proc is None else proc[1]


@functools.cache
def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _pid_space() -> str | None:
    """The pid space this process's pid is valid in: the kernel's boot id and this process's
    pid namespace (Linux), or None where unknown. Two processes with the same space can ask
    the kernel about each other's pids; two containers sharing a host name may not."""
    boot = _boot_id()
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{namespace}" if boot else None


def _process_state(held: Holder) -> str:
    """What this process can tell of a holder's process: ``_GONE``, or a phrase for the
    refusal's message ("its process is running on this host", "not checked: ...").

    The same pid space (or, where neither side recorded one, the same host name) is needed
    to ask about the pid at all; the pid's start time, when recorded, tells the holder from
    a later process given the same pid."""
    if held.pid is None:
        return ""
    mine = _pid_space()
    if held.space is not None or mine is not None:
        here = held.space == mine
    else:  # neither side knows its pid space (not Linux): the host name
        here = held.host == socket.gethostname()
    if not here:
        return (
            "its process was not checked: it ran on another host, or in another pid space "
            "on this one (a container), or did not record its pid space"
        )
    if os.name != "posix":  # on Windows, os.kill would end the process
        return "its process was not checked"
    try:
        os.kill(held.pid, 0)
    except ProcessLookupError:
        return _GONE
    except PermissionError:
        pass  # it runs, as another user
    proc = _proc(held.pid)
    if proc is not None and proc[0] in ("Z", "X"):
        return _GONE  # dead, its exit status not yet collected by its parent
    if proc is not None and held.started is not None and proc[1] != held.started:
        return _GONE  # the pid was given to a later process
    return "its process is running on this host"


def _optional_text(arg: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{arg} must be a str or None, got {type(value).__name__} {value!r}")
    if len(value) > 1024:
        raise ValueError(f"{arg} must be at most 1024 characters, got {len(value)}")
    return value


def _labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise TypeError(f"labels must be a mapping of str to str, got {type(labels).__name__}")
    out = {}
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"labels must map str to str, got {key!r}: {value!r}")
        out[key] = value
    if len(orjson.dumps(out)) > 16_384:
        raise ValueError("labels must serialize to at most 16 KiB")
    return out


class Worker:
    """A registered worker of a job. Made by ``register_worker`` (``Job.register_worker``).

    Background heartbeats (started by default) come from the heartbeat thread of its
    context's ``HeartbeatGroup`` for its interval, shared with the job's other workers in this
    process at that interval: every ``interval`` seconds one round trip carries all their
    heartbeats (one script call) and a reaper step, through the context's heartbeat client (a
    small pool of its own, never behind blocking waits). It survives Redis blips (redis-py
    reconnects on the next tick). If it learns that this worker was declared failed, left, or
    was replaced, it stops beating it, sets ``lost`` and calls ``on_lost``.

    Each tick also learns the membership generation (the reaper step's reply): it is kept in
    ``generation``, and ``on_generation`` (if set) is called with it from the thread, so a
    feature can notice a membership change with no round trip of its own.
    """

    def __init__(
        self,
        ctx: JobContext,
        worker_id: str,
        incarnation: int,
        *,
        on_lost: Callable[[StrataError], None] | None = None,
    ) -> None:
        self.context = ctx
        self.worker_id = worker_id
        self.incarnation = incarnation
        self.on_lost = on_lost
        self.lost: StrataError | None = None
        self.generation = incarnation
        self.on_generation: Callable[[int], None] | None = None
        self._group: HeartbeatGroup | None = None

    def __repr__(self) -> str:
        job, incarnation = self.context.job_id, self.incarnation
        return f"Worker({self.worker_id!r}, job={job!r}, incarnation={incarnation})"

    @property
    def _context(self) -> dict[str, Any]:
        return {"job_id": self.context.job_id, "worker_id": self.worker_id}

    def heartbeat_call(self, status: str = "") -> tuple[str, list[str], list[Any]]:
        """This worker's heartbeat as a script call, to batch with other calls.

        Its raw reply goes through ``scripts.check`` (which raises as ``heartbeat`` does).
        """
        k = self.context.keys
        return (
            "heartbeat",
            [k.heartbeats, k.status, k.incarnation],
            [self.worker_id, self.incarnation, status],
        )

    def heartbeat(self) -> None:
        """Record that this worker is alive, now, on Redis' clock.

        Raises:
            WorkerFailedError: the reaper declared it failed; register again to rejoin.
            WorkerLeftError, WorkerReplacedError, WorkerNotRegisteredError: likewise.
        """
        self.context.heartbeat_scripts.run(*self.heartbeat_call(), self._context)

    def set_status(self, status: str) -> None:
        """Set ``idle``, ``training`` or ``checkpointing`` (also counts as a heartbeat).

        Raises:
            ValueError: another status.
            WorkerError: as for ``heartbeat``.
        """
        if status not in SETTABLE_STATUSES:
            raise ValueError(f"status must be one of {SETTABLE_STATUSES}, got {status!r}")
        self.context.heartbeat_scripts.run(*self.heartbeat_call(status), self._context)

    def deregister(self) -> None:
        """Leave the job gracefully: status ``left``, and the membership generation moves.

        Raises:
            WorkerError: it is not registered, failed, already left, or was replaced.
        """
        self.stop_heartbeat()
        k = self.context.keys
        self.context.scripts.run(
            "deregister_worker",
            [k.heartbeats, k.status, k.incarnation, k.generation, k.events],
            [self.worker_id, self.incarnation, self.context.events_cap],
            self._context,
        )

    # -- background heartbeats ---------------------------------------------------------
    def start_heartbeat(self, interval: float = 2.0) -> None:
        """Start background heartbeats (no-op if they run).

        The worker joins its context's ``HeartbeatGroup`` for ``interval``: one thread beats
        every worker of the group in one script call per tick.

        Args:
            interval: seconds between heartbeats; must be below the job's heartbeat timeout.
        """
        interval = check_seconds("heartbeat_interval", interval, high=3600)
        if interval >= self.context.heartbeat_timeout:
            raise ValueError(
                f"heartbeat_interval must be below the job's heartbeat_timeout "
                f"({self.context.heartbeat_timeout}s), got {interval}"
            )
        if self.heartbeating:
            return
        ctx = self.context
        group = ctx.memo(f"heartbeat-group:{interval!r}", lambda: HeartbeatGroup(ctx, interval))
        self._group = group
        group.add(self)

    def stop_heartbeat(self, timeout: float = 5.0) -> None:
        """Stop background heartbeats; a tick in flight that carries this worker is waited
        for (up to ``timeout`` seconds), so none is sent after this returns."""
        group, self._group = self._group, None
        if group is not None:
            group.remove(self, timeout)

    @property
    def heartbeating(self) -> bool:
        """Whether background heartbeats run for this worker."""
        group = self._group
        return group is not None and group.beating(self)

    def __enter__(self) -> Worker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.leave()

    def leave(self) -> None:
        """Stop heartbeats and deregister, unless it is already out; never raises.

        What a ``with`` block or a closing facade does on the way out: a worker that was
        declared failed, or that Redis cannot reach now, is logged, not raised.
        """
        self.stop_heartbeat()
        if self.lost is None:
            try:
                self.deregister()
            except (WorkerError, redis.RedisError) as err:
                log.info("worker %r: not deregistered on exit: %s", self.worker_id, err)


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


# -- batched heartbeats ------------------------------------------------------------------------
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

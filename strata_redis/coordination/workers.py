"""A worker: registering it, its heartbeat, status, leaving.

Its background heartbeats come from its context's ``HeartbeatGroup`` (``heartbeats.py``:
the batched heartbeats of a process's workers, one thread per interval).
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import socket
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import orjson
import redis

from ..context import JobContext
from ..errors import StrataError, WorkerError
from ..outage import ride_out
from ..scripts import check
from ..status import Status
from ..validate import check_id, check_int, check_seconds
from .heartbeats import HeartbeatGroup
from .lifecycle import open_job
from .registry import SETTABLE_STATUSES, Holder, holder

__all__ = ["Worker", "register_worker"]

log = logging.getLogger("strata_redis.workers")


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

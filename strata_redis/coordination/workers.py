"""A worker: registering it, heartbeats (by hand or from a background thread), status, leaving."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import orjson
import redis

from ..context import JobContext
from ..errors import StateLostError, StrataError, WorkerError
from ..scripts import check
from ..status import Status
from ..validate import check_id, check_int, check_seconds
from .lifecycle import open_job
from .registry import SETTABLE_STATUSES, RedisClock, holder, reap_call, reaped

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

    Args:
        ctx: the job.
        worker_id: the worker's id (see ``strata_redis.validate`` for what is allowed).
        host, address: where it runs, for people reading the state (``host`` default:
            this machine's host name). The registering process's pid is recorded too, so
            a refused duplicate can name the live holder.
        gpu_count: GPUs it has (0..1024).
        labels: free-form str -> str labels.
        replace: take over the id if it is registered and alive (a restarted process).
        heartbeat_interval: seconds between background heartbeats; ``None`` for none
            (then call ``heartbeat()`` yourself more often than the timeout).
        on_lost: called from the heartbeat thread if the worker is declared failed.

    Returns:
        The worker handle; its ``incarnation`` is the new membership generation.

    Raises:
        WorkerExistsError: the id is registered and alive, and ``replace`` is false (the
            message names the holder's host and pid; the holder is untouched).
        ValueError, TypeError: a bad argument, named in the message.
    """
    check_id("worker_id", worker_id)
    gpu_count = check_int("gpu_count", gpu_count, low=0, high=1024)
    info = {
        "host": socket.gethostname() if host is None else _optional_text("host", host),
        "address": _optional_text("address", address),
        "gpu_count": gpu_count,
        "labels": _labels(labels),
        "pid": os.getpid(),
    }
    if heartbeat_interval is not None:
        check_seconds("heartbeat_interval", heartbeat_interval, high=ctx.heartbeat_timeout)
    # the job's record: made by its first registration; an ended job is opened again
    open_job(ctx)
    k = ctx.keys
    reply = ctx.scripts.call(
        "register_worker",
        [k.heartbeats, k.status, k.incarnation, k.info, k.generation, k.events],
        [worker_id, orjson.dumps(info), "1" if replace else "0", ctx.events_cap],
    )
    ids: dict[str, Any] = {"job_id": ctx.job_id, "worker_id": worker_id}
    if int(reply[0]) == Status.WORKER_EXISTS:
        ids["holder"] = holder(reply[1])
    generation, _now = check(reply, ids)
    worker = Worker(ctx, worker_id, int(generation), on_lost=on_lost)
    if heartbeat_interval is not None:
        worker.start_heartbeat(heartbeat_interval)
    return worker


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

    The background heartbeat thread (started by default) sends a heartbeat every
    ``interval`` seconds and runs the reaper step in the same round trip, through the
    context's heartbeat client (a small pool of its own, never behind blocking waits). It
    survives Redis blips (redis-py reconnects on the next tick). If it learns that this
    worker was declared failed, left, or was replaced, it stops, sets ``lost`` and calls
    ``on_lost``.

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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._clock = RedisClock()

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
        """Start the background heartbeat thread (no-op if it runs).

        Args:
            interval: seconds between heartbeats; must be below the job's heartbeat timeout.
        """
        interval = check_seconds("heartbeat_interval", interval, high=3600)
        if interval >= self.context.heartbeat_timeout:
            raise ValueError(
                f"heartbeat_interval must be below the job's heartbeat_timeout "
                f"({self.context.heartbeat_timeout}s), got {interval}"
            )
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._beat,
            args=(interval,),
            name=f"strata-heartbeat-{self.worker_id}",
            daemon=True,
        )
        self._thread.start()

    def stop_heartbeat(self, timeout: float = 5.0) -> None:
        """Stop the background heartbeat thread and wait for it."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None

    @property
    def heartbeating(self) -> bool:
        """Whether the background heartbeat thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def _beat(self, interval: float) -> None:
        # heartbeats go through the heartbeat client: a pool of their own, so they never
        # wait for a connection behind this process's blocking barrier/checkpoint waits
        outage = ""  # what stopped the last heartbeat, logged once until one gets through
        while not self._stop.is_set():
            try:
                # the reaper step says when it was sent: if Redis stalls before running it,
                # it judges nobody (live workers' heartbeats may be queued behind it)
                sent = time.monotonic()
                beat, reply = self.context.heartbeat_scripts.run_many(
                    [self.heartbeat_call(), reap_call(self.context, self._clock.now_ms())]
                )
                (now_ms,) = check(beat, self._context)
                self._clock.sample(sent, time.monotonic(), int(now_ms))
                reaped(self.context, reply)
                self.generation = int(reply[1])
                if self.on_generation is not None:
                    self.on_generation(self.generation)
                if outage:
                    log.warning(
                        "worker %r: heartbeats recovered (after: %s)", self.worker_id, outage
                    )
                    outage = ""
            except (WorkerError, StateLostError) as exc:
                self.lost = exc
                log.error("worker %r: heartbeat refused, stopping: %s", self.worker_id, exc)
                if self.on_lost is not None:
                    self.on_lost(exc)
                return
            except Exception as exc:  # the thread must keep beating whatever a tick hits
                what = _outage(exc)
                if what != outage:  # one line per change of state, not one per tick
                    if what == "an unexpected error":
                        log.exception("worker %r: heartbeat tick failed", self.worker_id)
                    else:
                        log.warning(
                            "worker %r: heartbeats failing (%s: %s); retrying every %.3gs",
                            self.worker_id, what, exc, interval,
                        )  # fmt: skip
                    outage = what
            self._stop.wait(interval)

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

"""One registered worker: heartbeats (by hand or from a background thread), status, leaving."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

import redis

from .errors import StrataError, WorkerError
from .scripts import check
from .validate import check_seconds

if TYPE_CHECKING:
    from .job import Job

log = logging.getLogger("strata_redis.workers")

#: statuses a live worker may set; ``failed`` and ``left`` are set by the reaper and ``deregister``.
SETTABLE_STATUSES = ("idle", "training", "checkpointing")
STATUSES = (*SETTABLE_STATUSES, "failed", "left")


@dataclass(frozen=True)
class WorkerInfo:
    """A worker as ``Job.workers()`` reports it.

    Attributes:
        worker_id: the id it registered with.
        status: ``idle``, ``training``, ``checkpointing``, ``failed`` or ``left``.
        last_seen_s: seconds since its last heartbeat, on Redis' clock (None once failed/left).
        host, address, gpu_count, labels: what it registered with.
        incarnation: the membership generation of its latest registration.
    """

    worker_id: str
    status: str
    last_seen_s: float | None
    host: str | None = None
    address: str | None = None
    gpu_count: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    incarnation: int = 0


class Worker:
    """A registered worker of a job. Made by ``Job.register_worker``.

    The background heartbeat thread (started by default) sends a heartbeat every
    ``interval`` seconds and runs the reaper step in the same round trip. It survives Redis
    blips (redis-py reconnects on the next tick). If it learns that this worker was declared
    failed, left, or was replaced, it stops, sets ``lost`` and calls ``on_lost``.
    """

    def __init__(
        self,
        job: Job,
        worker_id: str,
        incarnation: int,
        *,
        on_lost: Callable[[StrataError], None] | None = None,
    ) -> None:
        self.job = job
        self.worker_id = worker_id
        self.incarnation = incarnation
        self.on_lost = on_lost
        self.lost: StrataError | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return (
            f"Worker({self.worker_id!r}, job={self.job.job_id!r}, incarnation={self.incarnation})"
        )

    @property
    def _context(self) -> dict[str, Any]:
        return {"job_id": self.job.job_id, "worker_id": self.worker_id}

    def _heartbeat_args(self, status: str = "") -> tuple[list[str], list[Any]]:
        k = self.job.keys
        return [k.heartbeats, k.status, k.incarnation], [self.worker_id, self.incarnation, status]

    def heartbeat(self) -> None:
        """Record that this worker is alive, now, on Redis' clock.

        Raises:
            WorkerFailedError: the reaper declared it failed; register again to rejoin.
            WorkerLeftError, WorkerReplacedError, WorkerNotRegisteredError: likewise.
        """
        keys, args = self._heartbeat_args()
        self.job.scripts.run("heartbeat", keys, args, self._context)

    def set_status(self, status: str) -> None:
        """Set ``idle``, ``training`` or ``checkpointing`` (also counts as a heartbeat).

        Raises:
            ValueError: another status.
            WorkerError: as for ``heartbeat``.
        """
        if status not in SETTABLE_STATUSES:
            raise ValueError(f"status must be one of {SETTABLE_STATUSES}, got {status!r}")
        keys, args = self._heartbeat_args(status)
        self.job.scripts.run("heartbeat", keys, args, self._context)

    def deregister(self) -> None:
        """Leave the job gracefully: status ``left``, and the membership generation moves.

        Raises:
            WorkerError: it is not registered, failed, already left, or was replaced.
        """
        self.stop_heartbeat()
        k = self.job.keys
        self.job.scripts.run(
            "deregister_worker",
            [k.heartbeats, k.status, k.incarnation, k.generation, k.events],
            [self.worker_id, self.incarnation, self.job.events_cap],
            self._context,
        )

    # -- background heartbeats ---------------------------------------------------------
    def start_heartbeat(self, interval: float = 2.0) -> None:
        """Start the background heartbeat thread (no-op if it runs).

        Args:
            interval: seconds between heartbeats; must be below the job's heartbeat timeout.
        """
        interval = check_seconds("interval", interval, high=3600)
        if interval >= self.job.heartbeat_timeout:
            raise ValueError(
                f"interval must be below the job's heartbeat_timeout "
                f"({self.job.heartbeat_timeout}s), got {interval}"
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
        outage = False
        while not self._stop.is_set():
            try:
                keys, args = self._heartbeat_args()
                beat, reaped = self.job.scripts.run_many(
                    [("heartbeat", keys, args), self.job.reap_call()]
                )
                check(beat, self._context)
                self.job.check_reaped(reaped)
                if outage:
                    log.warning(
                        "worker %r: Redis reachable again, heartbeats resumed", self.worker_id
                    )
                    outage = False
            except WorkerError as exc:
                self.lost = exc
                log.error("worker %r: heartbeat refused, stopping: %s", self.worker_id, exc)
                if self.on_lost is not None:
                    self.on_lost(exc)
                return
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if not outage:
                    log.warning("worker %r: Redis unreachable (%s); retrying", self.worker_id, exc)
                    outage = True
            except Exception:  # the thread must keep beating whatever a tick hits
                log.exception("worker %r: heartbeat tick failed", self.worker_id)
            self._stop.wait(interval)

    def __enter__(self) -> Worker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_heartbeat()
        if self.lost is None:
            try:
                self.deregister()
            except WorkerError as err:
                log.info("worker %r: not deregistered on exit: %s", self.worker_id, err)

"""The status a worker shows: "checkpointing" while saves are in flight, else its loop's."""

from __future__ import annotations

import contextlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import redis as redis_py
from redis.exceptions import OutOfMemoryError

from ..coordination.workers import Worker

# the loop's logger, for every module of the loop (``docs/reference/environment.md``)
log = logging.getLogger("strata_redis.orchestrator")


class ShownStatus:
    """The status shown for one worker (its registry record's): "checkpointing" while saves
    are in flight, else the loop's ("training", "idle"). Saves change it off the loop's
    thread, through a status thread of its own, so the loop never waits on a status write.

    Args:
        worker_id: the worker, for the log.
    """

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.worker: Worker | None = None  # set once registered
        self._status = self._loop_status = "idle"  # as registered
        self._saving = 0
        self._lock = threading.Lock()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="strata-status")

    def set(self, status: str | None = None) -> None:
        """Record the loop's status (None: keep it) and write the status to show, unless it
        is written already. Writers hold the lock, so the last write is the newest status."""
        with self._lock:
            if status is not None:
                self._loop_status = status
            shown = "checkpointing" if self._saving else self._loop_status
            if shown == self._status:
                return
            try:
                assert self.worker is not None
                self.worker.set_status(shown)
                self._status = shown
            except (redis_py.ConnectionError, redis_py.TimeoutError, OutOfMemoryError) as exc:
                # best effort: the call that needs Redis next says what is wrong, once
                log.info("worker %r: status %r not recorded: %s", self.worker_id, shown, exc)

    def saves_changed(self, by: int) -> None:
        """A save began (+1) or ended (-1): the status thread writes the status to show."""
        with self._lock:
            self._saving += by
        with contextlib.suppress(RuntimeError):  # closed: the worker leaves, status and all
            self._writer.submit(self._write)

    def _write(self) -> None:
        """``set`` on the status thread, where nobody waits for an error: log it (the loop's
        next call to Redis meets whatever is wrong)."""
        try:
            self.set()
        except Exception as exc:
            log.warning("worker %r: status not recorded: %s", self.worker_id, exc)

    def close(self) -> None:
        """Wait for the status writes queued, and take no more."""
        self._writer.shutdown(wait=True)

"""The barrier latency record: one entry per release, capped, written off the waiters' path."""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Final

from ..connection import Replies, StreamPage, queue_stream_page, run_read, take_stream_page
from ..context import JobContext
from ..keys import Keys
from ..validate import check_int

log = logging.getLogger("strata_redis.barrier")

LATENCY_CAP: Final = 10_000


@dataclass(frozen=True)
class BarrierLatency:
    """One release in the job's latency record (``barrier_latencies``).

    Attributes:
        barrier: the barrier's name.
        generation: the generation that released.
        participants: how many workers arrived.
        release_ms: from the release (the last arrival, on Redis' clock) until the first
            arrival's waiter woke: the broadcast latency a waiter sees.
        wait_ms: from the first arrival to the release (how long the barrier stalled).
        at_ms: when the release happened, ms on Redis' clock.
    """

    barrier: str
    generation: int
    participants: int
    release_ms: float
    wait_ms: float
    at_ms: int


class _LatencyRecorder:
    """Writes the latency record from a background thread, off every waiter's path.

    A write on the waiter's path would hold the first arrival back by one more round trip
    (with many threads in one process, behind all of their wake-ups). Records are dropped
    when the queue is full (Redis unreachable); what is queued is written before exit.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[JobContext, dict[str, Any]]] = queue.Queue(LATENCY_CAP)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, ctx: JobContext, fields: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait((ctx, fields))
        except queue.Full:
            log.warning("barrier latency record full; dropping a record")
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="strata-barrier-latency", daemon=True
                )
                self._thread.start()

    def flush(self, timeout: float = 5.0) -> None:
        """Wait (at most ``timeout`` s) until every queued record is written."""
        deadline = time.monotonic() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return
                self._queue.all_tasks_done.wait(left)

    def _run(self) -> None:
        while True:
            ctx, fields = self._queue.get()
            try:
                ctx.client.xadd(
                    ctx.keys.barrier_latency, fields, maxlen=LATENCY_CAP, approximate=True
                )
            # a metric, best effort (the barrier itself did release); also a client closed
            # meanwhile, which a cluster client reports as an AttributeError: never die here
            except Exception as exc:
                log.warning("barrier %r: latency not recorded: %s", fields["barrier"], exc)
            finally:
                self._queue.task_done()


RECORDER = _LatencyRecorder()
atexit.register(RECORDER.flush, 2.0)


def barrier_latencies(ctx: JobContext, count: int = 1000) -> list[BarrierLatency]:
    """The newest barrier releases with their latencies, oldest first (for the dashboard).

    Args:
        ctx: the job.
        count: at most this many (the record keeps about the last 10,000).

    Returns:
        One ``BarrierLatency`` per release.
    """
    count = check_int("count", count, low=1, high=LATENCY_CAP)
    RECORDER.flush()  # this process's own records first
    page = run_read(
        ctx.client, lambda pipe: queue_latencies(pipe, ctx.job_id, count), take_latencies
    )
    return [latency for _, latency in reversed(page.entries)]


def _latency(_entry_id: str, f: dict[str, str]) -> BarrierLatency:
    return BarrierLatency(
        barrier=f["barrier"],
        generation=int(f["generation"]),
        participants=int(f["participants"]),
        release_ms=int(f["release_us"]) / 1000,
        wait_ms=int(f["wait_us"]) / 1000,
        at_ms=int(f["at_ms"]),
    )


def queue_latencies(pipe: Any, job_id: str, count: int, after: str | None = None) -> None:
    """Queue a read of the newest ``count`` barrier releases (those after entry ``after``)
    and the record's length (a batched read; connection.py: the queue/take convention)."""
    queue_stream_page(pipe, Keys(job_id).barrier_latency, count, after)


def take_latencies(replies: Replies) -> StreamPage[BarrierLatency]:
    """The releases ``queue_latencies`` read, newest first, and the record's length."""
    return take_stream_page(replies, _latency)

"""Training progress on the dashboard: samples/s of a job and of each worker, the epoch's
ETA and the slowest live worker, from the lifetime lease counts ``state.py`` read.

The counts never reset (``leases.LeaseTotals``); the rates are their deltas between
reads, kept per job by ``TrainedHistory`` over ``RATE_WINDOW_S``, so the first read has
none, nor has one after a gap longer than the window (no recent data: a rate over however
long nobody looked would be an average of the past). No Redis here.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Final

from strata_redis.data.record import LeaseTotals
from strata_redis.data.sharding import DatasetParams

from .snapshot import CommittedCheckpoint, DatasetTraining, ShardCounts, Training, WorkerRate

#: samples/s are the deltas of the samples trained over at most this many seconds
RATE_WINDOW_S: Final = 20.0
#: points of the samples trained kept per job at least this far apart (seconds)
RATE_STEP_S: Final = 1.0


class TrainedHistory:
    """One job's samples trained as documents read them: ``(ms, job total, live workers'
    totals)`` points at least ``RATE_STEP_S`` apart over the last ``RATE_WINDOW_S`` (so at
    most about 21 points, each bounded by the live workers), for samples/s by deltas."""

    def __init__(self) -> None:
        self.points: deque[tuple[int, int, dict[str, int]]] = deque()
        self._lock = threading.Lock()  # reads of one job run on several server threads

    def rates(
        self, now_ms: int, total: int, workers: dict[str, int]
    ) -> tuple[float | None, float | None, dict[str, float | None]]:
        """``(job samples/s, seconds it spans, worker -> samples/s)`` from the oldest point
        of the window to this reading (None: no point a second or more older and at most
        ``RATE_WINDOW_S + RATE_STEP_S`` old, or, for a worker, none that has it), then this
        reading is kept if it is due."""
        with self._lock:
            return self._rates(now_ms, total, workers)

    def _rates(
        self, now_ms: int, total: int, workers: dict[str, int]
    ) -> tuple[float | None, float | None, dict[str, float | None]]:
        points = self.points
        if points and (total < points[-1][1] or now_ms < points[-1][0]):
            points.clear()  # the counts or the clock went back (state lost): start over
        while len(points) > 1 and now_ms - points[1][0] >= RATE_WINDOW_S * 1000:
            points.popleft()
        # the window is bounded: a point older than it plus one step (nothing read since)
        # gives no rate rather than one over the whole gap; a younger point still does
        while points and now_ms - points[0][0] > (RATE_WINDOW_S + RATE_STEP_S) * 1000:
            points.popleft()
        rate: float | None = None
        span: float | None = None
        per: dict[str, float | None] = dict.fromkeys(workers)
        if points and now_ms - points[0][0] >= 1000:
            span = (now_ms - points[0][0]) / 1000
            rate = round((total - points[0][1]) / span, 3)
            for w, samples in workers.items():
                for at, _, then in points:
                    if w in then and now_ms - at >= 1000:
                        per[w] = round(max(0, samples - then[w]) / ((now_ms - at) / 1000), 3)
                        break
        if not points or now_ms - points[-1][0] >= RATE_STEP_S * 1000:
            points.append((now_ms, total, dict(workers)))
        return rate, span, per


def training(
    now_ms: int,
    history: TrainedHistory,
    *,
    epoch: int,
    live: Sequence[str],
    beats: Mapping[str, float],
    timeout_s: float,
    page: set[str],
    datasets: Sequence[DatasetParams],
    progress: Mapping[str, ShardCounts],
    totals: Mapping[str, LeaseTotals],
    checkpoints: Sequence[CommittedCheckpoint],
) -> Training:
    """The job's training progress (``schema.json``'s ``jobs[].progress``).

    With no live worker heartbeating within the timeout (all silent, or none left) there is
    no rate and no ETA: the counts' deltas over the window would still show the speed of
    workers that may be dead. A silent worker has no rate of its own either, and is never
    the slowest; at a tie for the lowest rate no worker is.

    Args:
        now_ms: Redis' time of the reading.
        history: the job's kept points (this reading is added when due).
        epoch: the job's current epoch.
        live: the live workers, sorted.
        beats: worker -> its last heartbeat, ms on Redis' clock.
        timeout_s: the job's heartbeat timeout; a worker silent longer is never "slowest"
            (nor is any once the epoch has nothing left to train).
        page: the workers of the requested page (listed with the slowest one).
        datasets: the job's datasets.
        progress: dataset -> its epoch's shard counts.
        totals: dataset -> its lifetime lease counts.
        checkpoints: the committed checkpoints, newest first.
    """
    total = sum(t.samples for t in totals.values())
    mine = dict.fromkeys(live, 0)
    for t in totals.values():
        for w, samples in t.by_worker.items():
            mine[w] += samples
    rate, span, per = history.rates(now_ms, total, mine)
    cutoff = now_ms - timeout_s * 1000
    fresh = {w for w in live if beats[w] >= cutoff}
    if not fresh:  # nobody heartbeats: the window's deltas are the speed of the departed
        rate = span = None
    per = {w: r if w in fresh else None for w, r in per.items()}
    sets, remaining = [], None
    for p in datasets:
        prog, counts = progress[p.name], totals[p.name]
        left = None
        if prog.initialized:
            left = min(p.total_samples, (prog.total - prog.done) * p.samples_per_shard)
            remaining = (remaining or 0) + left
        sets.append(DatasetTraining(
            name=p.name, epoch=epoch, samples_trained=counts.samples,
            steals_total=counts.steals, remaining_samples=left,
            ratio=prog.done / prog.total if prog.total else 0.0,
        ))  # fmt: skip
    eta = None
    if remaining == 0:
        eta = 0.0
    elif remaining is not None and rate:
        eta = round(remaining / rate, 1)
    ranked = sorted((r, w) for w, r in per.items() if r is not None)
    slowest = None
    # nothing left to train: a worker at 0 samples/s is done, not slow; and at a tie for
    # the lowest rate none is slower than the others
    if len(ranked) >= 2 and remaining != 0 and ranked[0][0] < ranked[1][0]:
        slowest = ranked[0][1]
    return Training(
        samples_trained=total,
        samples_per_s=rate,
        rate_window_s=span,
        epoch_remaining_samples=remaining,
        eta_s=eta,
        slowest_worker=slowest,
        workers=tuple(
            WorkerRate(w, mine[w], per[w], w == slowest) for w in live if w in page or w == slowest
        ),
        datasets=tuple(sets),
        checkpoints=tuple(checkpoints),
    )

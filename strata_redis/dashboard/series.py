"""The dashboard's figures derived from what ``state.py`` read: percentiles, time buckets,
and the barrier, checkpoint and membership series and tiles.

Pure functions of typed values (``BarrierLatency``, ``SaveRecord``, ``StepState``,
``MembershipEvent``) into the snapshot's (``BarrierFigures``, ``CheckpointFigures``): no
Redis, no key. A series has at most ``SERIES_POINTS`` points.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Final

from strata_redis.checkpoint import records
from strata_redis.checkpoint.commit import StepState
from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.checkpoint.records import SaveRecord
from strata_redis.coordination.latency import BarrierLatency
from strata_redis.coordination.registry import MembershipEvent

from .snapshot import BarrierFigures, CheckpointFigures, Series

#: points in a chart's series at most
SERIES_POINTS: Final = 60


def entry_ms(entry_id: str) -> int:
    """The ms part of a stream entry id (``<ms>-<seq>``): when it was added, Redis' clock."""
    return int(entry_id.split("-", 1)[0])


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0..100) of non-empty sorted values."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def buckets(points: Iterable[tuple[int, Any]]) -> list[tuple[int, list[Any]]]:
    """``(ms, value)`` points grouped into at most ``SERIES_POINTS`` equal time buckets."""
    items = sorted(points, key=lambda p: p[0])
    if not items:
        return []
    first, last = items[0][0], items[-1][0]
    width = max(1000, math.ceil((last - first + 1) / SERIES_POINTS))
    groups: dict[int, list[Any]] = {}
    for ms, value in items:
        groups.setdefault(first + (ms - first) // width * width, []).append(value)
    return sorted(groups.items())


def barrier_metrics(entries: list[tuple[str, BarrierLatency]]) -> BarrierFigures:
    """Release latency percentiles of the releases read, and their series."""
    points = [(b.at_ms, b.release_ms) for _, b in entries]
    values = sorted(v for _, v in points)
    series = []
    for start, group in buckets(points):
        group.sort()
        series.append((start / 1000, round(percentile(group, 50), 3),
                       round(percentile(group, 99), 3)))  # fmt: skip
    return BarrierFigures(
        releases=len(values),
        p50_ms=round(percentile(values, 50), 3) if values else None,
        p99_ms=round(percentile(values, 99), 3) if values else None,
        max_ms=round(values[-1], 3) if values else None,
        series=tuple(series),
    )


def throughput(uploaded: Iterable[SaveRecord]) -> dict[str, Any]:
    """One checkpoint's ranks, bytes, seconds and MB/s as the document shows them: the one
    definition (``records.checkpoint_throughput``), rounded once here, so the tile, the
    table, ``strata status`` and ``/metrics`` show the same number for the same step."""
    t = records.checkpoint_throughput(uploaded)
    return {
        "ranks": t.ranks,
        "bytes": t.nbytes,
        "seconds": round(t.seconds, 6) if t.ranks else None,
        "mb_s": round(t.mb_s, 3) if t.mb_s is not None else None,
        "at_ms": t.at_ms,
    }


def checkpoint_metrics(
    saves: list[tuple[str, SaveRecord]], step_state: dict[CheckpointId, StepState]
) -> CheckpointFigures:
    """Saves, aborts and bytes of the save records read; the newest checkpoint saved
    (run, epoch and step) and its MB/s; the MB/s series."""
    uploaded = [r for _, r in saves if r.outcome == "uploaded"]
    aborted = [r for _, r in saves if r.outcome == "aborted"]
    aborted_steps = {r.checkpoint for r in aborted}
    aborted_steps |= {s for s, st in step_state.items() if st.state == "aborted"}
    by_step: dict[CheckpointId, list[SaveRecord]] = {}
    for r in uploaded:
        by_step.setdefault(r.checkpoint, []).append(r)
    # Per checkpoint (not per rank): its MB/s, at the time its newest rank's save ended.
    steps = sorted(
        ((step, throughput(rows)) for step, rows in by_step.items()),
        key=lambda item: (item[1]["at_ms"], item[0]),
    )
    newest = steps[-1] if steps else None
    series = []
    for start, group in buckets((t["at_ms"], t) for _, t in steps if t["mb_s"] is not None):
        series.append((start / 1000, round(sum(t["mb_s"] for t in group) / len(group), 3)))
    return CheckpointFigures(
        saves=len(uploaded),
        aborted_saves=len(aborted),
        aborted_steps=len(aborted_steps),
        nbytes=sum(r.nbytes for r in uploaded),
        seconds=round(sum(r.seconds for r in uploaded), 6),
        last=newest[0] if newest else None,
        last_bytes=newest[1]["bytes"] if newest else None,
        last_seconds=newest[1]["seconds"] if newest else None,
        last_mb_s=newest[1]["mb_s"] if newest else None,
        series=tuple(series),
    )


def membership_series(events: list[tuple[str, MembershipEvent]]) -> Series:
    """Joins (and replaces), leaves and failures per time bucket."""
    kinds = {"join": 0, "replace": 0, "leave": 1, "fail": 2}
    series = []
    for start, group in buckets((entry_ms(i), e.type) for i, e in events):
        counts = [0, 0, 0]
        for kind in group:
            if kind in kinds:
                counts[kinds[kind]] += 1
        series.append((start / 1000, *counts))
    return tuple(series)


def thin(points: list[tuple[float, ...]]) -> Series:
    """At most ``SERIES_POINTS`` of the newest points."""
    return tuple(points[-SERIES_POINTS:])

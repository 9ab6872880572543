"""What the views say in the states that matter: a job's state in every view, the rate over
a bounded window (or none), no rate, ETA or live count when every worker is silent, no
"slowest" at a tie, and the run of every checkpoint shown."""

from __future__ import annotations

import dataclasses

import pytest

from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.checkpoint.records import SaveRecord
from strata_redis.cli.feed import _checkpoint
from strata_redis.cli.views import render, render_job
from strata_redis.dashboard import series
from strata_redis.dashboard.document import document
from strata_redis.dashboard.metrics import render_metrics
from strata_redis.dashboard.progress import RATE_STEP_S, RATE_WINDOW_S, TrainedHistory, training
from strata_redis.dashboard.snapshot import ShardCounts, Training
from strata_redis.data.record import LeaseTotals
from strata_redis.data.sharding import DatasetParams

from .documents import JOB, snapshot
from .test_documents import samples

S = 1000  # ms


def _training(
    history: TrainedHistory, now: int, trained: int, *, beats: dict[str, int], split: float = 0.5
) -> Training:
    """Two live workers ``a``, ``b`` of a 1000-sample dataset, ``trained`` so far (``a``
    trained ``split`` of it), 40 of 100 shards done."""
    a = round(trained * split)
    return training(
        now, history, epoch=1, live=["a", "b"], beats=beats, timeout_s=10.0, page={"a", "b"},
        datasets=[DatasetParams("d", 1000, 10)],
        progress={"d": ShardCounts(True, 100, 40, 0, 60, 0)},
        totals={"d": LeaseTotals(steals=0, samples=trained, by_worker={"a": a, "b": trained - a})},
        checkpoints=[],
    )  # fmt: skip


# -- the job's state -----------------------------------------------------------------------------
@pytest.mark.parametrize("state", ["running", "stale", "ended", "lost"])
def test_every_view_says_the_jobs_state(state: str) -> None:
    snap = snapshot(state=state)
    assert document(snap)["jobs"][0]["state"] == state  # the index and the job page read it
    got = samples(render_metrics(snap)[0])
    assert got[("strata_job_state", (("job_id", JOB), ("state", state)))] == 1
    assert render(snap, 120).startswith(f"job {JOB!r} ({state})")


# -- the rate's window ---------------------------------------------------------------------------
def test_the_rate_is_none_after_a_gap_longer_than_the_window() -> None:
    """Unread for 303 s: no rate "over the last 303 s", but none at all (no recent data)."""
    h = TrainedHistory()
    h.rates(0, 0, {})
    h.rates(1 * S, 100, {})
    rate, span, _ = h.rates(303 * S, 30_000, {})
    assert (rate, span) == (None, None)
    # the next reading a second later has a rate again, over that second
    assert h.rates(304 * S, 30_100, {})[:2] == (100.0, 1.0)


def test_the_rate_window_never_exceeds_its_bound() -> None:
    h = TrainedHistory()
    spans = {}
    for t in (0, 5, 12, 30, 31, 60, 95, 96, 97):
        _, span, _ = h.rates(t * S, t * 10, {})
        assert span is None or span <= RATE_WINDOW_S + RATE_STEP_S, (t, span)
        spans[t] = span
    # a reading still inside the window gives the rate: at 30 s the one of 12 s (18 s old),
    # though the one of 5 s is past the bound
    assert spans[30] == 18.0


# -- every worker silent -------------------------------------------------------------------------
def test_no_rate_or_eta_when_every_worker_is_silent() -> None:
    """SIGKILLed 16 s ago, inside the 20 s window: the deltas still show their old speed."""
    h = TrainedHistory()
    for t in range(0, 5):
        _training(h, t * S, t * 140, beats={"a": t * S, "b": t * S})
    p = _training(h, 20 * S, 4 * 140, beats={"a": 4 * S, "b": 4 * S})  # silent 16 s > 10 s
    assert p.samples_per_s is None and p.rate_window_s is None and p.eta_s is None
    assert [w.samples_per_s for w in p.workers] == [None, None]
    assert p.slowest_worker is None


def test_a_silent_job_shows_no_rate_eta_or_live_count() -> None:
    silent = dataclasses.replace(
        snapshot().jobs[0].training, samples_per_s=None, rate_window_s=None, eta_s=None,
        slowest_worker=None,
    )  # fmt: skip
    text = "\n".join(render_job(snapshot(state="stale", silent_workers=2, training=silent),
                                JOB, 160))  # fmt: skip
    assert "no worker heartbeating (2 silent of 3 workers)" in text
    assert " live of " not in text and "samples/s" not in text and "ETA" not in text
    assert "training: no rate (no worker heartbeating)" in text


def test_no_recent_data_is_said() -> None:
    quiet = dataclasses.replace(snapshot().jobs[0].training, samples_per_s=None, eta_s=None,
                                rate_window_s=None)  # fmt: skip
    text = "\n".join(render_job(snapshot(training=quiet), JOB, 160))
    assert "training: no rate (no recent data)" in text and "ETA" not in text


def test_a_job_with_no_live_worker_says_so_as_the_page_does() -> None:
    quiet = dataclasses.replace(snapshot().jobs[0].training, samples_per_s=None, eta_s=None,
                                rate_window_s=None)  # fmt: skip
    text = "\n".join(render_job(snapshot(state="ended", live_workers=0, silent_workers=0,
                                          training=quiet), JOB, 160))  # fmt: skip
    assert "training: no rate (no live worker)" in text


# -- the slowest worker --------------------------------------------------------------------------
def test_no_slowest_at_a_tie() -> None:
    h = TrainedHistory()
    _training(h, 0, 0, beats={"a": 0, "b": 0})
    p = _training(h, 2 * S, 400, beats={"a": 2 * S, "b": 2 * S}, split=0.5)
    assert [w.samples_per_s for w in p.workers] == [100.0, 100.0]
    assert p.slowest_worker is None and not any(w.slowest for w in p.workers)


def test_the_slowest_is_marked_when_it_is_slower() -> None:
    h = TrainedHistory()
    _training(h, 0, 0, beats={"a": 0, "b": 0})
    p = _training(h, 2 * S, 400, beats={"a": 2 * S, "b": 2 * S}, split=0.75)
    assert p.slowest_worker == "b" and [w.slowest for w in p.workers] == [False, True]


# -- run numbers ---------------------------------------------------------------------------------
def test_the_newest_checkpoint_saved_carries_its_run() -> None:
    newest = SaveRecord(
        step=0, rank=0, worker_id="w0", nbytes=10, seconds=1.0, mb_s=1e-5,
        outcome="uploaded", at_ms=2 * S, epoch=0, run=1,
    )  # fmt: skip
    older = dataclasses.replace(newest, step=200, epoch=3, run=0, at_ms=1 * S)
    figures = series.checkpoint_metrics([("2000-0", newest), ("1000-0", older)], {})
    doc = document(snapshot(checkpoint=figures, latest_checkpoint=CheckpointId(0, 0, 1)))
    c = doc["metrics"]["jobs"][0]["checkpoint"]
    assert (c["last_run"], c["last_epoch"], c["last_step"]) == (1, 0, 0)
    assert doc["jobs"][0]["latest_checkpoint"]["run"] == 1
    got = samples(render_metrics(snapshot(latest_checkpoint=CheckpointId(0, 0, 1)))[0])
    assert got[("strata_checkpoint_latest_run", (("job_id", JOB),))] == 1


def test_every_checkpoint_row_carries_its_run() -> None:
    doc = document(snapshot())
    assert all("run" in c for c in doc["checkpoints"])
    assert all("run" in c for c in doc["jobs"][0]["progress"]["checkpoints"])


def test_the_feed_says_the_run_of_a_relaunch() -> None:
    r = SaveRecord(
        step=0, rank=1, worker_id="w1", nbytes=2_000_000, seconds=0.5, mb_s=4.0,
        outcome="uploaded", at_ms=S, epoch=2, run=3,
    )  # fmt: skip
    assert _checkpoint("1000-0", r).text.startswith("run 3 epoch 2 step 0: rank 1 (w1)")
    first = dataclasses.replace(r, run=0)
    assert _checkpoint("1000-0", first).text.startswith("epoch 2 step 0: rank 1 (w1)")

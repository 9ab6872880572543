"""The dashboard's math (``dashboard/progress.py``, ``dashboard/series.py``) and the save
records it reads (``checkpoint/records.py``): rates, ETAs, percentiles, buckets, MB/s, and
the queue/take pairs through a recording pipe."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from strata_redis.checkpoint import records
from strata_redis.checkpoint.commit import StepState
from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.checkpoint.records import SaveRecord, checkpoint_throughput, decode_record
from strata_redis.coordination.latency import BarrierLatency
from strata_redis.coordination.registry import MembershipEvent
from strata_redis.dashboard import series
from strata_redis.dashboard.progress import TrainedHistory, training
from strata_redis.dashboard.snapshot import ShardCounts
from strata_redis.data.record import LeaseTotals
from strata_redis.data.sharding import DatasetParams

from .fakes import RecordingPipe


# -- samples/s -----------------------------------------------------------------------------------
def test_the_first_reading_has_no_rate() -> None:
    h = TrainedHistory()
    assert h.rates(0, 0, {"a": 0}) == (None, None, {"a": None})


def test_rates_are_deltas_over_the_window() -> None:
    h = TrainedHistory()
    h.rates(0, 0, {"a": 0, "b": 0})
    h.rates(1000, 100, {"a": 60, "b": 40})
    rate, span, per = h.rates(2000, 300, {"a": 200, "b": 100, "c": 5})
    assert (rate, span) == (150.0, 2.0)
    assert per == {"a": 100.0, "b": 50.0, "c": None}  # c: no point has it


def test_a_reading_under_a_second_old_gives_no_rate() -> None:
    h = TrainedHistory()
    h.rates(0, 0, {})
    assert h.rates(999, 50, {})[0] is None
    assert h.rates(1000, 100, {})[0] == 100.0


def test_the_window_slides() -> None:
    h = TrainedHistory()
    for s in range(0, 31):
        h.rates(s * 1000, s * 10, {})
    assert len(h.points) <= 22
    rate, span, _ = h.rates(31_000, 310 + 20, {})
    assert span is not None and span <= 21 and rate is not None and rate > 10


def test_counts_or_clock_going_back_start_over() -> None:
    h = TrainedHistory()
    h.rates(0, 100, {})
    h.rates(5000, 600, {})
    assert h.rates(6000, 50, {})[0] is None  # the counts went back (state lost)
    h2 = TrainedHistory()
    h2.rates(5000, 0, {})
    assert h2.rates(1000, 10, {})[0] is None  # the clock went back


def progress_doc(now: int, history: TrainedHistory, trained: int, done: int, **kw: object
                 ) -> dict[str, object]:  # fmt: skip
    p = DatasetParams("d", 1000, 10)
    args: dict[str, object] = dict(
        epoch=1, live=["a", "b"], beats={"a": now, "b": now}, timeout_s=10.0, page={"a"},
        datasets=[p], progress={"d": {"initialized": True, "total": 100, "done": done}},
        totals={"d": LeaseTotals(steals=2, samples=trained,
                                 by_worker={"a": trained // 4 * 3, "b": trained // 4})},
        checkpoints=[],
    )  # fmt: skip
    args.update(kw)
    args["progress"] = {
        name: ShardCounts(p["initialized"], p["total"], p["done"], 0, 0, 0)
        for name, p in args["progress"].items()  # type: ignore[attr-defined]
    }
    return dataclasses.asdict(training(now, history, **args))  # type: ignore[arg-type]


def test_training_eta_and_the_slowest_worker() -> None:
    h = TrainedHistory()
    progress_doc(0, h, 0, 0)
    doc = progress_doc(2000, h, 400, 40)
    assert doc["samples_per_s"] == 200.0 and doc["epoch_remaining_samples"] == 600
    assert doc["eta_s"] == 3.0 and doc["slowest_worker"] == "b"
    assert [w["worker_id"] for w in doc["workers"]] == ["a", "b"]  # the page, and the slowest
    assert doc["datasets"][0]["ratio"] == 0.4 and doc["datasets"][0]["steals_total"] == 2


def test_a_silent_worker_is_never_the_slowest() -> None:
    h = TrainedHistory()
    progress_doc(0, h, 0, 0)
    doc = progress_doc(20_000, h, 400, 40, beats={"a": 20_000, "b": 0})
    assert doc["slowest_worker"] is None and [w["worker_id"] for w in doc["workers"]] == ["a"]


def test_a_finished_epoch_has_eta_0_and_no_slowest() -> None:
    h = TrainedHistory()
    progress_doc(0, h, 0, 0)
    doc = progress_doc(2000, h, 1000, 100)
    assert doc["eta_s"] == 0.0 and doc["slowest_worker"] is None


def test_an_epoch_not_started_has_no_remaining() -> None:
    doc = progress_doc(0, TrainedHistory(), 0, 0,
                       progress={"d": {"initialized": False, "total": 0, "done": 0}})  # fmt: skip
    assert doc["epoch_remaining_samples"] is None and doc["eta_s"] is None
    assert doc["datasets"][0]["ratio"] == 0.0


# -- series -------------------------------------------------------------------------------------
@given(st.lists(st.floats(0, 1e6), min_size=1), st.floats(0, 100))
def test_percentile_is_a_member_at_its_rank(values: list[float], q: float) -> None:
    values.sort()
    p = series.percentile(values, q)
    assert p in values
    assert sum(v <= p for v in values) >= q / 100 * len(values)


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert series.percentile(values, 50) == 50 and series.percentile(values, 99) == 99
    assert series.percentile(values, 0) == 1 and series.percentile(values, 100) == 100


@given(st.lists(st.tuples(st.integers(0, 10**9), st.integers()), max_size=300))
def test_buckets_keep_every_point_in_at_most_60(points: list[tuple[int, int]]) -> None:
    groups = series.buckets(points)
    assert len(groups) <= series.SERIES_POINTS
    assert sorted(v for _, g in groups for v in g) == sorted(v for _, v in points)
    starts = [s for s, _ in groups]
    assert starts == sorted(starts)


def test_buckets_are_a_second_wide_at_least() -> None:
    groups = series.buckets([(0, "a"), (999, "b"), (1000, "c")])
    assert groups == [(0, ["a", "b"]), (1000, ["c"])]


def test_entry_ms_and_thin() -> None:
    assert series.entry_ms("1700000000123-4") == 1700000000123
    assert series.thin([[float(i)] for i in range(100)])[0] == [40.0]


def rec(step: int, rank: int, nbytes: int, seconds: float, outcome: str = "uploaded",
        at: int = 1000) -> SaveRecord:  # fmt: skip
    return SaveRecord(step, rank, f"w{rank}", nbytes, seconds, nbytes / 1e6 / seconds,
                      outcome, at)  # fmt: skip


def test_checkpoint_mb_s_is_all_bytes_over_the_slowest_rank() -> None:
    t = checkpoint_throughput([rec(1, 0, 4_000_000, 1.0), rec(1, 1, 4_000_000, 2.0),
                               rec(1, 2, 9, 0.1, outcome="aborted")])  # fmt: skip
    assert (t.ranks, t.nbytes, t.seconds, t.mb_s) == (2, 8_000_000, 2.0, 4.0)
    assert checkpoint_throughput([]).mb_s is None


def test_checkpoint_metrics() -> None:
    saves = [("1-0", rec(1, 0, 1_000_000, 1.0, at=1000)), ("2-0", rec(2, 0, 3_000_000, 1.0,
             at=5000)), ("3-0", rec(3, 0, 0, 1.0, "aborted", 6000))]  # fmt: skip
    m = series.checkpoint_metrics(saves, {CheckpointId(4): StepState(state="aborted")})
    assert m.saves == 2 and m.aborted_saves == 1 and m.aborted_steps == 2
    assert m.last is not None and m.last.step == 2
    assert m.last_mb_s == 3.0 and m.nbytes == 4_000_000
    assert [p[1] for p in m.series] == [1.0, 3.0]


def test_barrier_metrics() -> None:
    entries = [(f"{i}-0", BarrierLatency("b", i, 2, float(i), 0.0, 1000 * i)) for i in range(1, 11)]
    m = series.barrier_metrics(entries)
    assert (m.releases, m.p50_ms, m.p99_ms, m.max_ms) == (10, 5.0, 10.0, 10.0)
    assert series.barrier_metrics([]).p50_ms is None


def test_membership_series_counts_joins_leaves_and_fails() -> None:
    events = [("1000-0", MembershipEvent("1000-0", "join", "a", 1, 1000)),
              ("1000-1", MembershipEvent("1000-1", "replace", "a", 2, 1000)),
              ("1500-0", MembershipEvent("1500-0", "fail", "b", 3, 1500)),
              ("1600-0", MembershipEvent("1600-0", "leave", "c", 4, 1600))]  # fmt: skip
    assert series.membership_series(events) == ((1.0, 2, 1, 1),)


# -- records: parsing and the queue/take pairs ---------------------------------------------------
def test_decode_record() -> None:
    f = {"step": "5", "rank": "1", "worker": "w1", "bytes": "10", "seconds": "0.5",
         "mb_s": "0.00002", "outcome": "uploaded", "at_ms": "7", "epoch": "",
         "run": "2"}  # fmt: skip
    r = decode_record(f)
    assert r.checkpoint == CheckpointId(5, None, 2) and r.nbytes == 10
    assert decode_record({**f, "epoch": "3"}).epoch == 3
    with pytest.raises(KeyError):
        decode_record({k: v for k, v in f.items() if k != "worker"})
    with pytest.raises(ValueError):
        decode_record({**f, "step": "x"})


def test_totals_queue_and_take() -> None:
    pipe = RecordingPipe()
    records.queue_totals(pipe, "j")
    ((command, (key, fields), _),) = pipe.calls
    assert command == "hmget" and key.startswith("strata:{j}:")
    assert fields == ["saves", "saved_bytes", "save_ms", "aborted_steps", "aborted_saves"]
    totals = records.take_totals(iter([["3", "100", "2500", None, "1"]]))
    assert totals == records.CheckpointTotals(3, 100, 2.5, 0, 1)


def test_a_command_error_in_the_replies_is_raised() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        records.take_totals(iter([RuntimeError("boom")]))


def test_save_records_page() -> None:
    f = {"step": "5", "rank": "0", "worker": "w0", "bytes": "10", "seconds": "1",
         "mb_s": "0.00001", "outcome": "uploaded", "at_ms": "7"}  # fmt: skip
    page = records.take_save_records(iter([[("9-0", f)], "12"]))
    assert page.length == 12 and page.entries[0][0] == "9-0"
    assert page.entries[0][1].step == 5

"""perf/report.py: the targets table, row statuses, and regression detection against a baseline."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pyperf
import pytest

PERF = Path(__file__).resolve().parent.parent / "perf"
sys.path.insert(0, str(PERF))

import report  # noqa: E402


def bench(name: str, mean_s: float, *, n: int = 40, spread: float = 0.02, seed: int = 1,
          description: str | None = None) -> pyperf.Benchmark:  # fmt: skip
    rng = random.Random(seed)
    values = [mean_s * (1 + rng.uniform(-spread, spread)) for _ in range(n)]
    metadata: dict[str, object] = {"name": name, "loops": 1}
    if description:
        metadata["description"] = description
    return pyperf.Benchmark([pyperf.Run(values, metadata=metadata, collect_metadata=False)])


def suite(path: Path, *benches: pyperf.Benchmark) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pyperf.BenchmarkSuite(list(benches)).dump(str(path), replace=True)


def test_targets_file_loads_and_names_real_benchmarks() -> None:
    rows = report.load_targets()
    assert len(rows) >= 15
    for row in rows:
        assert row.bench and row.name, f"{row.metric}: every row names what measures it"
        script = "load" if row.bench.startswith("load_") else row.bench
        script = report.SUMMARIES.get(script, script)
        assert (PERF / f"{script}.py").exists(), row.bench


def test_bad_targets_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "t.toml"
    bad.write_text('[[row]]\nmetric="m"\nstat="mean"\nbetter="lower"\n'
                   "target=10.0\nacceptable=5.0\ncritical=20.0\n")  # fmt: skip
    with pytest.raises(ValueError, match="out of order"):
        report.load_targets(bad)
    bad.write_text('[[row]]\nmetric="m"\n')
    with pytest.raises(ValueError, match="row 1"):
        report.load_targets(bad)


@pytest.mark.parametrize(
    ("better", "value", "expected"),
    [("lower", 0.5, "target"), ("lower", 3, "acceptable"), ("lower", 8, "degraded"),
     ("lower", 11, "critical"), ("higher", 600, "target"), ("higher", 300, "acceptable"),
     ("higher", 150, "degraded"), ("higher", 50, "critical")],
)  # fmt: skip
def test_row_status(better: str, value: float, expected: str) -> None:
    bars = (1.0, 5.0, 10.0) if better == "lower" else (500.0, 250.0, 100.0)
    row = report.Row("m", "mean", better, *bars)
    assert report.status(row, value) == expected


HEARTBEAT = {"heartbeat_p50_ms": 0.4, "raw_zadd_p50_ms": 0.2, "tick_p99_ms": 0.9,
             "raw_zadd_p99_ms": 0.6, "tick_p999_ms": 3.0, "raw_zadd_p999_ms": 2.5}  # fmt: skip


def test_the_table_is_filled_from_results(tmp_path: Path) -> None:
    suite(
        tmp_path / "bench_heartbeat.json",
        bench("strata heartbeat", 0.0004),
        bench("strata heartbeat+reap tick", 0.0006),
        bench("raw redis-py ZADD", 0.0002),
        bench("heartbeat script, era check", 0.000105),
        bench("heartbeat script, no era check", 0.0001),
    )
    (tmp_path / "heartbeat.json").write_text(json.dumps(HEARTBEAT))
    suite(
        tmp_path / "bench_checkpoint.json",
        bench("CheckpointManager.save local (bytes)", 0.5, description="256 MiB"),
        bench("raw write+fsync", 0.45, description="256 MiB"),
    )
    code = report.report(tmp_path, fail_on="critical")
    assert code == 0
    doc = json.loads((tmp_path / "report.json").read_text())
    rows = {r["metric"]: r for r in doc["rows"]}
    # the latency rows are per-call percentiles (the summary), not percentiles of means
    beat = rows["coordination call latency p50, per call (heartbeat)"]
    assert beat["measured"] == pytest.approx(0.4) and beat["unit"] == "ms"
    assert beat["ratio"] == pytest.approx(2.0) and beat["goal_met"] is False
    assert beat["status"] == "target"
    tail = rows["coordination call latency p999, per call (heartbeat + reaper tick)"]
    assert tail["measured"] == pytest.approx(3.0) and tail["ratio"] == pytest.approx(1.2)
    era = next(r for m, r in rows.items() if m.startswith("era check cost"))
    assert era["ratio"] == pytest.approx(1.05, rel=0.03) and era["goal_met"] is True
    save = rows["checkpoint save, local disk"]
    assert save["measured"] == pytest.approx(256 * 1024 * 1024 / 0.5 / 1e6, rel=0.03)
    assert save["status"] == "target"  # 537 MB/s is past the seeds' 500
    assert save["goal_met"] is True  # 0.5 s vs 0.45 s: 90 % of the raw write
    unmeasured = rows["memory per worker process, MB (RSS with its heartbeat thread)"]
    assert unmeasured["status"] == "not measured" and unmeasured["measured"] is None
    text = (tmp_path / "report.md").read_text()
    assert "Machine:" in text and "| coordination call latency p50, per call (heartbeat) |" in text


def test_summary_rows_from_load_and_cost(tmp_path: Path) -> None:
    (tmp_path / "load_peak.json").write_text(json.dumps({"rps": 8000.0, "p99_ms": 4.0}))
    (tmp_path / "load_raw.json").write_text(json.dumps({"rps": 9000.0}))
    (tmp_path / "cost.json").write_text(json.dumps({"recovery_s": 2.5, "recovery_bar_s": 3.0}))
    report.report(tmp_path)
    rows = {r["metric"]: r for r in json.loads((tmp_path / "report.json").read_text())["rows"]}
    peak = rows["coordinator throughput, requests/s (load: peak, the real mix)"]
    assert (peak["measured"], peak["status"]) == (8000.0, "acceptable")
    assert peak["ratio"] == pytest.approx(9000 / 8000) and peak["goal_met"] is True
    recovery = next(r for m, r in rows.items() if m.startswith("recovery: worker"))
    assert recovery["ratio"] == pytest.approx(2.5 / 3.0) and recovery["status"] == "target"


def test_capacity_rows_from_their_summary(tmp_path: Path) -> None:
    # perf/capacity.py's figures: each script beside its inner commands (goal <= 2x)
    (tmp_path / "capacity.json").write_text(json.dumps({
        "heartbeat_us": 9.0, "heartbeat_inner_us": 1.5,
        "batched_heartbeat_us_per_worker": 2.5, "batched_heartbeat_inner_us_per_worker": 1.5,
        "workers_per_core": 150_000.0, "raw_workers_per_core": 5_000_000.0,
    }))  # fmt: skip
    report.report(tmp_path)
    rows = {r["metric"]: r for r in json.loads((tmp_path / "report.json").read_text())["rows"]}
    beat = rows["Redis CPU per heartbeat (script), us"]
    assert (beat["measured"], beat["status"], beat["unit"]) == (9.0, "target", "us")
    assert beat["ratio"] == pytest.approx(6.0) and beat["goal_met"] is False
    batched = rows["Redis CPU per worker heartbeat, 8 workers in one call, us"]
    assert batched["status"] == "target" and batched["goal_met"] is True
    served = next(r for m, r in rows.items() if m.endswith("one worker per process"))
    assert (served["measured"], served["status"]) == (150_000.0, "target")
    assert rows["lease hand-offs one Redis core serves per second"]["status"] == "not measured"


def test_burst_recovery_is_judged_by_the_steady_states_own_spread() -> None:
    import argparse

    import numpy as np
    from load import _recovery

    # 500 calls/s: 10 s steady, a 5 s burst at 10 ms, 10 s steady again. The steady state
    # has hiccups (a shared machine): in a few 1 s windows 3 % of calls take 6 ms, so those
    # windows' p99 is 6 ms while the pooled p99 stays near 2 ms
    rng = np.random.default_rng(7)
    at = np.arange(0, 25, 0.002)
    lat = np.where((at >= 10) & (at < 15), 10.0, 2.0) * 1e-3 * rng.uniform(0.5, 1.0, len(at))
    for hiccup in (3, 7, 17, 21):  # two in the lead, two after the burst
        slow = (at >= hiccup) & (at < hiccup + 1) & (rng.uniform(size=len(at)) < 0.03)
        lat[slow] = 6e-3
    # and one worse spike late in the tail, after 3 s back within the spread: noise, not a
    # backlog still draining
    lat[(at >= 22) & (at < 23) & (rng.uniform(size=len(at)) < 0.03)] = 12e-3
    done = at + lat
    args = argparse.Namespace(burst_lead=10.0, burst=5.0, burst_tail=10.0, rate=500.0)
    doc = _recovery(lat, at, done, args)
    spread = doc["baseline_window_p99_ms"]
    assert spread["min"] < 2.1 and spread["max"] == pytest.approx(6.0), spread
    assert max(doc["after_window_p99_ms"]) > 11.0  # the late spike was seen
    assert doc["baseline_p99_ms"] < 2.1 and doc["recover_limit_ms"] == spread["max"]
    # after the burst the system is as it was before it, hiccups included: recovered at once
    assert doc["recovered_within_spread"] and doc["recover_spread_s"] < 0.5, doc
    assert "worst 1 s-window p99" in doc["recover_criterion"]
    # the former criterion (1.2x the pooled p99) calls the last hiccup "not recovered yet"
    assert doc["recover_s"] > 6.0, doc
    # a tail that stays worse than anything the steady state showed never recovers
    lat[(at >= 15)] = 8e-3
    doc = _recovery(lat, at, at + lat, args)
    assert not doc["recovered_within_spread"] and doc["recover_spread_s"] == 10.0, doc
    assert "drain_floor_s" in doc


def test_fail_on_critical(tmp_path: Path) -> None:
    suite(tmp_path / "bench_sharding.json", bench("assignment-from-scratch", 0.05))  # 50 ms
    assert report.report(tmp_path, fail_on="critical") == 1
    assert report.report(tmp_path) == 0


@pytest.mark.parametrize(("faster_before", "flagged"), [(0.20, True), (0.05, False)])
def test_regressions_against_a_baseline(
    tmp_path: Path, faster_before: float, flagged: bool
) -> None:
    """A baseline 20 % better is a regression; 5 % is within the guide's 10 % rule."""
    after = tmp_path / "run" / "bench_leases.json"
    before = tmp_path / "base" / "bench_leases.json"
    suite(after, bench("strata lease loop", 0.001, seed=2), bench("raw SET NX + DEL", 0.0008))
    suite(
        before,
        bench("strata lease loop", 0.001 * (1 - faster_before), seed=3),
        bench("raw SET NX + DEL", 0.0008, seed=4),
    )
    code = report.report(tmp_path / "run", tmp_path / "base", fail_on="regression")
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    (change,) = [c for c in doc["changes"] if c["what"].startswith("shard lease hand-off")]
    assert change["regression"] is flagged
    assert code == (1 if flagged else 0)
    assert ("REGRESSION" in (tmp_path / "run" / "report.md").read_text()) is flagged


def test_noise_alone_is_not_a_regression(tmp_path: Path) -> None:
    # the same mean, a wide spread: no change is flagged either way
    suite(tmp_path / "a" / "bench_leases.json", bench("strata lease loop", 0.001, spread=0.3))
    suite(
        tmp_path / "b" / "bench_leases.json", bench("strata lease loop", 0.001, spread=0.3, seed=9)
    )
    rows = report.load_targets()
    changes = report.compare(
        rows, report.load_results(tmp_path / "a"), report.load_results(tmp_path / "b")
    )
    assert changes and not any(c.regression or c.improvement for c in changes)


def _summaries(folder: Path, worse: float) -> None:
    """load_peak/load_raw, cost and heartbeat summaries; ``worse`` scales the subjects."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "load_peak.json").write_text(json.dumps({"rps": 8000.0 / worse, "p99_ms": 4.0}))
    (folder / "load_raw.json").write_text(json.dumps({"rps": 9000.0, "p99_ms": 2.0}))
    (folder / "cost.json").write_text(json.dumps({"startup_ms": 80.0 * worse}))


@pytest.mark.parametrize(("better_before", "flagged"), [(0.20, True), (0.05, False)])
def test_summary_rows_against_a_baseline(
    tmp_path: Path, better_before: float, flagged: bool
) -> None:
    """Summary rows are compared too: a ratio to the same-run reference where the row has one
    (requests/s to raw redis-py), else the value (start-up); one value each, the 10 % rule."""
    _summaries(tmp_path / "base", 1.0)
    _summaries(tmp_path / "run", 1.0 / (1 - better_before))
    code = report.report(tmp_path / "run", tmp_path / "base", fail_on="regression")
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    changes = {c["what"]: c for c in doc["changes"]}
    rps = next(c for w, c in changes.items() if w.startswith("coordinator throughput"))
    assert "ratio to load_raw" in rps["what"] and rps["t"] is None
    assert rps["regression"] is flagged
    startup = next(c for w, c in changes.items() if w.startswith("worker start-up"))
    assert startup["regression"] is flagged
    assert startup["change"] == pytest.approx(1 / (1 - better_before) - 1)
    # the same p99 both times: no change
    p99 = next(c for w, c in changes.items() if w.startswith("latency p99 under peak"))
    assert p99["change"] == 0 and not p99["regression"]
    assert code == (1 if flagged else 0)
    text = (tmp_path / "run" / "report.md").read_text()
    assert ("REGRESSION" in text) is flagged
    assert "no significance" in text  # the report says the 10 % rule alone decided


def test_heartbeat_rows_compare_the_pyperf_means(tmp_path: Path) -> None:
    """The per-call rows show the summary; their regression check uses the pyperf means."""
    for folder, mean in (("base", 0.0004 * 0.8), ("run", 0.0004)):
        suite(tmp_path / folder / "bench_heartbeat.json", bench("strata heartbeat", mean),
              bench("raw redis-py ZADD", 0.0002, seed=5))  # fmt: skip
        (tmp_path / folder / "heartbeat.json").write_text(json.dumps(HEARTBEAT))
    report.report(tmp_path / "run", tmp_path / "base")
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    (change,) = [c for c in doc["changes"] if c["what"].startswith("coordination call latency p50")]
    assert "ratio to raw redis-py ZADD" in change["what"] and change["t"] is not None
    assert change["regression"] is True


@pytest.mark.parametrize(("steeper", "flagged"), [(1.20, True), (1.05, False)])
def test_curves_against_a_baseline(steeper: float, flagged: bool) -> None:
    sizes = [10, 100, 1000]
    base = {"c": {"sizes": sizes, "slope": 1.0}}
    span = sizes[-1] / sizes[0]
    now = {"c": {"sizes": sizes, "slope": 1.0 + math.log(steeper) / math.log(span)}}
    (change,) = report.compare_curves(base, now)
    assert change.change == pytest.approx(steeper - 1) and change.regression is flagged
    assert report.compare_curves(base, {"c": {"sizes": [1, 2], "slope": 1.0}}) == []


def test_growth_is_fitted_over_every_point() -> None:
    import curves

    sizes = [10, 100, 1000, 10000]
    # linear but for a noisy last point: the end points alone would say superlinear
    seconds = [1e-3, 1e-2, 1e-1, 3e0]
    slope, name = curves.growth(sizes, seconds)
    assert slope == pytest.approx(curves.fit(sizes, seconds)[0])
    ends = math.log(seconds[-1] / seconds[0]) / math.log(sizes[-1] / sizes[0])
    assert slope < ends and 1.0 < slope < 1.25 and name == "linear"


def test_save_baseline_keeps_the_summaries(tmp_path: Path) -> None:
    import os

    import run

    results, baseline = tmp_path / "results", tmp_path / "baseline"
    _summaries(results, 1.0)
    for name in ("curves", "heartbeat", "limits", "sharding", "capacity"):
        (results / f"{name}.json").write_text("{}")
    (results / "bench_x.json").write_text("{}")  # pyperf suites are copied as they finish
    (results / "curves.md").write_text("| curve |")  # the curves' table and charts go along
    (results / "curve_lease-epoch.png").write_bytes(b"\x89PNG")
    stale = results / "load_old.json"
    stale.write_text("{}")
    os.utime(stale, (1.0, 1.0))  # from an earlier run: never saved
    run.save_summaries(results, baseline, since=1000.0)
    saved = sorted(p.name for p in baseline.iterdir())
    assert saved == ["capacity.json", "cost.json", "curve_lease-epoch.png", "curves.json",
                     "curves.md", "heartbeat.json", "limits.json", "load_peak.json",
                     "load_raw.json", "sharding.json"]  # fmt: skip


def test_no_run_rewrites_a_tracked_file() -> None:
    """perf/results is a run's scratch folder: git ignores all of it, and what the docs
    quote of a run lives in perf/baseline (issue 27: a smoke run rewrote tracked curves)."""
    root = Path(__file__).resolve().parent.parent
    rules = [line.strip() for line in (root / ".gitignore").read_text().splitlines()]
    assert "perf/results/" in rules
    assert not [r for r in rules if r.startswith("!perf/results")], rules
    page = (root / "docs" / "design" / "benchmarks.md").read_text()
    for quoted in ("curves.md", "curve_*.png"):
        assert f"perf/baseline/{quoted}" in page, quoted
    assert list((root / "perf" / "baseline").glob("curve_*.png")), "the charts the docs name"


def test_the_baseline_report_goes_into_the_docs(tmp_path: Path) -> None:
    """The report of a run lands in the docs only when asked (``--save-baseline``, or
    ``--docs``): as an include of the benchmarks page, its title dropped, naming its writer."""
    suite(tmp_path / "bench_heartbeat.json", bench("strata heartbeat", 0.0004))
    docs = tmp_path / "docs" / "report.md"
    report.report(tmp_path, docs=None)
    assert not docs.exists()
    report.report(tmp_path, docs=docs, source="python perf/run.py --save-baseline")
    text = docs.read_text()
    assert text.startswith("<!-- written by python perf/run.py --save-baseline")
    assert "# strata_redis performance report" not in text
    assert "Machine:" in text and "| barrier release, 100 workers |" in text
    root = Path(__file__).resolve().parent.parent
    assert report.DOCS_REPORT.parent.name == "_generated" and report.DOCS_REPORT.exists()
    include = f'--8<-- "{report.DOCS_REPORT.relative_to(root).as_posix()}"'
    assert include in (root / "docs" / "design" / "benchmarks.md").read_text()

"""perf/report.py: the targets table, row statuses, and regression detection against a baseline."""

from __future__ import annotations

import json
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


def test_the_table_is_filled_from_results(tmp_path: Path) -> None:
    suite(
        tmp_path / "bench_heartbeat.json",
        bench("strata heartbeat", 0.0004),
        bench("strata heartbeat+reap tick", 0.0006),
        bench("raw redis-py ZADD", 0.0002),
    )
    suite(
        tmp_path / "bench_checkpoint.json",
        bench("CheckpointManager.save local (bytes)", 0.5, description="256 MiB"),
        bench("raw write+fsync", 0.45, description="256 MiB"),
    )
    code = report.report(tmp_path, fail_on="critical")
    assert code == 0
    doc = json.loads((tmp_path / "report.json").read_text())
    rows = {r["metric"]: r for r in doc["rows"]}
    beat = rows["coordination call latency p50 (heartbeat)"]
    assert beat["measured"] == pytest.approx(0.4, rel=0.03) and beat["unit"] == "ms"
    assert beat["ratio"] == pytest.approx(2.0, rel=0.03) and beat["goal_met"] is False
    assert beat["status"] == "target"
    save = rows["checkpoint save, local disk"]
    assert save["measured"] == pytest.approx(256 * 1024 * 1024 / 0.5 / 1e6, rel=0.03)
    assert save["status"] == "target"  # 537 MB/s is past the seeds' 500
    assert save["goal_met"] is True  # 0.5 s vs 0.45 s: 90 % of the raw write
    unmeasured = rows["memory per worker process, MB (RSS with its heartbeat thread)"]
    assert unmeasured["status"] == "not measured" and unmeasured["measured"] is None
    text = (tmp_path / "report.md").read_text()
    assert "Machine:" in text and "| coordination call latency p50 (heartbeat) |" in text


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

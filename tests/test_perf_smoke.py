"""Every pyperf benchmark in perf/ still runs (one value each; no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

PERF = Path(__file__).resolve().parent.parent / "perf"


@pytest.mark.timeout(900)  # ~3 min alone; beside the other test workers, more
def test_every_benchmark_runs(redis_url: str, tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(PERF / "run.py"),
            "--smoke",
            "--results",
            str(tmp_path),
            "--redis-url",
            redis_url,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    for bench in PERF.glob("bench_*.py"):
        if bench.stem == "bench_shards":
            continue  # not a pyperf suite: test_the_shards_bench_runs
        if bench.stem == "bench_torch" and importlib.util.find_spec("torch") is None:
            continue  # perf/run.py skips it without the torch extra
        assert (tmp_path / f"{bench.stem}.json").stat().st_size > 0, bench.stem
    # the run ends with the targets table, filled from what it measured
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["machine"]["cores"] and doc["rows"]
    measured = [r for r in doc["rows"] if r["measured"] is not None]
    assert any(r["metric"].startswith("coordination call latency") for r in measured)
    assert "| metric | measured |" in (tmp_path / "report.md").read_text()
    # the load scenarios, the per-worker cost and every scaling curve ran, with its chart
    for name in ("load_peak", "load_raw", "load_sustained", "load_burst", "cost", "sharding",
                 "limits", "heartbeat", "epochs", "capacity"):  # fmt: skip
        assert json.loads((tmp_path / f"{name}.json").read_text()), name
    # what an epoch costs Redis: its rows are filled (issue 24's bytes bars)
    epochs = json.loads((tmp_path / "epochs.json").read_text())
    assert 0 < epochs["progress_bytes_per_shard"] <= 16, epochs
    assert len(epochs["job_bytes_by_epoch"]) == 9, epochs
    rows = {r["metric"]: r for r in doc["rows"]}
    assert rows["Redis bytes per shard, an epoch in progress (10^7 shards)"]["measured"]
    for name in ("load_peak", "load_sustained", "load_burst"):  # two generator processes
        scenario = json.loads((tmp_path / f"{name}.json").read_text())
        assert scenario["processes"] == 2 and scenario["errors"] == 0, scenario["error_kinds"]
    # the burst ran above the peak it measured, and its recovery was timed
    burst = json.loads((tmp_path / "load_burst.json").read_text())
    peak = json.loads((tmp_path / "load_peak.json").read_text())
    assert burst["burst_rate"] > peak["rps"] and "recover_s" in burst, burst
    assert "recover_spread_s" in burst and burst["baseline_window_p99_ms"], burst
    # Redis' CPU per operation (perf/capacity.py): each script beside its inner commands
    capacity = json.loads((tmp_path / "capacity.json").read_text())
    for kind in ("heartbeat", "lease_handoff", "barrier_arrival", "checkpoint_ack"):
        assert 0 < capacity[f"{kind}_inner_us"] < capacity[f"{kind}_us"], (kind, capacity)
    assert rows["lease hand-offs one Redis core serves per second"]["measured"]
    # per-call percentiles of the heartbeat and its raw reference; the era A/B ran
    beat = json.loads((tmp_path / "heartbeat.json").read_text())
    assert 0 < beat["raw_zadd_p50_ms"] <= beat["raw_zadd_p999_ms"], beat
    era = next(r for r in doc["rows"] if r["metric"].startswith("era check cost"))
    assert era["measured"] and era["ratio"], era
    moved = next(r for r in doc["rows"] if r["metric"].startswith("shards moved when the busiest"))
    assert 0 < moved["measured"] < 2.1, moved
    curves = json.loads((tmp_path / "curves.json").read_text())
    for name, curve in curves.items():
        assert len(curve["seconds"]) == len(curve["sizes"]) >= 2, name
        assert (tmp_path / f"curve_{name}.png").stat().st_size > 1000, name
        assert curve["fit"].startswith("least squares"), name
    assert (tmp_path / "curves.md").exists()


def test_the_durability_cost_runs(tmp_path: Path) -> None:
    """``perf/durability_cost.py`` (its own primaries and replica, outside ``run.py``): one
    value of each of its six benchmarks."""
    out = tmp_path / "durability.json"
    run = subprocess.run(
        [sys.executable, str(PERF / "durability_cost.py"), "--debug-single-value", "--quiet",
         "-o", str(out)],
        capture_output=True, text=True, timeout=300, cwd=PERF,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    names = {b["metadata"]["name"] for b in json.loads(out.read_text())["benchmarks"]}
    assert names == {f"{op}, {variant}" for op in ("lease hand-off", "checkpoint commit")
                     for variant in ("default, 0 replicas", "default, 1 replica",
                                     "replicated, 1 replica")}  # fmt: skip
    assert "replicated at 1 replica, as a ratio" in run.stdout


@pytest.mark.torch
def test_the_shards_bench_runs(redis_url: str, tmp_path: Path) -> None:
    """``perf/bench_shards.py``'s smoke form (2,000 samples in 10 shards, local, num_workers
    0 and 2, resume at 10 batches): a throughput row per reader and ``num_workers``, each
    having read every sample once (the raw floor, strata and each installed peer), a row
    saying why for a peer not installed, a memory row per reader and ``num_workers`` (the
    timed rows sample none), a resume row per reader. No timing is asserted."""
    pytest.importorskip("torch")
    run = subprocess.run(
        [sys.executable, "-m", "perf.bench_shards", "--results", str(tmp_path / "results"),
         "--redis-url", redis_url, "--resume-at", "10", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=PERF.parent,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads((tmp_path / "results" / "shards.json").read_text())
    assert doc["samples"] == 2_000 and doc["shards"] == 10
    rows = doc["rows"]
    readers = ("floor", "strata", "litdata", "mosaic", "webdataset")
    for reader in readers:
        mine = [r for r in rows if r["reader"] == reader and r["kind"] == "throughput"]
        assert sorted(r["num_workers"] for r in mine) == [0, 2], (reader, mine)
        for row in mine:
            if reader in ("floor", "strata"):
                assert "missing" not in row, row  # never "not available": both must run
            if "missing" in row:
                assert row["missing"].startswith("not installed: "), row
                continue
            assert row["samples"] == 2_000 and row["ids_ok"], row
            assert row["samples_per_s"] > 0 and row["x_floor"] > 0, row
            assert "peak_rss_mib" not in row, row  # a timed row samples no memory
        memory = [r for r in rows if r["reader"] == reader and r["kind"] == "memory"]
        assert sorted(r["num_workers"] for r in memory) == [0, 2], (reader, memory)
        for row in memory:
            assert "missing" in row or isinstance(row.get("peak_rss_mib"), float), row
        resume = [r for r in rows if r["reader"] == reader and r["kind"] == "resume"]
        assert [r["batches_done"] for r in resume] == [10], (reader, resume)
        assert all("seconds" in r or "missing" in r for r in resume), resume
    strata = [r for r in rows if r["reader"] == "strata" and r["kind"] == "throughput"]
    assert all(r["max_held_shards"] >= 1 for r in strata), strata
    table = (tmp_path / "results" / "shards.md").read_text()
    assert "| reader | store | num_workers | samples/s | x floor |" in table
    assert "resume to first batch" in table

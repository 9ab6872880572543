"""The ``strata`` command line, run as a real subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import redis

import strata_redis
from strata_redis.checkpoint.ids import CheckpointId


def strata(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strata_redis", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_status_prints_workers_and_lists_jobs(job_id: str, redis_url: str) -> None:
    # a heartbeat timeout the CLI's start (seconds under load) cannot outlast: worker-01
    # sends no heartbeat after registering, and must still read as live
    with strata_redis.connect(redis_url, job_id=job_id, heartbeat_timeout=120.0) as job:
        job.register_worker(
            "worker-01", host="gpu-a", address="10.0.0.5:29500", gpu_count=8,
            heartbeat_interval=None,
        ).set_status("training")  # fmt: skip
        job.register_worker("worker-02", heartbeat_interval=None).deregister()
        out = strata("status", "--redis-url", redis_url, "--job", job.job_id)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert "membership generation 3, 1 live of 2 workers" in lines[0]
        row = next(line for line in lines if line.startswith("worker-01"))
        assert row.split()[:2] == ["worker-01", "training"] and "10.0.0.5:29500" in row
        assert next(line for line in lines if line.startswith("worker-02")).split()[1] == "left"
        listed = strata("status", "--redis-url", redis_url)
        assert listed.stdout.split() == [job.job_id]


def test_status_shows_the_loops_epoch_and_step(
    job: strata_redis.Job, redis_url: str, tmp_path: Path
) -> None:
    with strata_redis.CheckpointManager(tmp_path, redis=job, worker_id="w") as ckpt:
        ckpt.save(b"a", step=200, epoch=1).result(timeout=30)
        ckpt.save(b"b", step=2**25, epoch=10_000).result(timeout=30)
        ckpt.save(b"c", step=0, epoch=1, run=1).result(timeout=30)  # a relaunch's first
    out = strata("status", "--redis-url", redis_url, "--job", job.job_id, "--json")
    assert out.returncode == 0, out.stderr
    doc = orjson.loads(out.stdout)
    rows = [(c["run"], c["epoch"], c["step"], c["label"], c["state"]) for c in doc["checkpoints"]]
    assert rows == [
        (1, 1, 0, "run_1_epoch_1_step_0", "committed"),
        (0, 10_000, 2**25, "epoch_10000_step_33554432", "committed"),
        (0, 1, 200, "epoch_1_step_200", "committed"),
    ]
    (overview,) = doc["jobs"]
    assert overview["latest_checkpoint"] == {
        "run": 1,
        "epoch": 1,
        "step": 0,
        "label": "run_1_epoch_1_step_0",
    }
    text = strata("status", "--redis-url", redis_url, "--job", job.job_id)
    row = next(line for line in text.stdout.splitlines() if " 33554432 " in line)
    assert row.split()[:4] == ["10000", "33554432", "0", "committed"], row


def test_status_unreachable_redis_is_a_clear_error() -> None:
    out = strata("status", "--redis-url", "redis://127.0.0.1:1/0", "--job", "x")
    assert out.returncode == 2
    assert "cannot reach redis://127.0.0.1:1/0" in out.stderr


def test_bad_job_id_is_a_clear_error(redis_url: str) -> None:
    out = strata("status", "--redis-url", redis_url, "--job", "a{b}")
    assert out.returncode == 2 and "hash tag" in out.stderr


def test_demo_on_a_private_redis_detects_the_killed_worker() -> None:
    out = strata("demo")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "worker-04 declared failed" in out.stdout
    assert "[FAILED]" not in out.stdout and out.stdout.count("[OK]") == 16, out.stdout
    for epoch in range(3):
        assert f"[OK] epoch {epoch}: each sample trained exactly once" in out.stdout
    assert "private redis-server stopped" in out.stdout


def test_demo_on_a_given_redis(redis_url: str, tmp_path: Path) -> None:
    out = strata("demo", "--redis-url", redis_url, "--workers", "5", "--checkpoint-path",
                 str(tmp_path))  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "round 1 closed with all 5" in out.stdout
    assert "worker-05 declared failed" in out.stdout
    assert "nobody advanced before the straggler worker-01 arrived" in out.stdout
    assert "kill -9 worker-04 in the middle of its upload" in out.stdout
    assert "relaunched with 4 workers" in out.stdout
    assert "[FAILED]" not in out.stdout
    assert "private redis-server" not in out.stdout
    # the checkpoints stay where they were asked to go: the newest is of epoch 3, 4 ranks
    kept = sorted((tmp_path / "demo" / "checkpoints").glob("*/metadata.json"))
    ids = [CheckpointId.from_label(p.parent.name) for p in kept]
    newest = max(c for c in ids if c is not None)
    assert len(kept) == 3 and None not in ids and newest.epoch == 3, ids
    assert newest.run == 1, "the relaunched job saves in run 1"
    meta = tmp_path / "demo" / "checkpoints" / newest.label / "metadata.json"
    doc = orjson.loads(meta.read_bytes())
    assert (doc["epoch"], doc["step"], doc["run"]) == (3, newest.step, 1), doc
    # the same job again: refused, nothing run (the job has state in Redis and in storage)
    again = strata("demo", "--redis-url", redis_url, "--checkpoint-path", str(tmp_path))
    assert again.returncode == 2 and "job 'demo' already has state in this Redis" in again.stdout
    with redis.Redis.from_url(redis_url) as client:
        client.flushall()  # Redis forgot the job: its checkpoints are still in storage
    again = strata("demo", "--redis-url", redis_url, "--checkpoint-path", str(tmp_path))
    assert again.returncode == 2 and "already holds checkpoints of job 'demo'" in again.stdout

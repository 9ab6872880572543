"""A job's lifecycle (``coordination/lifecycle.py``): its record and states, ``Job.end()`` and
the expiry of an ended job's keys, reopening, the orchestrator ending a finished job, and
``strata jobs`` / ``strata jobs rm`` (run as a real subprocess)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

import strata_redis
from strata_redis.coordination import lifecycle
from strata_redis.dashboard.document import document
from strata_redis.dashboard.metrics import render_metrics
from strata_redis.dashboard.state import DashboardState

from .conftest import decoding_client
from .procs import kill9, spawn, wait_for

pytestmark = pytest.mark.both_backends  # conftest: on one redis-server and on a Redis Cluster

JOB = "life"
TIMEOUT = 2.0


def strata(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strata_redis", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _job_keys(raw: Any, job_id: str) -> dict[str, tuple[str, Any]]:
    """Every key of ``job_id`` -> (type, DUMP): what a job holds, to compare before/after."""
    pattern = strata_redis.Job(raw, job_id).keys.pattern
    keys = raw.keys(pattern)
    return {k: (raw.type(k), raw.dump(k)) for k in keys}


def _expiries(raw: Any, job_id: str) -> dict[str, int]:
    return {k: raw.pexpiretime(k) for k in _job_keys(raw, job_id)}


def _beat_until_killed(url: str, job_id: str) -> None:
    """A worker process: registers, heartbeats every 0.1 s, says so, waits to be killed."""
    job = strata_redis.connect(url, job_id, heartbeat_timeout=TIMEOUT)
    job.register_worker("doomed", heartbeat_interval=0.1).set_status("training")
    with decoding_client(url) as client:
        client.set(f"test:{{{job_id}}}:ready", "1")
    time.sleep(600)


def test_a_sigkilled_only_worker_reads_stale_within_its_timeout(
    redis_url: str, job_id: str, raw: Any
) -> None:
    proc = spawn(_beat_until_killed, redis_url, job_id)
    try:
        _stale_within_timeout(proc, redis_url, job_id, raw)
    finally:
        if proc.is_alive():
            kill9(proc)


def _stale_within_timeout(proc: Any, redis_url: str, job_id: str, raw: Any) -> None:
    wait_for(lambda: raw.get(f"test:{{{job_id}}}:ready") == "1", 60)
    # readers with their own (long) default: the job's stored 2 s timeout is what counts
    reader = strata_redis.connect(redis_url, job_id, heartbeat_timeout=60.0)
    dash = DashboardState(reader.client, heartbeat_timeout=60.0)
    assert reader.state() == "running"
    doc = document(dash.read(job_id))
    assert doc["jobs"][0]["state"] == "running" and doc["jobs"][0]["heartbeat_timeout_s"] == TIMEOUT
    assert doc["workers"][0]["status"] == "training"
    kill9(proc)
    killed = time.monotonic()
    # the child beat 0.1 s before the kill at most: stale a timeout later, + slack for a
    # stalled poller; judged by the readers' 60 s it would stay "running" far longer
    wait_for(lambda: reader.state() == "stale", TIMEOUT + 8, why=reader.state)
    assert time.monotonic() - killed <= TIMEOUT + 8
    snap = dash.read(job_id)
    doc = document(snap)
    assert doc["jobs"][0]["state"] == "stale"
    (w,) = doc["workers"]
    assert w["status"] == "stale" and w["stale"] is True
    assert doc["metrics"]["jobs"][0]["workers"]["stale"] == 1
    assert doc["metrics"]["jobs"][0]["workers"]["training"] == 0
    text = render_metrics(snap)[0].decode()
    assert f'strata_workers{{job_id="{job_id}",status="stale"}} 1.0' in text
    assert f'strata_job_state{{job_id="{job_id}",state="stale"}} 1.0' in text
    assert f'strata_job_heartbeat_timeout_seconds{{job_id="{job_id}"}} 2.0' in text
    # nobody reaped it: the registry still says training
    assert raw.hget(reader.keys.status, "doomed") == "training"
    out = strata("jobs", "--json", "--redis-url", redis_url, "--heartbeat-timeout", "60")
    assert out.returncode == 0, out.stderr
    (row,) = [r for r in orjson.loads(out.stdout)["jobs"] if r["job_id"] == job_id]
    assert row["state"] == "stale" and row["workers"] == {"live": 0, "silent": 1, "total": 1}
    reader.close()


def test_end_expires_every_key_and_a_new_worker_opens_the_job_again(
    job: strata_redis.Job, raw: Any, redis_url: str
) -> None:
    w = job.register_worker("w1", heartbeat_interval=None)
    strata_redis.ShardManager(job).register_dataset_params("ds", 100, 10)
    lease = job.leases("ds", 0, "w1").acquire()
    assert lease is not None and lease.complete()
    w.deregister()
    # a key of the job with an expiry of its own, sooner and later than the job's
    raw.set(f"strata:{{{job.job_id}}}:test_soon", "x", px=50_000)
    raw.set(f"strata:{{{job.job_id}}}:test_late", "x", px=10**9)
    other = strata_redis.connect(redis_url, job.job_id + "-other")
    other.register_worker("o", heartbeat_interval=None)
    others = _job_keys(raw, other.job_id)
    assert job.state() == "ended"  # every worker left, not ended yet: no expiry
    assert all(at == -1 for k, at in _expiries(raw, job.job_id).items() if "test_" not in k)

    expires = job.end(retention=100)
    assert job.state() == "ended"
    record = lifecycle.read_record(job.context)
    assert record is not None and record.state == "ended" and record.expires_ms == expires
    assert record.retention_s == 100 and record.heartbeat_timeout_s == 2.0
    at = _expiries(raw, job.job_id)
    soon = at.pop(f"strata:{{{job.job_id}}}:test_soon")
    late = at.pop(f"strata:{{{job.job_id}}}:test_late")
    assert len(at) > 8 and set(at.values()) == {expires}, at
    assert soon < expires and late == expires + 1
    assert _job_keys(raw, other.job_id) == others  # another job (a prefix) untouched
    assert set(_expiries(raw, other.job_id).values()) == {-1}
    assert job.end(retention=5) == expires  # ending an ended job keeps its end

    # a relaunch: a worker registers, the job runs again, its keys no longer expire
    again = strata_redis.connect(redis_url, job.job_id, heartbeat_timeout=3.0)
    again.register_worker("w2", heartbeat_interval=None)
    assert again.state() == "running"
    at = _expiries(raw, job.job_id)
    assert at.pop(f"strata:{{{job.job_id}}}:test_soon") == soon
    assert at.pop(f"strata:{{{job.job_id}}}:test_late") == expires + 1
    assert set(at.values()) == {-1}, at
    record = lifecycle.read_record(job.context)
    assert record is not None and record.state == "running" and record.reopened == 1
    assert record.heartbeat_timeout_s == 3.0 and record.expires_ms is None
    again.close()
    other.close()


def test_an_end_racing_a_reopening_moves_the_keys_it_had_not_cleared(
    job: strata_redis.Job, raw: Any
) -> None:
    job.register_worker("w", heartbeat_interval=None).deregister()
    first = job.end(retention=100)
    keys = sorted(_job_keys(raw, job.job_id))
    # a reopening whose persist walk has not reached the keys yet: only its script ran
    reply = job.scripts.call("open_job", [job.keys.job], [2000, 50])
    assert reply[:2] == [0, 1]
    at = _expiries(raw, job.job_id)
    assert at.pop(job.keys.job) == -1 and set(at.values()) == {first}  # the record: running
    second = job.end(retention=50)
    assert second != first
    at = _expiries(raw, job.job_id)
    assert sorted(at) == keys and set(at.values()) == {second}, at


def test_an_ended_jobs_keys_are_gone_after_its_retention(job: strata_redis.Job, raw: Any) -> None:
    job.register_worker("w", heartbeat_interval=None).deregister()
    assert _job_keys(raw, job.job_id)
    job.end(retention=0.5)
    wait_for(lambda: not _job_keys(raw, job.job_id), 10, why=lambda: _job_keys(raw, job.job_id))


def test_retention_is_checked_and_read_from_the_environment(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="retention"):
        strata_redis.connect(redis_url, "r", retention=-1)
    with pytest.raises(TypeError, match="retention"):
        strata_redis.connect(redis_url, "r", retention="3d")  # type: ignore[arg-type]
    monkeypatch.setenv("STRATA_JOB_RETENTION", "60")
    assert strata_redis.connect(redis_url, "r").context.retention == 60.0
    monkeypatch.setenv("STRATA_JOB_RETENTION", "soon")
    with pytest.raises(ValueError, match="STRATA_JOB_RETENTION"):
        strata_redis.connect(redis_url, "r")


def _loop(orch: strata_redis.TrainingOrchestrator, epochs: int) -> None:
    stream = orch.get_shards("ds", batch_size=10)
    for _ in range(orch.epoch, epochs):
        for _batch in stream:
            pass
        orch.advance_epoch()


@pytest.mark.single_only("two in-process orchestrators; the lifecycle scripts run on both")
def test_the_orchestrator_ends_the_job_when_its_last_rank_closes_after_the_loop(
    redis_url: str, raw: Any, tmp_path: Path
) -> None:
    job_id = "orch-life"
    setup = strata_redis.connect(redis_url, job_id)
    strata_redis.ShardManager(setup).register_dataset_params("ds", 200, 10)
    orchs: dict[str, strata_redis.TrainingOrchestrator] = {}

    def start(name: str) -> None:
        orchs[name] = strata_redis.TrainingOrchestrator(
            redis_url, name, job_id=job_id, checkpoint_path=str(tmp_path), min_workers=2,
            heartbeat_timeout=5.0, job_retention=1000,
        )  # fmt: skip

    threads = [threading.Thread(target=start, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(orchs) == {"a", "b"}
    runs = [threading.Thread(target=_loop, args=(o, 2)) for o in orchs.values()]
    for t in runs:
        t.start()
    for t in runs:
        t.join(120)
    orchs["a"].close()
    record = lifecycle.read_record(setup.context)
    assert record is not None and record.state == "running"  # one rank of two left
    assert setup.state() == "running"
    orchs["b"].close()
    record = lifecycle.read_record(setup.context)
    assert record is not None and record.state == "ended" and record.retention_s == 1000
    assert setup.state() == "ended"
    assert record.expires_ms is not None and -1 not in _expiries(raw, job_id).values()
    expired = record.expires_ms

    # a relaunch opens it again; leaving by an exception does not end it
    with (
        pytest.raises(RuntimeError, match="boom"),
        strata_redis.TrainingOrchestrator(
            redis_url, "a", job_id=job_id, checkpoint_path=str(tmp_path), heartbeat_timeout=5.0
        ) as orch,
    ):
        assert setup.state() == "running"
        _loop(orch, orch.epoch + 1)
        raise RuntimeError("boom")
    record = lifecycle.read_record(setup.context)
    assert record is not None and record.state == "running" and record.reopened == 1
    assert expired not in _expiries(raw, job_id).values()  # the end's expiry is cleared
    setup.close()


def test_jobs_lists_every_job_with_its_state_and_newest_checkpoint(
    redis_url: str, raw: Any, tmp_path: Path
) -> None:
    running = strata_redis.connect(redis_url, "run-1", heartbeat_timeout=30.0)
    running.register_worker("w1", heartbeat_interval=None)
    running.register_worker("w2", heartbeat_interval=None).deregister()
    running.advance_epoch("w1", timeout=10)
    ended = strata_redis.connect(redis_url, "finished-" + "x" * 90)
    ended.register_worker("w", heartbeat_interval=None).deregister()
    ended.end()
    # a job with checkpoints only: no worker ever registered
    ckpt = strata_redis.CheckpointManager(str(tmp_path), job_id="ckpt-only", redis=redis_url)
    ckpt.save(b"state", step=500, epoch=2).result()
    ckpt.close()

    out = strata("jobs", "--json", "--redis-url", redis_url)
    assert out.returncode == 0, out.stderr
    doc = orjson.loads(out.stdout)
    rows = {r["job_id"]: r for r in doc["jobs"]}
    assert set(rows) == {"run-1", ended.job_id, "ckpt-only"}
    r = rows["run-1"]
    assert r["state"] == "running" and r["workers"] == {"live": 1, "silent": 0, "total": 2}
    assert r["epoch"] == 1 and r["checkpoint"] is None and r["heartbeat_timeout_s"] == 30.0
    assert isinstance(r["last_activity_ms"], int) and 0 <= r["idle_s"] < 60
    e = rows[ended.job_id]
    assert e["state"] == "ended" and e["expires_ms"] > e["ended_ms"] > 0
    c = rows["ckpt-only"]
    assert c["state"] == "idle" and c["workers"]["total"] == 0
    assert c["checkpoint"]["epoch"] == 2 and c["checkpoint"]["step"] == 500
    assert set(r) == {
        "job_id", "state", "workers", "epoch", "last_activity_ms", "idle_s", "checkpoint",
        "heartbeat_timeout_s", "ended_ms", "expires_ms",
    }  # fmt: skip

    text = strata("jobs", "--redis-url", redis_url)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["JOB", "STATE", "LIVE/ALL", "EPOCH", "ACTIVE", "CHECKPOINT"]
    assert all(len(line) <= 80 for line in lines), lines
    by_job = {line.split()[0]: line.split() for line in lines[1:]}
    # columns line up: each state starts under STATE, each epoch ends under EPOCH
    state_at, epoch_end = lines[0].index("STATE"), lines[0].index("EPOCH") + len("EPOCH")
    for line in lines[1:]:
        words = line.split()
        assert line[state_at:].startswith(words[1]) and line[:epoch_end].endswith(words[3])
    assert by_job["run-1"][1:4] == ["running", "1/2", "1"]
    assert by_job["ckpt-only"][1] == "idle" and by_job["ckpt-only"][-2:] == ["e2", "s500"]
    assert any(j.startswith("finished-x") and j.endswith("~") for j in by_job)
    # strata status lists them all too, the checkpoint-only one included
    listed = strata("status", "--redis-url", redis_url)
    assert listed.stdout.split() == sorted(rows), listed.stderr
    running.close()
    ended.close()


def test_jobs_rm_deletes_one_job_and_nothing_of_the_others(redis_url: str, raw: Any) -> None:
    # ids that are prefixes of one another and that hold glob characters
    ids = ["a", "a*", "ab", "a?", "a[b]", "a\\"]
    for job_id in ids:
        job = strata_redis.connect(redis_url, job_id)
        job.register_worker("w", heartbeat_interval=None).deregister()
        strata_redis.ShardManager(job).register_dataset_params("ds", 100, 10)
        job.close()
    before = {j: _job_keys(raw, j) for j in ids}
    assert all(len(keys) > 5 for keys in before.values())
    for victim in ("a*", "a"):
        out = strata("jobs", "rm", victim, "--yes", "--redis-url", redis_url)
        assert out.returncode == 0, out.stderr
        assert f"deleted {len(before[victim])} keys" in out.stdout
        assert _job_keys(raw, victim) == {}
        for j in ids:
            if j not in ("a*", "a"):
                assert _job_keys(raw, j) == before[j], j
    assert _job_keys(raw, "a?") == before["a?"]
    listed = orjson.loads(strata("jobs", "--json", "--redis-url", redis_url).stdout)
    assert {r["job_id"] for r in listed["jobs"]} == {"ab", "a?", "a[b]", "a\\"}
    gone = strata("jobs", "rm", "a", "--yes", "--redis-url", redis_url)
    assert gone.returncode == 1 and "nothing to delete" in gone.stderr


def test_jobs_rm_refuses_live_workers_and_asks_without_yes(redis_url: str, raw: Any) -> None:
    job = strata_redis.connect(redis_url, "busy", heartbeat_timeout=30.0)
    job.register_worker("w", heartbeat_interval=None)
    before = _job_keys(raw, "busy")
    refused = strata("jobs", "rm", "busy", "--yes", "--redis-url", redis_url)
    assert refused.returncode == 1 and "1 live worker" in refused.stderr
    assert "--force" in refused.stderr
    unasked = strata("jobs", "rm", "busy", "--force", "--redis-url", redis_url)
    assert unasked.returncode == 1 and "--yes" in unasked.stderr
    assert _job_keys(raw, "busy") == before
    forced = strata("jobs", "rm", "busy", "--force", "--yes", "--redis-url", redis_url)
    assert forced.returncode == 0, forced.stderr
    assert _job_keys(raw, "busy") == {}
    bad = strata("jobs", "rm", "a{b", "--yes", "--redis-url", redis_url)
    assert bad.returncode == 2 and "job_id" in bad.stderr
    usage = strata("jobs", "rm", "--redis-url", redis_url)
    assert usage.returncode == 2
    job.close()

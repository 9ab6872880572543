"""State that goes back is detected, never trained on: every script ticks the job's clock and
every process remembers the highest tick it saw, so a Redis that restarts from an older
snapshot (or fails over to a replica that lagged) answers ``StateRolledBackError`` at the
next call of any process that saw newer state; the era is marked rolled back, so every
other process (and any new one) stops too. Checkpoints record the clock, so a relaunch
after a rollback no live process saw is caught by the first rank that resumes. A Redis that
may evict the job's keys is refused at connect."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import pytest
import redis

import strata_redis
from strata_redis.errors import RedisConfigError
from strata_redis.keys import Keys
from strata_redis.server import RedisServer

from .procs import CTX, join_all, spawn, wait_for

JOB = "rollback-job"


def _job(url: str, shards: int = 1) -> strata_redis.Job:
    """A process's view of the job: its own client and era, the dataset registered."""
    job = strata_redis.connect(url, JOB, heartbeat_timeout=3.0)
    strata_redis.ShardManager(job).register_dataset_params("ds", shards * 10, 10)
    return job


def _snapshot(server: RedisServer) -> Path:
    """Save the server's state now (SAVE, synchronous) and keep a copy of the file."""
    with redis.Redis.from_url(server.url) as raw:
        raw.save()
    copy = server.dir / "older.rdb"
    shutil.copy(server.dir / "dump.rdb", copy)
    return copy


def _roll_back(server: RedisServer, snapshot: Path) -> None:
    """Crash the server and start it from the older snapshot: what a failover to a replica
    that lagged, or a restart from an older RDB, does to the job's state."""
    server.kill()
    shutil.copy(snapshot, server.dir / "dump.rdb")
    server.start()


def test_a_restart_from_an_older_snapshot_stops_every_process_and_marks_the_era(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory()
    a, b = _job(server.url, shards=6), _job(server.url, shards=6)
    a.register_worker("a", heartbeat_interval=None)
    b.register_worker("b", heartbeat_interval=None)
    leases_a, leases_b = a.leases("ds", 0, "a"), b.leases("ds", 0, "b")
    first = leases_a.acquire()
    assert first is not None and leases_a.complete(first)
    older = _snapshot(server)
    # a goes on past the snapshot: a completion and a grant that the rollback will lose
    second = leases_a.acquire()
    assert second is not None and leases_a.complete(second)
    third = leases_a.acquire()
    assert third is not None
    seen = a.context.era.mark
    _roll_back(server, older)

    # a saw newer state than Redis holds: refused before anything is granted or recorded
    with pytest.raises(strata_redis.StateRolledBackError) as info:
        leases_a.acquire()
    err = info.value
    assert isinstance(err, strata_redis.StateLostError)  # the same family as a loss
    assert err.seen == seen and err.clock is not None and err.clock < seen, (err.clock, seen)
    assert f"{seen - err.clock} script calls behind" in str(err)
    assert f"strata jobs rm {JOB} --yes --force" in str(err)
    # b's last call was before the snapshot: alone it could not tell, but the era is marked
    with pytest.raises(strata_redis.StateRolledBackError) as info_b:
        leases_b.acquire()
    assert (info_b.value.clock, info_b.value.seen) == (err.clock, seen)
    # a process started now is refused too: it never adopts the rolled-back state
    with pytest.raises(strata_redis.StateRolledBackError):
        _job(server.url)
    # nothing was recorded after the rollback: shard 1's completion is gone, not redone
    fresh = redis.Redis.from_url(server.url, decode_responses=True)
    era = fresh.get(a.keys.era)
    assert era is not None and era.startswith(a.context.era.value() + "!rolled-back:")
    assert a.state() == "lost"  # what `strata jobs`, status and the dashboard show
    for job in (a, b):
        job.close()
    fresh.close()


def train_epochs(url: str, path: str, worker_id: str, epochs: int, out: Queue[Any]) -> None:
    """A worker process: the README loop over ``epochs`` epochs of "ds" (a short sleep per
    batch stands for training); report every (epoch, sample) it trained, and how it stopped."""
    trained: list[tuple[int, int]] = []
    error = "none"
    try:
        # 10 s: a worker stalled on a loaded machine is not declared failed before the
        # rollback (it would stop with RoundBrokenError, not StateRolledBackError)
        with strata_redis.TrainingOrchestrator(
            coordinator_url=url, job_id=JOB, worker_id=worker_id, min_workers=3,
            last_call=0.5, heartbeat_timeout=10.0, checkpoint_path=path, resume=False,
        ) as orch:  # fmt: skip
            strata_redis.ShardManager(orch).register_dataset_params(
                "ds", total_samples=6000, samples_per_shard=10, shuffle=True, seed=1
            )
            stream = orch.get_shards("ds", batch_size=10)
            for epoch in range(epochs):
                for batch in stream:
                    time.sleep(0.02)
                    trained.extend((epoch, int(i)) for i in batch)
                orch.advance_epoch()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    out.put((worker_id, trained, error))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("boundary", [False, True], ids=["in-an-epoch", "across-epochs"])
def test_three_workers_stop_on_a_rollback_and_train_no_shard_twice(
    redis_factory: Callable[..., RedisServer], boundary: bool, tmp_path: Path
) -> None:
    """Three worker processes drain epochs; Redis is rolled back to a snapshot taken while
    they ran (in the same epoch, or one epoch before): each stops with StateRolledBackError
    within its next calls, and no sample of any epoch was trained twice (the completions
    after the snapshot are lost, and never granted again)."""
    server = redis_factory()
    out: Queue[Any] = CTX.Queue()
    ids = ["w0", "w1", "w2"]
    procs = [spawn(train_epochs, server.url, str(tmp_path), w, 4, out) for w in ids]
    raw = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        keys = Keys(JOB)
        meta = keys.lease_keys("ds", 0).meta

        def done() -> int:
            return int(raw.hget(meta, "done") or 0)

        # every one leases: each has completed a shard
        wait_for(
            lambda: all(raw.hget(meta, f"by:{w}") for w in ids), 60, why=lambda: raw.hgetall(meta)
        )
        older = _snapshot(server)
        at_snapshot = int(raw.get(keys.epoch) or 0)
        if boundary:  # the job moves to the next epoch past the snapshot
            wait_for(lambda: int(raw.get(keys.epoch) or 0) > at_snapshot, 60)
            time.sleep(0.3)
        else:
            # completions past the snapshot (the rollback loses them), polled for: a fixed
            # sleep on a loaded machine may run past the epoch's end (~4 s of 0.02 s batches)
            before = done()
            wait_for(lambda: done() >= before + 60, 30, why=done)
            assert int(raw.get(keys.epoch) or 0) == at_snapshot  # still in the same epoch
        _roll_back(server, older)
        rolled = time.monotonic()
        reports = {}
        for _ in ids:
            worker_id, *rest = out.get(timeout=60)
            reports[worker_id] = rest
        took = time.monotonic() - rolled
        assert join_all(procs, timeout=30) == [0, 0, 0]
    finally:
        join_all(procs, timeout=1)
        raw.close()
    for worker_id, (_, error) in reports.items():
        assert error.startswith("StateRolledBackError: "), (worker_id, error)
    assert took < 30, took
    print(f"every loop stopped {took:.2f} s after the rollback")  # for the README's figure
    trained = [item for samples, _ in reports.values() for item in samples]
    assert trained and len(trained) == len(set(trained)), "a sample was trained twice"


def _train(url: str, path: Path, steps: int) -> strata_redis.CheckpointInfo | None:
    """The README loop, cut short: one worker trains ``steps`` batches, saving a checkpoint
    after each; returns the newest committed checkpoint."""
    with strata_redis.TrainingOrchestrator(
        coordinator_url=url, job_id=JOB, worker_id="solo", checkpoint_path=str(path),
        heartbeat_timeout=3.0,
    ) as orch:  # fmt: skip
        strata_redis.ShardManager(orch).register_dataset_params(
            "ds", total_samples=400, samples_per_shard=10, shuffle=False
        )
        for step, _batch in enumerate(orch.get_shards("ds", batch_size=10), start=1):
            orch.save_checkpoint(step=step, epoch=0)
            if step == steps:
                break
        orch.wait_for_checkpoints(30)
        return orch.checkpoints.latest()


def test_a_relaunch_after_a_rollback_no_process_saw_is_caught_by_the_checkpoint(
    redis_factory: Callable[..., RedisServer], tmp_path: Path
) -> None:
    """The job stops cleanly; then Redis comes back from a snapshot older than its newest
    checkpoint. The relaunch finds the checkpoint's clock ahead of Redis' and stops with
    StateRolledBackError before it trains anything."""
    server = redis_factory()
    first = _train(server.url, tmp_path, 2)
    assert first is not None and first.step == 2
    older = _snapshot(server)
    second = _train(server.url, tmp_path, 3)  # the relaunch resumes, trains on, saves
    assert second is not None and (second.step, second.run) == (3, 1), second
    assert second.era == first.era != "" and second.clock > first.clock > 0
    _roll_back(server, older)
    # Redis' index went back with it (it names the first run's step 2); storage holds the
    # second run's step 3, whose clock Redis no longer reaches
    with pytest.raises(strata_redis.StateRolledBackError) as info:
        _train(server.url, tmp_path, 1)
    assert info.value.seen == second.clock, (info.value.seen, second.clock)
    assert info.value.clock is not None and info.value.clock < second.clock


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru", "allkeys-random"])
def test_a_redis_that_may_evict_the_jobs_keys_is_refused(
    redis_factory: Callable[..., RedisServer], policy: str,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    server = redis_factory(extra=["--maxmemory", "200mb", "--maxmemory-policy", policy])
    monkeypatch.delenv("STRATA_ALLOW_EVICTION", raising=False)
    with pytest.raises(RedisConfigError) as info:
        _job(server.url)
    assert info.value.setting == "maxmemory-policy" and info.value.value == policy
    assert policy in str(info.value) and "STRATA_ALLOW_EVICTION=1" in str(info.value)
    with redis.Redis.from_url(server.url) as raw:
        assert raw.keys("strata:*") == [b"strata:{" + JOB.encode() + b"}:era"]  # nothing else
    # the explicit opt-out: it runs, with one warning naming the policy
    monkeypatch.setenv("STRATA_ALLOW_EVICTION", "1")
    with caplog.at_level(logging.WARNING, logger="strata_redis.era"):
        job = _job(server.url)
        job.register_worker("w", heartbeat_interval=None)
    warned = [r for r in caplog.records if policy in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    job.close()


def test_noeviction_and_no_limit_pass_without_a_word(
    redis_factory: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.delenv("STRATA_ALLOW_EVICTION", raising=False)
    quiet = redis_factory(extra=["--maxmemory", "200mb", "--maxmemory-policy", "noeviction"])
    with caplog.at_level(logging.WARNING, logger="strata_redis.era"):
        _job(quiet.url).close()
    assert not caplog.records
    # a policy that evicts, but no limit yet: it would only evict once one is set: a warning
    unlimited = redis_factory(extra=["--maxmemory-policy", "allkeys-lru"])
    with caplog.at_level(logging.WARNING, logger="strata_redis.era"):
        _job(unlimited.url).close()
    assert [r for r in caplog.records if "no maxmemory yet" in r.getMessage()]


@pytest.mark.parametrize("anchor", ["fence", "generation", "epoch"])
def test_an_anchor_gone_while_the_era_stands_is_a_lost_state(
    redis_factory: Callable[..., RedisServer], anchor: str
) -> None:
    """Part of the state gone (evicted under STRATA_ALLOW_EVICTION, expired, deleted by hand):
    the job's fencing counter, generation or epoch missing is seen by the next script call of
    every process, never papered over (a fencing counter made again would hand out tokens
    that old leases hold)."""
    server = redis_factory()
    a, b = _job(server.url, shards=4), _job(server.url, shards=4)
    a.register_worker("a", heartbeat_interval=None)
    b.register_worker("b", heartbeat_interval=None)
    a.context.client.set(a.keys.epoch, 0)  # what a restore does: a plain SET
    leases = a.leases("ds", 0, "a")
    lease = leases.acquire()
    assert lease is not None and leases.complete(lease)  # every anchor made and noted
    with redis.Redis.from_url(server.url) as raw:
        raw.delete(getattr(a.keys, anchor))
    with pytest.raises(strata_redis.StateLostError) as info:
        leases.acquire()
    assert not isinstance(info.value, strata_redis.StateRolledBackError)
    assert f"its {anchor} key" in str(info.value) and "era stands" in str(info.value)
    with pytest.raises(strata_redis.StateLostError, match=f"its {anchor} key"):
        b.leases("ds", 0, "b").acquire()
    with pytest.raises(strata_redis.StateLostError, match=f"its {anchor} key"):
        _job(server.url)  # a new process is told too
    assert a.state() == "lost"
    a.close()
    b.close()

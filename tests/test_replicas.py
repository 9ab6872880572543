"""The durability knob: ``min_replicas`` makes lease grants, completions and checkpoint
commits ``WAIT`` for replicas; a replica that does not keep up is logged and counted."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

import strata_redis
from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.server import RedisServer

from .procs import wait_for


def test_min_replicas_waits_for_replicas_and_reports_a_stalled_one(
    redis_factory: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    primary = redis_factory()
    replica = redis_factory(extra=["--replicaof", "127.0.0.1", str(primary.port)])
    copy = redis.Redis.from_url(replica.url, decode_responses=True)
    wait_for(lambda: copy.info("replication")["master_link_status"] == "up", 30)
    # a replica's ack may be late on a loaded machine: 10 s while it is meant to keep up,
    # 0.5 s (``stalled``) once it is stopped
    job = strata_redis.connect(primary.url, "rep", min_replicas=1, replica_timeout=10)
    strata_redis.ShardManager(job).register_dataset_params("ds", 40, 10)
    job.register_worker("w", heartbeat_interval=None)
    leases = job.leases("ds", 0, "w")
    lease = leases.acquire()
    assert lease is not None
    # WAIT returned: the grant is on the replica when acquire returns
    assert copy.hget(leases.keys.holders, str(lease.shard_id)) is not None
    assert job.context.scripts.shortfalls == 0

    stalled = strata_redis.connect(primary.url, "rep", min_replicas=1, replica_timeout=0.5)
    assert replica.proc is not None
    os.kill(replica.proc.pid, signal.SIGSTOP)  # the replica stops acknowledging
    try:
        with caplog.at_level(logging.WARNING, logger="strata_redis.era"):
            start = time.monotonic()
            # done on the primary all the same
            assert stalled.leases("ds", 0, "w").complete(lease, prefetch=False)
            waited = time.monotonic() - start
        assert waited >= 0.4, waited  # it waited for the replica, up to the timeout
        assert stalled.context.scripts.shortfalls == 1
        assert job.context.scripts.shortfalls == 0  # a view of its own: 10 s was never out
        assert "acquire_shard: 0 of 1 replicas had its writes" in caplog.text
        # without the knob nothing waits and nothing is counted
        plain = strata_redis.connect(primary.url, "rep")
        other = plain.leases("ds", 0, "w").acquire()
        assert other is not None and plain.context.scripts.shortfalls == 0
        plain.close()
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    copy.close()
    stalled.close()
    job.close()


@pytest.fixture
def replicated(
    redis_factory: Callable[..., RedisServer],
) -> Iterator[tuple[RedisServer, RedisServer, redis.Redis]]:
    """A primary, a replica in sync with it, and a client reading the replica."""
    primary = redis_factory()
    replica = redis_factory(extra=["--replicaof", "127.0.0.1", str(primary.port)])
    copy = redis.Redis.from_url(replica.url, decode_responses=True)
    wait_for(lambda: copy.info("replication")["master_link_status"] == "up", 30)
    yield primary, replica, copy
    assert replica.proc is not None
    os.kill(replica.proc.pid, signal.SIGCONT)  # whatever the test did, let it stop cleanly
    copy.close()


@pytest.mark.timeout(120)
def test_a_committed_checkpoint_is_on_the_replica_when_the_commit_returns(
    replicated: tuple[RedisServer, RedisServer, redis.Redis], tmp_path: Path
) -> None:
    primary, replica, copy = replicated
    job = strata_redis.connect(primary.url, "rep-ckpt", min_replicas=1, replica_timeout=20.0)
    ckpt = strata_redis.CheckpointManager(tmp_path, redis=job, worker_id="w")
    info = ckpt.save(b"model-1", step=1, epoch=0).result(timeout=60)
    # read the replica right after: the commit record is there
    assert copy.zscore(job.keys.checkpoints, info.id.member) == 0  # every member scores 0
    assert copy.hget(job.keys.checkpoint_info, info.id.member) is not None
    assert info.step == 1 and job.context.scripts.shortfalls == 0

    # a replica that is late (stopped for a second) holds the commit up until it has it
    assert replica.proc is not None
    os.kill(replica.proc.pid, signal.SIGSTOP)
    resume = threading.Timer(1.0, os.kill, (replica.proc.pid, signal.SIGCONT))
    resume.start()
    try:
        start = time.monotonic()
        ckpt.save(b"model-2", step=2, epoch=0).result(timeout=60)
        waited = time.monotonic() - start
    finally:
        resume.join()
    assert copy.zscore(job.keys.checkpoints, CheckpointId(2, 0).member) == 0
    assert waited >= 0.8, waited  # without the WAIT it returns long before the replica runs
    assert job.context.scripts.shortfalls == 0
    ckpt.close()
    job.close()


@pytest.mark.timeout(120)
def test_a_checkpoint_commit_with_a_stalled_replica_completes_and_is_reported(
    replicated: tuple[RedisServer, RedisServer, redis.Redis],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary, replica, _ = replicated
    job = strata_redis.connect(primary.url, "rep-ckpt", min_replicas=1, replica_timeout=0.5)
    ckpt = strata_redis.CheckpointManager(tmp_path, redis=job, worker_id="w")
    assert replica.proc is not None
    os.kill(replica.proc.pid, signal.SIGSTOP)  # the replica stops acknowledging
    try:
        with caplog.at_level(logging.WARNING, logger="strata_redis.era"):
            start = time.monotonic()
            info = ckpt.save(b"model", step=7, epoch=0).result(timeout=60)  # nothing raises
            waited = time.monotonic() - start
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    assert info.step == 7 and ckpt.latest() == info  # committed on the primary
    assert waited >= 0.4, waited  # it waited for the replica, up to replica_timeout
    assert job.context.scripts.shortfalls == 1
    assert "commit_checkpoint: 0 of 1 replicas had its writes" in caplog.text
    ckpt.close()
    job.close()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"min_replicas": -1}, "min_replicas"),
        ({"min_replicas": 1, "replica_timeout": 0}, "replica_timeout"),
    ],
)
def test_bad_durability_arguments_are_refused(
    redis_url: str, options: dict[str, float], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        strata_redis.connect(redis_url, "rep", **options)  # type: ignore[arg-type]

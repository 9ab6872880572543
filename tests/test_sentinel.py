"""Redis Sentinel: a ``redis+sentinel://`` URL gives a client that follows failovers. A job
keeps working on the promoted replica when it had synced (its era is there, so nothing is
lost), and stops with ``StateLostError`` when the promoted replica had not synced the job's
state — never a silent restart on an empty primary."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator

import pytest
import redis

import strata_redis
from strata_redis.server import RedisSentinelServer, RedisServer

from .procs import wait_for


@pytest.fixture
def failover_pair(
    redis_factory: Callable[..., RedisServer],
) -> Iterator[tuple[RedisServer, RedisServer, RedisSentinelServer]]:
    """A primary, a replica of it, and a sentinel watching the primary."""
    primary = redis_factory()
    replica = redis_factory(extra=["--replicaof", "127.0.0.1", str(primary.port)])
    with redis.Redis(port=replica.port, decode_responses=True) as copy:
        wait_for(lambda: copy.info("replication")["master_link_status"] == "up", 30)
    sentinel = RedisSentinelServer(primary.port).start()
    # the sentinel must know the replica before it can promote it
    with redis.Redis(port=sentinel.port, decode_responses=True) as s:
        wait_for(lambda: len(s.sentinel_slaves(sentinel.service)) == 1, 30)
    yield primary, replica, sentinel
    sentinel.close()


def _retry(fn: Callable[[], object], seconds: float = 30.0) -> object:
    """Call ``fn`` until it stops failing on a connection (the failover under way)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _failover(primary: RedisServer, replica: RedisServer, sentinel: RedisSentinelServer) -> None:
    assert primary.proc is not None
    os.kill(primary.proc.pid, signal.SIGKILL)
    wait_for(lambda: sentinel.primary() == ("127.0.0.1", replica.port), 60,
             why=sentinel.primary)  # fmt: skip


@pytest.mark.timeout(180)
def test_a_job_follows_a_failover_to_a_synced_replica(
    failover_pair: tuple[RedisServer, RedisServer, RedisSentinelServer],
) -> None:
    primary, replica, sentinel = failover_pair
    job = strata_redis.connect(sentinel.url, "sentinel-job", heartbeat_timeout=20.0)
    assert "redis+sentinel://" in repr(job)
    strata_redis.ShardManager(job).register_dataset_params("ds", 100, 10)
    worker = job.register_worker("w", heartbeat_interval=0.2)
    leases = job.leases("ds", 0, "w")
    first = leases.acquire()
    assert first is not None and leases.complete(first)
    era = job.context.era.value()
    with redis.Redis(port=replica.port, decode_responses=True) as copy:
        wait_for(lambda: copy.hlen(leases.keys.done) == 1, 10)  # replicated

    _failover(primary, replica, sentinel)
    second = _retry(leases.acquire)
    assert isinstance(second, strata_redis.Lease) and leases.complete(second)
    assert sorted(leases.completions()) == sorted({first.shard_id, second.shard_id})
    with redis.Redis(port=replica.port, decode_responses=True) as promoted:
        assert promoted.get(job.keys.era) == era  # the same era: nothing was lost
        # heartbeats resumed on the new primary
        wait_for(lambda: (promoted.zscore(job.keys.heartbeats, "w") or 0) > 0, 20)
        seen = promoted.zscore(job.keys.heartbeats, "w")
        wait_for(lambda: promoted.zscore(job.keys.heartbeats, "w") != seen, 20)
    assert worker.lost is None
    worker.leave()
    job.close()


@pytest.mark.timeout(180)
def test_a_failover_to_a_replica_without_the_jobs_state_is_state_lost(
    failover_pair: tuple[RedisServer, RedisServer, RedisSentinelServer],
) -> None:
    primary, replica, sentinel = failover_pair
    job = strata_redis.connect(sentinel.url, "sentinel-lost", heartbeat_timeout=20.0)
    worker = job.register_worker("w", heartbeat_interval=None)
    with redis.Redis(port=replica.port, decode_responses=True) as copy:
        wait_for(lambda: copy.exists(job.keys.era) == 1, 10)
        # a replica that never got the job's state (it lagged, or resynced from scratch):
        # made here by writing to the replica itself, which replication never repairs
        copy.config_set("replica-read-only", "no")
        copy.flushall()
    _failover(primary, replica, sentinel)
    with pytest.raises(strata_redis.StateLostError) as info:
        _retry(worker.heartbeat)
    assert info.value.found is None and "Redis holds no state for it now" in str(info.value)
    job.close()


def test_bad_sentinel_urls_are_refused() -> None:
    for url in (
        "redis+sentinel://127.0.0.1:26379",  # no service
        "redis+sentinel://127.0.0.1:26379/svc/x",  # db not a number
        "redis+sentinel://127.0.0.1:99999/svc",
    ):
        with pytest.raises(ValueError, match="redis"):
            strata_redis.connect(url, "x")
    with pytest.raises(ValueError) as info:
        strata_redis.connect("redis+sentinel://user:s3cret@127.0.0.1:26379", "x")
    assert "s3cret" not in str(info.value)

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
from strata_redis.server import RedisSentinels, RedisServer

from .procs import wait_for

Pair = tuple[RedisServer, RedisServer, RedisSentinels]


@pytest.fixture
def failover_pair(redis_factory: Callable[..., RedisServer]) -> Iterator[Pair]:
    """A primary, a replica of it, and three sentinels watching the primary (quorum 2); the
    job's URL lists all three."""
    primary = redis_factory()
    replica = redis_factory(extra=["--replicaof", "127.0.0.1", str(primary.port)])
    with redis.Redis(port=replica.port, decode_responses=True) as copy:
        wait_for(lambda: copy.info("replication")["master_link_status"] == "up", 30)
    # every sentinel must know the replica (and the others) before they can promote it
    sentinels = RedisSentinels(primary.port, count=3, quorum=2).start(replicas=1, timeout=60)
    assert sentinels.url.count(",") == 2
    yield primary, replica, sentinels
    sentinels.close()


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


def _failover(primary: RedisServer, replica: RedisServer, sentinel: RedisSentinels) -> None:
    assert primary.proc is not None
    os.kill(primary.proc.pid, signal.SIGKILL)
    wait_for(lambda: sentinel.primary() == ("127.0.0.1", replica.port), 60,
             why=sentinel.primary)  # fmt: skip


@pytest.mark.timeout(180)
@pytest.mark.parametrize("first_sentinel_down", [False, True], ids=["all-sentinels", "one-down"])
def test_a_job_follows_a_failover_to_a_synced_replica(
    failover_pair: Pair, first_sentinel_down: bool
) -> None:
    """The job goes on on the promoted replica (the same era: nothing lost); with the first
    sentinel of the URL killed before it connects, the client asks the others, and two of
    three are a quorum and a majority for the failover."""
    primary, replica, sentinels = failover_pair
    if first_sentinel_down:
        sentinels.sentinels[0].kill()
        assert len(sentinels.live) == 2
    job = strata_redis.connect(sentinels.url, "sentinel-job", heartbeat_timeout=20.0)
    assert "redis+sentinel://" in repr(job)
    strata_redis.ShardManager(job).register_dataset_params("ds", 100, 10)
    worker = job.register_worker("w", heartbeat_interval=0.2)
    leases = job.leases("ds", 0, "w")
    first = leases.acquire()
    assert first is not None and leases.complete(first)
    era = job.context.era.value()
    with redis.Redis(port=replica.port, decode_responses=True) as copy:
        wait_for(lambda: copy.bitcount(leases.keys.done) == 1, 10)  # replicated

    _failover(primary, replica, sentinels)
    second = _retry(leases.acquire)
    assert isinstance(second, strata_redis.Lease) and leases.complete(second)
    assert sorted(leases.completions()) == sorted({first.shard_id, second.shard_id})
    with redis.Redis(port=replica.port, decode_responses=True) as promoted:
        assert promoted.get(job.keys.era) == era  # the same era: nothing was lost
        assert promoted.bitcount(leases.keys.done) == 2  # the calls went to the promoted one
        # heartbeats resumed on the new primary
        wait_for(lambda: (promoted.zscore(job.keys.heartbeats, "w") or 0) > 0, 20)
        seen = promoted.zscore(job.keys.heartbeats, "w")
        wait_for(lambda: promoted.zscore(job.keys.heartbeats, "w") != seen, 20)
    assert worker.lost is None
    worker.leave()
    job.close()


@pytest.mark.timeout(180)
def test_a_failover_to_a_replica_without_the_jobs_state_is_state_lost(
    failover_pair: Pair,
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


@pytest.mark.timeout(180)
def test_a_failover_to_a_replica_that_really_missed_the_jobs_writes_is_state_lost(
    failover_pair: Pair,
) -> None:
    """No simulated flush: the replica is frozen and cut off from the primary before the job
    starts, so it never receives the job's writes; the primary then dies, the replica
    resumes and is promoted with nothing of the job."""
    primary, replica, sentinels = failover_pair
    assert replica.proc is not None
    os.kill(replica.proc.pid, signal.SIGSTOP)
    try:
        with redis.Redis(port=primary.port, decode_responses=True) as source:
            # drop the replication link, so nothing written from now on sits in a socket
            # buffer for the frozen replica to read when it resumes
            source.client_kill_filter(_type="replica")
            wait_for(lambda: source.info("replication")["connected_slaves"] == 0, 10)
            job = strata_redis.connect(sentinels.url, "sentinel-unsynced", heartbeat_timeout=20.0)
            worker = job.register_worker("w", heartbeat_interval=None)
            worker.heartbeat()
            assert source.get(job.keys.era) == job.context.era.value()  # on the primary
        _failover_from_frozen(primary, replica)
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    wait_for(lambda: sentinels.primary() == ("127.0.0.1", replica.port), 90,
             why=sentinels.primary)  # fmt: skip
    with redis.Redis(port=replica.port, decode_responses=True) as promoted:
        assert promoted.info("replication")["role"] == "master"
        assert promoted.exists(job.keys.era) == 0  # it really never had the job's state
    with pytest.raises(strata_redis.StateLostError) as info:
        _retry(worker.heartbeat)
    assert info.value.found is None and "Redis holds no state for it now" in str(info.value)
    job.close()


def _failover_from_frozen(primary: RedisServer, replica: RedisServer) -> None:
    """Kill the primary, then let the frozen replica run again at once (before the
    sentinels pick a replica, so it is a candidate)."""
    assert primary.proc is not None and replica.proc is not None
    os.kill(primary.proc.pid, signal.SIGKILL)
    os.kill(replica.proc.pid, signal.SIGCONT)


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

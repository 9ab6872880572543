"""State loss is detected, never papered over: each job's state carries an era that every
script checks; a process that worked in an era that Redis no longer holds gets
``StateLostError`` — never a misleading lease error, never a silent restart, and never a
fencing token from before the loss acting on a grant made after it."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import redis

import strata_redis
from strata_redis.server import RedisServer

from .procs import wait_for

JOB = "era-job"


def _job(url: str, dataset_shards: int = 1) -> strata_redis.Job:
    """A process's view of the job: its own client, the dataset registered (idempotent)."""
    job = strata_redis.connect(url, JOB, heartbeat_timeout=2.0)
    strata_redis.ShardManager(job).register_dataset_params("ds", dataset_shards * 10, 10)
    return job


def test_a_token_from_before_a_loss_cannot_complete_a_grant_made_after(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory()  # no persistence: a restart loses everything
    old = _job(server.url)
    old.register_worker("a", heartbeat_interval=None)
    old_leases = old.leases("ds", 0, "a")
    lease = old_leases.acquire()
    assert lease is not None and lease.shard_id == 0
    server.restart(kill=True)

    new = _job(server.url)  # the job started again, as a supervisor would
    new.register_worker("b", heartbeat_interval=None)
    new_leases = new.leases("ds", 0, "b")
    grant = new_leases.acquire()
    # the fencing counter restarted with the state: the same shard, the same token number
    assert grant is not None and (grant.shard_id, grant.token) == (0, lease.token)

    with pytest.raises(strata_redis.StateLostError) as info:
        old_leases.complete(lease)
    assert info.value.found == new.context.era.value() != info.value.era
    assert "was started again meanwhile" in str(info.value)
    assert new_leases.completions() == {}  # the old token completed nothing
    assert new_leases.complete(grant)
    assert new_leases.completions() == {0: ("b", grant.token)}
    # the old process's context never adopts the new era: everything it runs is refused
    with pytest.raises(strata_redis.StateLostError):
        old.register_worker("a2", heartbeat_interval=None)
    with pytest.raises(strata_redis.StateLostError):
        old.barrier("sync", expected=1).wait("a", timeout=5)
    assert old.client.hget(old.keys.status, "a2") is None  # nothing written
    old.close()
    new.close()


def test_a_restart_without_persistence_stops_heartbeats_with_state_lost(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory()
    job = _job(server.url)
    lost: list[Exception] = []
    worker = job.register_worker("w", heartbeat_interval=0.1, on_lost=lost.append)
    server.restart(kill=True)
    wait_for(lambda: worker.lost is not None, 10, why=lambda: worker.lost)
    assert isinstance(worker.lost, strata_redis.StateLostError), repr(worker.lost)
    assert worker.lost.found is None and lost == [worker.lost]
    assert "Redis holds no state for it now" in str(worker.lost)
    assert not worker.heartbeating
    job.close()


def test_a_lost_dataset_is_a_lost_state_not_an_unregistered_one(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory()
    job = _job(server.url)
    job.register_worker("w", heartbeat_interval=None)
    server.restart(kill=True)
    with pytest.raises(strata_redis.StateLostError):
        job.leases("ds", 0, "w")
    # a process that never worked in an era is told the dataset is not registered
    fresh = strata_redis.connect(server.url, JOB)
    with pytest.raises(strata_redis.DatasetNotFoundError, match="register"):
        fresh.leases("ds", 0, "w")
    fresh.close()
    job.close()


def test_a_flush_of_the_era_key_alone_is_caught_by_every_script(
    redis_url: str, raw: redis.Redis
) -> None:
    job = _job(redis_url, dataset_shards=4)
    worker = job.register_worker("w", heartbeat_interval=None)
    leases = job.leases("ds", 0, "w")
    held = leases.acquire()
    assert held is not None
    raw.set(job.keys.era, "another")  # the job's state replaced under this process
    calls: list[Callable[[], object]] = [
        worker.heartbeat, lambda: leases.complete(held), leases.acquire,
        lambda: job.barrier("b", expected=1).wait("w", timeout=5), job.reap,
        lambda: job.register_worker("w2", heartbeat_interval=None),
    ]  # fmt: skip
    for call in calls:
        with pytest.raises(strata_redis.StateLostError) as info:
            call()
        assert info.value.found == "another"
    assert raw.hlen(leases.keys.done) == 0
    job.close()


def test_racing_first_calls_agree_on_one_era(redis_url: str) -> None:
    contexts = [strata_redis.JobContext(redis_url, JOB) for _ in range(8)]
    start = threading.Barrier(len(contexts))
    eras: list[str] = []

    def first(ctx: strata_redis.JobContext) -> None:
        start.wait()
        eras.append(ctx.era.value())

    threads = [threading.Thread(target=first, args=(c,)) for c in contexts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(eras) == 8 and len(set(eras)) == 1
    for ctx in contexts:
        ctx.close()

"""Every key of a running epoch's lease structure is anchored: deleted by hand (or evicted),
the next call that relies on it changes nothing and raises ``StateLostError`` naming the key,
and every other process of the job stops too — never a shard handed out again in silence.
The ``maxmemory-policy`` is watched while the job runs, not read once. Real redis-server."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
import redis

import strata_redis
from strata_redis import era as era_module
from strata_redis import scripts
from strata_redis.data.leases import Lease, ShardLeases
from strata_redis.data.position import restore_position
from strata_redis.keys import LeaseKeys
from strata_redis.status import ANCHORS, GUARDS_ENV

#: each structure of an epoch's leases, and how its key is named (``LeaseKeys``)
STRUCTURES = ("meta", "taken", "done", "holders", "expiry", "record", "workers", "offsets")


def _key(keys: LeaseKeys, what: str) -> str:
    return keys.record(0) if what == "record" else str(getattr(keys, what))


def _running_epoch(job: strata_redis.Job) -> tuple[ShardLeases, Lease, Lease]:
    """A dataset of 8 shards, its epoch 0 running: one shard completed, one held, and one
    handed back part-way (so every structure, the offsets too, exists)."""
    strata_redis.ShardManager(job).register_dataset_params("ds", 16, 2, False, 0)
    # no heartbeat thread: it would outlive the test (and its deleted keys) into the next
    job.register_worker("w0", heartbeat_interval=None)
    leases = job.leases("ds", 0, "w0", ttl=30)
    first = leases.acquire()
    assert first is not None and first.complete()
    handed = leases.acquire()
    assert handed is not None
    handed.release(offset=handed.start + 1)
    held = leases.acquire()
    assert held is not None
    return leases, first, held


@pytest.mark.parametrize("what", STRUCTURES)
def test_a_deleted_key_of_a_running_epoch_stops_every_process_naming_it(
    job: strata_redis.Job, raw: Any, redis_url: str, what: str
) -> None:
    leases, _, held = _running_epoch(job)
    key = _key(leases.keys, what)
    assert raw.exists(key), key
    raw.delete(key)
    # the epoch's keys and the fencing counter (not the heartbeats a thread writes meanwhile)
    watched = [*raw.scan_iter(f"strata:{{{job.job_id}}}:*:0:ds"), job.keys.fence]
    before = {k: raw.dump(k) for k in watched}
    with pytest.raises(strata_redis.StateLostError) as err:
        held.complete()  # the completion path checks the whole structure first
    assert key.split("}:", 1)[1] in str(err.value), str(err.value)
    after = {k: raw.dump(k) for k in before}
    assert after == before, "the refused call changed the job's state"
    # every other process (a new one too) stops at its next call
    with (
        strata_redis.connect(redis_url, job.job_id) as other,
        pytest.raises(strata_redis.StateLostError),
    ):
        other.leases("ds", 0, "w0").acquire()


def test_a_pool_is_not_built_again_over_its_bitmaps(job: strata_redis.Job, raw: Any) -> None:
    """The meta deleted: a process that opens the epoch (``init_epoch``) is refused, so the
    done shards are not handed out from a rebuilt pool."""
    leases, _, _ = _running_epoch(job)
    raw.delete(leases.keys.meta)
    fresh = job.leases("ds", 0, "w0")
    with pytest.raises(strata_redis.StateLostError, match="epoch_meta:0:ds"):
        fresh.acquire()


def test_with_the_anchors_guard_off_a_deleted_pool_hands_out_done_shards(
    redis_url: str, job_id: str, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check's teeth: without it, the taken bitmap deleted, the completed shard is
    leased again (trained twice) and nothing is raised."""
    monkeypatch.setenv(GUARDS_ENV, "anchors")
    scripts.compiled.cache_clear()  # the scripts as this process loads them: guard off
    try:
        with strata_redis.connect(redis_url, job_id, heartbeat_timeout=2.0) as job:
            leases, first, held = _running_epoch(job)
            raw.delete(leases.keys.taken)
            again = set()
            while (lease := leases.acquire()) is not None:
                again.add(lease.shard_id)
            assert first.shard_id in again and held.shard_id in again
    finally:
        monkeypatch.delenv(GUARDS_ENV)
        scripts.compiled.cache_clear()


@pytest.mark.parametrize("lost_ticks", [0, 10])
def test_a_policy_that_evicts_set_while_the_job_runs_stops_it(
    redis_factory: Any, monkeypatch: pytest.MonkeyPatch, lost_ticks: int
) -> None:
    """``maxmemory-policy`` switched to an evicting one after the job's first call: the
    next check (every ``POLICY_EVERY`` s; 0 here) raises ``RedisConfigError``, and every
    later call too. A state that went back first (``lost_ticks``: the clock lowered, as a
    restart from an older AOF does) outranks it: ``StateRolledBackError`` (a job stopped by
    the refusal alone would be relaunched on the older state without a word: the chaos
    checker's seed 0 found it)."""
    server = redis_factory()
    monkeypatch.setattr(era_module, "POLICY_EVERY", 0.0)
    with strata_redis.connect(server.url, "policy-job") as job:
        strata_redis.ShardManager(job).register_dataset_params("ds", 16, 2, False, 0)
        job.register_worker("w0", heartbeat_interval=None)
        leases = job.leases("ds", 0, "w0", ttl=30)
        assert leases.acquire() is not None
        admin = redis.Redis.from_url(server.url)
        if lost_ticks:
            admin.decrby(job.keys.clock, 2 ** len(ANCHORS) * lost_ticks)
        admin.config_set("maxmemory", 1 << 30)
        admin.config_set("maxmemory-policy", "allkeys-lru")
        if lost_ticks:
            with pytest.raises(strata_redis.StateRolledBackError):
                leases.acquire()
            return
        with pytest.raises(strata_redis.errors.RedisConfigError, match="allkeys-lru"):
            leases.acquire()
        # every later call is refused too, not only the one that made the check
        monkeypatch.setattr(era_module, "POLICY_EVERY", 3600.0)
        with pytest.raises(strata_redis.errors.RedisConfigError, match="allkeys-lru"):
            leases.acquire()


def test_the_datasets_hash_is_an_anchor(job: strata_redis.Job, raw: Any, redis_url: str) -> None:
    """Deleted by hand: a process asking for a dataset stops with ``StateLostError`` naming
    it, not ``DatasetNotFoundError`` (which would send it to register again and train from
    the start); a dataset deleted through the API is not a loss."""
    manager = strata_redis.ShardManager(job)
    manager.register_dataset_params("ds", 16, 2, False, 0)
    manager.register_dataset_params("other", 16, 2, False, 0)
    assert manager.delete_dataset("other") and manager.delete_dataset("ds")
    with pytest.raises(strata_redis.errors.DatasetNotFoundError):
        manager.get_dataset("ds")
    assert manager.list_datasets() == []
    manager.register_dataset_params("ds", 16, 2, False, 0)
    raw.delete(job.keys.datasets)
    with (
        strata_redis.connect(redis_url, job.job_id) as fresh,
        pytest.raises(strata_redis.StateLostError, match="datasets"),
    ):
        strata_redis.ShardManager(fresh).get_dataset("ds")


def test_a_deleted_heartbeats_key_stops_the_job_not_a_worker(
    job: strata_redis.Job, raw: Any
) -> None:
    """Live workers (by their status) with no heartbeat: the failure detector's key was lost.
    Without the check every worker was told it had left (``WorkerLeftError``) and the epoch
    was never finished (the fault checker: 231 shards never recorded)."""
    leases, _, held = _running_epoch(job)
    raw.delete(job.keys.heartbeats)
    with pytest.raises(strata_redis.StateLostError, match="heartbeats"):
        held.complete()
    with pytest.raises(strata_redis.StateLostError, match="heartbeats"):
        leases.acquire()  # the era is marked: every later call stops too


def test_a_deleted_rendezvous_stops_its_members_naming_it(job: strata_redis.Job, raw: Any) -> None:
    """The rendezvous hash deleted under a closed round: a member's round check, its epoch
    review and a join that knows the round each stop with ``StateLostError`` naming it (a
    join on a fresh hash would open round 1 again beside the running one: rounds split)."""
    workers = [job.register_worker(f"w{i}", heartbeat_interval=None) for i in range(2)]
    rdzv = strata_redis.coordination.Rendezvous(
        job.context, min_workers=2, max_workers=2, timeout=5
    )
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        rounds = list(pool.map(lambda w: rdzv.join(w.worker_id, w.incarnation), workers))
    assert {r.number for r in rounds} == {1}
    raw.delete(job.keys.rendezvous)
    for call in (
        lambda: rdzv.check(rounds[0]),
        lambda: rdzv.review(rounds[1], 1),
        lambda: rdzv.join_step(workers[0].worker_id, workers[0].incarnation, 1, 1),
    ):
        with pytest.raises(strata_redis.StateLostError, match="rendezvous"):
            call()
    assert not raw.exists(job.keys.rendezvous)  # nothing was built again


def test_a_deleted_copy_of_the_restored_offsets_stops_the_job_naming_it(
    job: strata_redis.Job, raw: Any
) -> None:
    """The restored offsets every member's data position carries (``LeaseKeys.restored``,
    written by a checkpoint restore): lost while the pool is open, the next lease call stops
    with ``StateLostError`` naming the key, so no checkpoint is written without them."""
    params = strata_redis.ShardManager(job).register_dataset_params("ds", 16, 2, False, 0)
    restore_position(job.context, params, 0, {0}, {1: 1, 2: 1}, workers=["w0"], mark=1,
                     later_epochs=0)  # fmt: skip
    job.register_worker("w0", heartbeat_interval=None)
    leases = job.leases("ds", 0, "w0", ttl=30)
    key = leases.keys.restored
    assert raw.hgetall(key) == {"1": "1", "2": "1"}
    lease = leases.acquire()
    assert lease is not None and lease.complete()
    assert raw.hgetall(key) == {"1": "1", "2": "1"}  # a completion leaves the copy as it was
    raw.delete(key)
    with pytest.raises(strata_redis.StateLostError, match="shard_restored:0:ds"):
        leases.acquire()

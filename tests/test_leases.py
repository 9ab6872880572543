"""Dataset registry and fenced shard leases, against a real redis-server and real processes."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

import strata_redis
from strata_redis import ShardManager
from strata_redis.data import leases as leases_module
from strata_redis.data.record import done_count, done_shards, epoch_keys, epoch_record, keep_whole
from strata_redis.errors import (
    DatasetConflictError,
    DatasetNotFoundError,
    WorkerFailedError,
    WorkerLeftError,
    WorkerNotRegisteredError,
)

from .conftest import decoding_client
from .procs import join_all, kill9, spawn

pytestmark = pytest.mark.both_backends  # conftest: on one redis-server and on a Redis Cluster

JOB = "lease-job"  # the job_id fixture's name for this module's job
DONE_LOG = "test:completions"
#: generous: 20 interpreters starting at once on two cores must not be declared failed (the
#: killed workers' shards come back through their leases' ttl, not through the reaper)
HEARTBEAT_TIMEOUT = 5.0  # processes append "<shard> <worker> <token>" per recorded completion
LEASE_TTL = 3.0  # the drainers' leases, renewed every second


# -- processes ------------------------------------------------------------------------------


def drainer(
    url: str, job_id: str, worker_id: str, dataset: str, epoch: int, work_s: float, limit: int
) -> None:
    """Register, wait for the go signal, drain the epoch through leases (at most ``limit``)."""
    job = strata_redis.connect(url, job_id, heartbeat_timeout=HEARTBEAT_TIMEOUT)
    job.register_worker(worker_id, heartbeat_interval=0.2)
    log = decoding_client(url)
    # short waits (the client's socket timeout may be shorter than a long BLPOP), up to
    # 120 s: twenty interpreters starting beside other tests take their time to register
    deadline = time.monotonic() + 120
    while log.blpop(["test:go"], timeout=1) is None and time.monotonic() < deadline:
        pass
    # 3 s: a drainer descheduled past its ttl loses its lease (LeaseLostError, exit 1); the
    # victims' shards come back 3 s after the kill, well inside join_all's 120 s
    leases = job.leases(dataset, epoch, worker_id, ttl=LEASE_TTL)
    for done, lease in enumerate(leases, start=1):
        time.sleep(work_s)
        if lease.complete():
            log.rpush(DONE_LOG, f"{lease.shard_id} {worker_id} {lease.token}")
        if done >= limit:
            break


def run_drainers(
    url: str, job_id: str, ids: list[str], dataset: str, work_s: float, limit: int = 10**9
) -> list[Any]:
    client = decoding_client(url)
    job = strata_redis.connect(url, job_id, heartbeat_timeout=HEARTBEAT_TIMEOUT)
    procs = [spawn(drainer, url, job_id, wid, dataset, 0, work_s, limit) for wid in ids]
    deadline = time.monotonic() + 120
    while len(set(ids) & set(job.live_workers())) < len(ids):
        assert time.monotonic() < deadline, "drainers did not register"
        time.sleep(0.05)
    client.rpush("test:go", *["go"] * len(ids))
    return procs


def check_exactly_once(
    url: str,
    manager: ShardManager,
    dataset: str,
    num_shards: int,
    killed: frozenset[str] = frozenset(),
) -> None:
    """The record holds every shard once, and each one was reported recorded by one worker.

    A killed worker may have recorded a shard and died before reporting it: such a shard is
    in the record, under that worker, and in nobody's report.
    """
    client = decoding_client(url)
    leases = manager.job.leases(dataset, 0, "checker")
    record = leases.completions()
    assert sorted(record) == list(range(num_shards)), "every shard completed, none skipped"
    reported = [line.split(" ") for line in client.lrange(DONE_LOG, 0, -1)]
    shards = [int(s) for s, _, _ in reported]
    assert len(shards) == len(set(shards)), "no shard recorded twice"
    for shard, worker, token in reported:
        assert record[int(shard)] == (worker, int(token))
    unreported = set(record) - set(shards)
    assert all(record[s][0] in killed for s in unreported), "only the killed lost reports"


@pytest.fixture
def manager(redis_url: str, job_id: str) -> ShardManager:
    return ShardManager(redis_url, job_id=job_id, heartbeat_timeout=HEARTBEAT_TIMEOUT)


# -- multi-process ----------------------------------------------------------------------------


def test_twenty_processes_drain_one_epoch_with_kills(redis_url: str, manager: ShardManager) -> None:
    manager.register_dataset_params("ds", 3000, 10, True, 7)  # 300 shards
    ids = [f"w{i:02d}" for i in range(20)]
    procs = run_drainers(redis_url, manager.job.job_id, ids, "ds", work_s=0.03)
    time.sleep(0.4)
    victims = random.Random(1).sample(range(20), 4)
    for i in victims:
        kill9(procs[i])  # mid-shard: they spend most of their time inside a lease
    codes = join_all(procs, timeout=120)
    assert [codes[i] for i in range(20) if i not in victims] == [0] * 16
    check_exactly_once(redis_url, manager, "ds", 300, frozenset(ids[i] for i in victims))
    grants = int(manager.job.client.get(manager.job.keys.fence))
    assert grants > 300, "the victims' leases were granted again to others"


def test_restart_mid_epoch_with_a_different_worker_count(
    redis_url: str, manager: ShardManager
) -> None:
    manager.register_dataset_params("ds", 1200, 10, False, 0)  # 120 shards
    job_id = manager.job.job_id
    first = run_drainers(redis_url, job_id, ["a0", "a1", "a2"], "ds", work_s=0.01, limit=15)
    join_all(first)
    progress = manager.job.leases("ds", 0, "x").progress()
    assert progress.done == 45 and not progress.finished
    # The whole job goes away (its workers leave), then 5 new workers resume the epoch.
    second = run_drainers(redis_url, job_id, [f"b{i}" for i in range(5)], "ds", work_s=0.01)
    assert join_all(second) == [0] * 5
    check_exactly_once(redis_url, manager, "ds", 120)


# -- one process ------------------------------------------------------------------------------


def test_iteration_covers_every_sample_once(job: strata_redis.Job) -> None:
    ShardManager(job).register_dataset_params("ds", 1003, 40, True, 5)
    job.register_worker("w", heartbeat_interval=None)
    seen = []
    for lease in job.leases("ds", 0, "w"):
        seen.append(lease.indices())
        assert lease.complete() is True
    allidx = np.concatenate(seen)
    assert len(allidx) == 1003 and set(allidx.tolist()) == set(range(1003))
    assert job.leases("ds", 0, "w").progress().finished


def test_stale_token_refused_and_expired_lease_regranted_with_higher_token(
    job: strata_redis.Job,
) -> None:
    ShardManager(job).register_dataset_params("one", 10, 10)
    job.register_worker("a", heartbeat_interval=None)
    job.register_worker("b", heartbeat_interval=None)
    la = job.leases("one", 0, "a", ttl=1)
    lb = job.leases("one", 0, "b", ttl=5)
    old = la.acquire()
    assert old is not None and lb.acquire() is None  # held by a
    time.sleep(1.2)  # a pauses past its lease
    new = lb.acquire()
    assert new is not None and new.shard_id == old.shard_id and new.token > old.token
    with pytest.raises(strata_redis.LeaseLostError, match="shard 0") as info:
        old.complete()
    assert (info.value.dataset, info.value.epoch, info.value.shard_id) == ("one", 0, 0)
    with pytest.raises(strata_redis.LeaseLostError):
        la.renew(old)
    assert new.complete() is True
    assert new.complete() is False  # a retry records nothing twice
    assert lb.completions() == {0: ("b", new.token)}


def test_renewal_keeps_token_and_loss_is_reported(job: strata_redis.Job) -> None:
    ShardManager(job).register_dataset_params("one", 10, 10)
    job.register_worker("a", heartbeat_interval=None)
    job.register_worker("b", heartbeat_interval=None)
    lost: list[strata_redis.LeaseLostError] = []
    # renewed every ttl/3 = 1 s: a stall of the renewer under 2 s keeps the lease
    la = job.leases("one", 0, "a", ttl=3, on_lost=lost.append)
    it = iter(la)
    lease = next(it)
    time.sleep(3.5)  # the renewer keeps it alive past its ttl
    assert job.leases("one", 0, "b").acquire() is None
    job.client.hset(la.keys.holders, "0", "999999 0 0 b")  # someone else holds it now
    deadline = time.monotonic() + 10  # the next renewal (1 s) finds it lost
    while not lost and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lost and lease.lost is lost[0]
    with pytest.raises(strata_redis.LeaseLostError):
        lease.complete()
    it.close()


def test_failed_workers_lease_goes_back_at_once(job: strata_redis.Job) -> None:
    ShardManager(job).register_dataset_params("one", 10, 10)
    job.register_worker("a", heartbeat_interval=None)
    job.register_worker("b", heartbeat_interval=None)
    held = job.leases("one", 0, "a", ttl=600).acquire()
    assert held is not None
    job.client.zadd(job.keys.heartbeats, {"a": 0})
    assert job.reap() == ["a"]
    again = job.leases("one", 0, "b", ttl=600).acquire()
    assert again is not None and again.shard_id == held.shard_id and again.token > held.token


def test_own_shards_first_then_steal(job: strata_redis.Job) -> None:
    sm = ShardManager(job)
    sm.register_dataset_params("ds", 200, 10)
    job.register_worker("a", heartbeat_interval=None)
    job.register_worker("b", heartbeat_interval=None)
    own = [s.shard_id for s in sm.get_shard_for_worker("ds", "a", 0)]
    la = job.leases("ds", 0, "a")
    got = []
    while (lease := la.acquire()) is not None:
        got.append(lease.shard_id)
        lease.complete()
    assert got[: len(own)] == own, "own shards first, in this epoch's order"
    assert sorted(got) == list(range(20)), "then every other worker's unstarted shards"
    assert la.progress().steals == 20 - len(own) > 0, "each of b's shards a took is a steal"
    no_steal = job.leases("ds", 1, "a", steal=False)
    taken = []
    while (lease := no_steal.acquire()) is not None:
        taken.append(lease.shard_id)
        lease.complete()
    assert sorted(taken) == sorted(s.shard_id for s in sm.get_shard_for_worker("ds", "a", 1))
    assert no_steal.progress().steals == 0


def test_only_live_workers_lease(job: strata_redis.Job) -> None:
    ShardManager(job).register_dataset_params("ds", 100, 10)
    with pytest.raises(WorkerNotRegisteredError):
        job.leases("ds", 0, "ghost").acquire()
    w = job.register_worker("w", heartbeat_interval=None)
    w.deregister()
    with pytest.raises(WorkerLeftError):
        job.leases("ds", 0, "w").acquire()


def test_fencing_tokens_only_grow(job: strata_redis.Job) -> None:
    ShardManager(job).register_dataset_params("ds", 100, 10)
    job.register_worker("w", heartbeat_interval=None)
    tokens = []
    for epoch in range(3):
        for lease in job.leases("ds", epoch, "w"):
            tokens.append(lease.token)
            lease.complete()
    assert tokens == sorted(tokens) and len(set(tokens)) == 30


def evalsha_calls(raw: redis.Redis) -> int:
    """Scripts run so far (a NOSCRIPT refusal, answered by loading and re-sending, is none)."""
    stats = raw.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))


def test_loop_completes_and_leases_the_next_shard_in_one_round_trip(
    job: strata_redis.Job, raw: redis.Redis
) -> None:
    ShardManager(job).register_dataset_params("ds", 400, 10)  # 40 shards
    job.register_worker("w", heartbeat_interval=None)
    leases = job.leases("ds", 0, "w")
    before = evalsha_calls(raw)
    tokens = []
    for lease in leases:
        tokens.append(lease.token)
        assert lease.complete() is True
    # init_epoch + the first acquire + one hand-off per shard + the acquire that finds none
    assert evalsha_calls(raw) - before == 40 + 3
    assert tokens == sorted(tokens) and len(tokens) == 40
    assert sorted(leases.completions()) == list(range(40))


def test_refused_completion_in_the_loop_still_hands_over_the_next_shard(
    job: strata_redis.Job,
) -> None:
    ShardManager(job).register_dataset_params("ds", 50, 10)  # 5 shards
    job.register_worker("w", heartbeat_interval=0.5)
    job.register_worker("x", heartbeat_interval=0.5)
    leases = job.leases("ds", 0, "w", ttl=600)
    got: list[tuple[int, int]] = []
    for lease in leases:
        got.append((lease.shard_id, lease.token))
        if len(got) == 2:  # re-granted to x meanwhile, and x's lease has already expired
            job.client.hset(leases.keys.holders, str(lease.shard_id), "999999 0 0 x")
            job.client.zadd(leases.keys.expiry, {str(lease.shard_id): 0})
            with pytest.raises(strata_redis.LeaseLostError):
                lease.complete()
            continue
        assert lease.complete() is True
    refused, token = got[1]
    again = [t for s, t in got if s == refused]
    assert len(got) == 6 and again == [token, again[1]] and again[1] > token, (
        "the loop went on; the refused shard came back to the pool and was leased again"
    )
    record = leases.completions()
    assert sorted(record) == list(range(5)) and record[refused] == ("w", again[1])


def test_leaving_the_loop_gives_back_the_shard_leased_ahead(job: strata_redis.Job) -> None:
    ShardManager(job).register_dataset_params("ds", 50, 10)
    job.register_worker("w", heartbeat_interval=None)
    leases = job.leases("ds", 0, "w", ttl=600)
    for lease in leases:
        lease.complete()  # also leases the next shard ...
        break  # ... which leaving the loop gives back
    progress = leases.progress()
    assert (progress.done, progress.leased, progress.todo) == (1, 0, 4)


def test_a_lease_thread_holds_leases_ready_and_its_completions_land_by_settle(
    job: strata_redis.Job,
) -> None:
    ShardManager(job).register_dataset_params("ds", 200, 10)  # 20 shards
    job.register_worker("w", heartbeat_interval=None)
    leases = job.leases("ds", 0, "w", ttl=600, ahead=2)
    gate = threading.Event()

    def refused() -> None:
        raise ValueError("a call of the lease thread failed")

    with leases.draining():
        first = leases.acquire()
        assert first is not None
        leases.settle()
        assert len(leases.held()) == 3, "the lease handed out and two held ready"
        leases.later(gate.wait)  # the lease thread is held back ...
        leases.later(lambda: leases.complete(first) and None)
        second = leases.acquire()  # ... and a ready lease is taken without waiting for it
        assert second is not None and second.shard_id != first.shard_id
        assert leases.progress().done == 0, "the completion waits behind the held-back call"
        gate.set()
        leases.settle()
        assert leases.progress().done == 1 and first.finished
        leases.later(refused)
        with pytest.raises(ValueError, match="lease thread failed"):
            leases.settle()
        leases.settle()  # (raised once)
    progress = leases.progress()
    assert (progress.done, progress.leased, progress.todo) == (1, 0, 19), (
        "leaving gave back the lease handed out and those held ready"
    )


def test_a_checkpoint_waits_for_the_completions_the_lease_thread_sends(
    redis_url: str, job_id: str, tmp_path: Path
) -> None:
    ShardManager(redis_url, job_id=job_id).register_dataset_params("ds", 40, 10)  # 4 shards
    with strata_redis.TrainingOrchestrator(
        redis_url, "w-0", job_id=job_id, checkpoint_path=tmp_path / "store", last_call=0.1
    ) as orch:  # fmt: skip
        stream = orch.get_shards("ds", batch_size=10, track_consumption=True, lease_ahead=1)
        walk = iter(stream)
        next(walk)  # a shard's only batch ...
        stream.consumed(1)  # ... taken by the training step
        (leases,) = stream._drained  # the walk's leases: hold their thread back
        leases.settle()
        gate = threading.Event()
        leases.later(gate.wait)
        next(walk)  # the walk goes on; the first shard's completion waits behind the gate
        assert stream.position is not None
        counted = set(stream.position.own)
        assert len(counted) == 1
        # the gate opens 1.5 s on: a save that waits for the completion returns after it (and
        # finds it recorded); one that does not returns at once, the completion still held
        timer = threading.Timer(1.5, gate.set)
        timer.start()
        try:
            orch.save_checkpoint(step=1, epoch=0, state=b"model")
            with strata_redis.connect(redis_url, job_id) as job:
                recorded = set(job.leases("ds", 0, "w-0").completions())
        finally:
            timer.cancel()
            gate.set()
        assert counted <= recorded, (
            "the checkpoint's position counts a shard done whose completion had not landed"
        )


def test_worker_failed_mid_loop_keeps_its_completion_and_stops_leasing(
    job: strata_redis.Job,
) -> None:
    ShardManager(job).register_dataset_params("ds", 50, 10)
    job.register_worker("w", heartbeat_interval=None)
    loop = iter(job.leases("ds", 0, "w", ttl=600))
    lease = next(loop)
    job.client.zadd(job.keys.heartbeats, {"w": 0})
    assert job.reap() == ["w"]
    assert lease.complete() is True  # its lease was not yet taken back: the record stands
    with pytest.raises(WorkerFailedError):
        next(loop)
    assert job.leases("ds", 0, "x").completions() == {lease.shard_id: ("w", lease.token)}


# -- the dataset registry and bad input -------------------------------------------------------


def test_register_dataset_like_the_seeds(job: strata_redis.Job, raw: redis.Redis) -> None:
    sm = ShardManager(job)
    params = sm.register_dataset_params("imagenet-1k", 1281167, 10000, True, 42)
    assert params.num_shards == 129
    assert (
        sm.register_dataset_params(
            name="imagenet-1k",
            total_samples=1281167,
            samples_per_shard=10000,
            shuffle=True,
            seed=42,
        )
        == params
    )  # the same again: a no-op
    with pytest.raises(DatasetConflictError, match="replace=True"):
        sm.register_dataset_params("imagenet-1k", 1281167, 5000, True, 42)
    assert sm.get_dataset("imagenet-1k") == params
    sm.register_dataset_params("imagenet-1k", 1281167, 5000, True, 42, replace=True)
    assert sm.get_dataset("imagenet-1k").num_shards == 257
    assert [d.name for d in sm.list_datasets()] == ["imagenet-1k"]
    # and the field "" that keeps the HASH standing (an anchor: register_dataset.lua)
    assert sorted(raw.hkeys(job.keys.datasets)) == ["", "imagenet-1k"]
    assert sm.delete_dataset("imagenet-1k") and not sm.delete_dataset("imagenet-1k")
    with pytest.raises(DatasetNotFoundError, match="imagenet-1k"):
        sm.get_dataset("imagenet-1k")


def test_seed_example_shard_for_worker(job: strata_redis.Job) -> None:
    sm = ShardManager(job)
    sm.register_dataset_params("imagenet-1k", 1281167, 10000, True, 42)
    job.register_worker("worker-01", heartbeat_interval=None)
    shards = sm.get_shard_for_worker("imagenet-1k", "worker-01", 0)
    assert len(shards) == 129 and shards[-1].stop - shards[-1].start in (10000, 1167)
    with pytest.raises(WorkerNotRegisteredError):
        sm.get_shard_for_worker("imagenet-1k", "worker-99", 0)


@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        (("ds", 0, 10), ValueError, "total_samples"),
        (("ds", -5, 10), ValueError, "total_samples"),
        (("ds", 100, 0), ValueError, "samples_per_shard"),
        (("ds", 100, -1), ValueError, "samples_per_shard"),
        (("ds", "100", 10), TypeError, "total_samples"),
        (("ds", 100.0, 10), TypeError, "total_samples"),
        (("ds", 100, 10, "yes"), TypeError, "shuffle"),
        (("ds", 100, 10, True, -1), ValueError, "seed"),
        (("ds", 100, 10, True, 1.5), TypeError, "seed"),
        (("", 100, 10), ValueError, "name"),
        (("bad\nname", 100, 10), ValueError, "name"),
    ],
)
def test_bad_dataset_params_refused_and_nothing_written(
    job: strata_redis.Job,
    raw: redis.Redis,
    args: tuple[Any, ...],
    exc: type[Exception],
    match: str,
) -> None:
    with pytest.raises(exc, match=match):
        ShardManager(job).register_dataset_params(*args)
    assert raw.keys("*") == []


def test_fewer_shards_than_workers_is_allowed(job: strata_redis.Job) -> None:
    sm = ShardManager(job)
    sm.register_dataset_params("tiny", 30, 10)  # 3 shards
    for i in range(5):
        job.register_worker(f"w{i}", heartbeat_interval=None)
    counts = [len(sm.get_shard_for_worker("tiny", f"w{i}", 0)) for i in range(5)]
    assert sum(counts) == 3 and counts.count(0) == 2


def test_bad_lease_arguments(job: strata_redis.Job, raw: redis.Redis) -> None:
    ShardManager(job).register_dataset_params("ds", 100, 10)
    before = sorted(raw.keys("*"))
    with pytest.raises(DatasetNotFoundError):
        job.leases("nope", 0, "w")
    with pytest.raises(ValueError, match="epoch"):
        job.leases("ds", -1, "w")
    with pytest.raises(TypeError, match="epoch"):
        job.leases("ds", "0", "w")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttl"):
        job.leases("ds", 0, "w", ttl=0)
    with pytest.raises(ValueError, match="worker_id"):
        job.leases("ds", 0, "")
    assert sorted(raw.keys("*")) == before


# -- finished epochs: closed into a summary of constant size -------------------------------


def drain(job: strata_redis.Job, dataset: str, epoch: int, workers: list[str]) -> None:
    """Drain one epoch, the workers taking turns (one acquire + complete each)."""
    leases = [job.leases(dataset, epoch, w) for w in workers]
    while True:
        got = [lz.acquire() for lz in leases]
        if not any(got):
            return
        for lease in got:
            if lease is not None:
                assert lease.complete() is True


def job_bytes(raw: redis.Redis, job_id: str) -> int:
    """MEMORY USAGE summed over every key of the job."""
    keys = list(raw.scan_iter(f"strata:{{{job_id}}}:*", count=1000))
    return sum(raw.memory_usage(k, samples=0) or 0 for k in keys)


def test_a_finished_epoch_closes_into_its_summary_when_the_next_begins(
    job: strata_redis.Job, raw: redis.Redis
) -> None:
    params = ShardManager(job).register_dataset_params("ds", 200, 10)  # 20 shards
    for w in ("a", "b"):
        job.register_worker(w, heartbeat_interval=None)
    la, lb = job.leases("ds", 0, "a"), job.leases("ds", 0, "b")
    last = None
    for lz in (la, lb) * 10:
        lease = lz.acquire()
        assert lease is not None
        last = lease
        if lease.shard_id != 0:
            assert lease.complete() is True
    stale = lb.acquire()
    assert stale is None
    zero = [ls for ls in la._held.values()] + [ls for ls in lb._held.values()]
    assert [ls.shard_id for ls in zero] == [0]
    assert zero[0].complete() is True
    assert last is not None
    before = la.completed_by()
    assert sum(before.values()) == 20 and set(before) == {"a", "b"}
    whole = la.completions()
    assert sorted(whole) == list(range(20))  # kept whole until the next epoch begins
    k = la.keys
    assert raw.exists(k.done)
    job.leases("ds", 1, "a").prepare()  # the next epoch's pool closes this one
    closed = epoch_keys(job.context, params, 0)
    assert closed[0] == k.meta and raw.exists(k.meta) and not any(map(raw.exists, closed[1:]))
    assert 0 < raw.ttl(k.meta) <= leases_module.RECORD_TTL_S
    progress = la.progress()
    assert (progress.done, progress.leased, progress.todo, progress.finished) == (20, 0, 0, True)
    assert la.completed_by() == before
    assert done_count(job.context, params, 0) == 20
    assert done_shards(job.context, params, 0) == set(range(20))
    assert epoch_record(job.context, params, 0) == (set(range(20)), {})
    assert la.completions() == {}
    assert job.leases("ds", 0, "a").acquire() is None  # a closed epoch leases nothing
    # exactly-once holds across the close: a retry of a completion records nothing, any
    # other completion (a stale token) is refused
    retry = leases_module.Lease(zero[0].shard, zero[0].token, 0, zero[0].owner, grant=zero[0].grant)
    assert retry.complete() is False
    stale_retry = leases_module.Lease(
        zero[0].shard, zero[0].token - 1, 0, zero[0].owner, grant=zero[0].grant
    )
    with pytest.raises(strata_redis.LeaseLostError):
        stale_retry.complete()
    assert la.completed_by() == before  # nothing counted twice


def test_closing_an_epoch_the_job_is_past_even_when_shards_were_dropped(
    job: strata_redis.Job, raw: redis.Redis
) -> None:
    ShardManager(job).register_dataset_params("ds", 100, 10)
    job.register_worker("a", heartbeat_interval=None)
    first = job.leases("ds", 0, "a")
    lease = first.acquire()
    assert lease is not None and lease.complete() is True
    held = job.leases("ds", 1, "a", ttl=600).acquire()  # epoch 0 unfinished, job not past it
    assert held is not None
    assert raw.exists(first.keys.done) and first.completions() == {
        lease.shard_id: ("a", lease.token)
    }
    raw.set(job.keys.epoch, 2)  # the job advanced past epoch 1 (its shards dropped)
    job.leases("ds", 2, "a").prepare()
    k1 = job.keys.lease_keys("ds", 1)
    assert raw.exists(k1.taken) == 0 and raw.exists(k1.holders) == 0
    assert raw.hget(k1.meta, "closed_ms") is not None and raw.hget(k1.meta, "swept") is None
    assert job.leases("ds", 1, "a").progress().done == 0
    with pytest.raises(strata_redis.LeaseLostError):
        held.complete()  # its epoch is closed: nothing of it is recorded any more


def test_keep_whole_keeps_earlier_records(job: strata_redis.Job, raw: redis.Redis) -> None:
    ShardManager(job).register_dataset_params("ds", 50, 10)
    job.register_worker("a", heartbeat_interval=None)
    keep_whole(job.context, "ds", 1)
    for epoch in range(3):
        drain(job, "ds", epoch, ["a"])
    assert sorted(job.leases("ds", 1, "a").completions()) == list(range(5))  # kept whole
    assert job.leases("ds", 0, "a").completions() == {}  # closed by epoch 2's pool
    with pytest.raises(ValueError, match="epochs"):
        keep_whole(job.context, "ds", -1)


def test_nine_finished_epochs_cost_about_what_three_do(
    job: strata_redis.Job, raw: redis.Redis
) -> None:
    """Issue 24's bar: the same job and dataset after 9 epochs <= 1.25x the bytes after 3."""
    ShardManager(job).register_dataset_params("ds", 30_000, 10)  # 3,000 shards
    workers = ["w0", "w1", "w2"]
    for w in workers:
        job.register_worker(w, heartbeat_interval=None)
    for epoch in range(3):
        drain(job, "ds", epoch, workers)
    three = job_bytes(raw, job.job_id)
    for epoch in range(3, 9):
        drain(job, "ds", epoch, workers)
    nine = job_bytes(raw, job.job_id)
    assert nine <= 1.25 * three, (three, nine)

"""State loss is detected, never papered over: each job's state carries an era that every
script checks; a process that worked in an era that Redis no longer holds gets
``StateLostError`` — never a misleading lease error, never a silent restart, and never a
fencing token from before the loss acting on a grant made after it."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from typing import Any

import numpy as np
import pytest
import redis

import strata_redis
import strata_redis.cli
from strata_redis.keys import LAYOUT, Keys
from strata_redis.server import RedisServer

from .procs import CTX, join_all, spawn, wait_for

JOB = "era-job"


def _job(url: str, dataset_shards: int = 1, heartbeat_timeout: float = 2.0) -> strata_redis.Job:
    """A process's view of the job: its own client, the dataset registered (idempotent)."""
    job = strata_redis.connect(url, JOB, heartbeat_timeout=heartbeat_timeout)
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
    # (the callback runs after the heartbeat tick that set worker.lost: wait for both)
    wait_for(lambda: worker.lost is not None and lost, 10, why=lambda: (worker.lost, lost))
    assert isinstance(worker.lost, strata_redis.StateLostError), repr(worker.lost)
    assert worker.lost.found is None and lost == [worker.lost]
    assert "Redis holds no state for it now" in str(worker.lost)
    assert not worker.heartbeating
    job.close()


def drain_until_lost(url: str, worker_id: str, out: Queue[Any]) -> None:
    """A worker process: drain epoch 0 of "ds" through the public API (a short sleep per
    shard stands for training) and report what it recorded and how it stopped."""
    # 10 s: a worker stalled on a loaded machine is not declared failed before the flush
    # (it would stop with WorkerFailedError, not StateLostError)
    job = _job(url, dataset_shards=1000, heartbeat_timeout=10.0)
    worker = job.register_worker(worker_id, heartbeat_interval=0.2)
    recorded: list[tuple[int, int]] = []
    repeats: list[int] = []
    error = "none"
    try:
        for lease in job.leases("ds", 0, worker_id):
            time.sleep(0.03)
            if lease.complete():
                recorded.append((lease.shard_id, lease.token))
            else:
                repeats.append(lease.shard_id)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    # the heartbeat thread stops with the same error within a few of its intervals
    deadline = time.monotonic() + 10
    while worker.lost is None and time.monotonic() < deadline:
        time.sleep(0.05)
    lost = "none" if worker.lost is None else type(worker.lost).__name__
    out.put((worker_id, recorded, repeats, error, lost, worker.heartbeating))
    job.close()


@pytest.mark.timeout(180)
def test_a_flushall_mid_epoch_stops_every_worker_process_with_state_lost(
    redis_factory: Callable[..., RedisServer],
) -> None:
    """FLUSHALL on the live server while three worker processes drain an epoch: each stops
    with StateLostError (its loop and its heartbeat thread), none with a lease or dataset
    error, and no completion is recorded after the flush."""
    server = redis_factory()
    out: Queue[Any] = CTX.Queue()
    ids = ["w0", "w1", "w2"]
    procs = [spawn(drain_until_lost, server.url, w, out) for w in ids]
    raw: redis.Redis = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        lk = strata_redis.keys.Keys(JOB).lease_keys("ds", 0)

        def completers() -> set[str]:
            return {f[3:] for f in raw.hkeys(lk.meta) if f.startswith("by:")}

        # every worker is mid-epoch: each has completions recorded, and most shards remain
        wait_for(lambda: completers() == set(ids), 90, why=completers)
        with redis.Redis.from_url(server.url) as binary, binary.pipeline() as pipe:
            pipe.hgetall(lk.workers)  # the record as it was at the flush
            pipe.get(lk.done)
            pipe.get(lk.record(0))  # (< 65,535 shards: one segment)
            pipe.flushall()
            workers, bits, record, _ = pipe.execute()
        at_flush = _record({f.decode(): v.decode() for f, v in workers.items()}, bits, record)
        flushed = time.monotonic()
        assert 0 < len(at_flush) < 1000, len(at_flush)  # mid-epoch
        reports = {}
        for _ in ids:
            worker_id, *rest = out.get(timeout=60)
            reports[worker_id] = rest
        took = time.monotonic() - flushed
        assert join_all(procs, timeout=30) == [0, 0, 0]
    finally:
        join_all(procs, timeout=1)
    for worker_id, (_, repeats, error, lost, heartbeating) in reports.items():
        assert error.startswith("StateLostError: "), (worker_id, error)
        assert "Redis holds no state for it now" in error, error
        assert lost == "StateLostError" and not heartbeating, (worker_id, lost)
        assert repeats == [], (worker_id, repeats)
    assert took < 30, took  # each stopped within a bounded time (its next call, in fact)
    # what the workers were told they recorded is exactly the record at the flush: each
    # shard once, and nothing acknowledged after it (under the old era or any other)
    told = {shard: (w, token) for w, r in reports.items() for shard, token in r[0]}
    assert sum(len(r[0]) for r in reports.values()) == len(told)
    assert told == at_flush
    assert raw.keys(f"*{JOB}*") == []  # nothing written after the flush: no new era either
    raw.close()


def _record(workers: dict[str, str], bits: bytes, record: bytes) -> dict[int, tuple[str, int]]:
    """Shard -> (worker, token) from an epoch's workers hash, done bitmap and first record
    segment (``LeaseKeys.record``: a big-endian i64 token and u32 worker index per shard)."""
    done = np.flatnonzero(np.unpackbits(np.frombuffer(bits, dtype=np.uint8))).tolist()
    rows = np.frombuffer(record, dtype=np.dtype([("token", ">i8"), ("worker", ">u4")]))
    names = {int(f[2:]): v for f, v in workers.items() if f.startswith("i:")}
    return {s: (names[int(rows["worker"][s])], int(rows["token"][s])) for s in done}


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
    with pytest.raises(strata_redis.errors.DatasetNotFoundError, match="register"):
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
    assert raw.bitcount(leases.keys.done) == 0  # nothing recorded
    job.close()


def test_racing_first_calls_agree_on_one_era(redis_url: str) -> None:
    contexts = [strata_redis.context.JobContext(redis_url, JOB) for _ in range(8)]
    start = threading.Barrier(len(contexts))
    eras: list[str] = []

    def first(ctx: strata_redis.context.JobContext) -> None:
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


# -- the layout a job's state was made in -------------------------------------------------------
@pytest.mark.parametrize(
    ("era", "made"),
    [
        ("0123456789abcdef", "from before layouts were recorded"),  # older code's era
        (f"0123456789abcdef.v{LAYOUT + 1}", f"a newer strata_redis (layout {LAYOUT + 1})"),
    ],
    ids=["older-code", "newer-layout"],
)
def test_a_job_made_in_another_layout_is_refused_with_what_to_do(
    redis_url: str, raw: redis.Redis, era: str, made: str
) -> None:
    # the job's state made by another version: its era, and an epoch it opened
    raw.set(Keys(JOB).era, era)
    raw.set(Keys(JOB).epoch, 3)
    job = strata_redis.connect(redis_url, JOB)
    for call in (
        lambda: job.register_worker("w", heartbeat_interval=None),
        lambda: strata_redis.ShardManager(job).register_dataset_params("ds", 10, 10),
    ):
        with pytest.raises(strata_redis.errors.JobLayoutError, match=re.escape(made)) as info:
            call()
        assert isinstance(info.value, strata_redis.StateLostError)
        assert f"strata jobs rm {JOB} --yes" in str(info.value)
        assert (info.value.found, info.value.expected) == (era, LAYOUT)
    assert sorted(raw.keys("*")) == sorted([Keys(JOB).era, Keys(JOB).epoch])  # nothing written
    job.close()
    # the documented remedy: remove the job's state; the job then starts in this layout
    assert strata_redis.cli.main(["jobs", "rm", JOB, "--yes", "--redis-url", redis_url]) == 0
    with strata_redis.connect(redis_url, JOB) as again:
        again.register_worker("w", heartbeat_interval=None).deregister()


def test_a_job_made_by_this_code_records_its_layout_and_is_read_again(
    redis_url: str, raw: redis.Redis
) -> None:
    first = _job(redis_url)
    first.register_worker("a", heartbeat_interval=None)
    era = first.context.era.value()
    assert era.endswith(f".v{LAYOUT}") and raw.get(Keys(JOB).era) == era
    second = _job(redis_url)  # another process's view: the era checked once, and fine
    second.register_worker("b", heartbeat_interval=None)
    assert second.context.era.value() == era
    first.close()
    second.close()

"""A Redis restart shorter than ``redis_retry`` is ridden out by every blocking call: the
waiters re-issue their blocking reads once Redis answers again, their arrivals counted once;
a longer outage ends in ``RedisUnavailableError`` once the budget is spent."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

import strata_redis
from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.checkpoint.manifest import FileEntry
from strata_redis.coordination.epochs import epoch_barrier
from strata_redis.coordination.rendezvous import Rendezvous
from strata_redis.server import RedisServer

from . import loops
from .procs import wait_for


def _restart(server: RedisServer, down: float = 0.2) -> float:
    """Stop the server (its connections close), keep it down ``down`` s, start it again on
    the same port and AOF; how long it was unreachable."""
    start = time.monotonic()
    server.stop()
    time.sleep(down)
    server.start()
    return time.monotonic() - start


def _threads(results: queue.Queue[Any], calls: list[Callable[[], Any]]) -> list[threading.Thread]:
    def run(call: Callable[[], Any]) -> None:
        try:
            results.put(call())
        except BaseException as exc:  # the test looks at what each waiter got
            results.put(exc)

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in calls]
    for t in threads:
        t.start()
    return threads


def _arrived(job: strata_redis.Job, name: str, count: int) -> Callable[[], bool]:
    return lambda: len(job.barrier(name, expected=count + 1).state().arrived) == count


@pytest.mark.parametrize("waiters", [1, 4])  # 4: watchers and release-list waiters
def test_barrier_waiters_ride_out_a_restart(
    redis_factory: Callable[..., RedisServer], waiters: int
) -> None:
    server = redis_factory(aof=True)
    job = strata_redis.connect(server.url, "outage", heartbeat_timeout=30.0)
    for i in range(waiters + 1):
        job.register_worker(f"w{i}", heartbeat_interval=1.0)
    barrier = job.barrier("b", expected=waiters + 1, timeout=30)
    results: queue.Queue[Any] = queue.Queue()
    threads = _threads(results, [lambda i=i: barrier.wait(f"w{i}") for i in range(waiters)])
    wait_for(_arrived(job, "b", waiters), 10)
    time.sleep(0.3)  # every waiter blocked in Redis
    # an outage (stop, start, AOF load, first PING: harness time on a loaded machine) well
    # inside the barrier's 30 s timeout and redis_retry's 60 s: ridden out, not timed out
    assert _restart(server) < 20.0
    release = barrier.wait(f"w{waiters}")
    for t in threads:
        t.join(15)
    got = [results.get_nowait() for _ in range(waiters)]
    assert got == [release] * waiters, got
    # every arrival was counted once: one generation released with all of them
    assert release.participants == waiters + 1 and release.generation == 1
    assert barrier.generation() == 2 and barrier.state().arrived == []
    job.close()


def test_advance_epoch_waiters_ride_out_a_restart(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory(aof=True)
    job = strata_redis.connect(server.url, "outage", heartbeat_timeout=30.0)
    workers = [job.register_worker(f"w{i}", heartbeat_interval=1.0) for i in range(4)]
    results: queue.Queue[Any] = queue.Queue()
    threads = _threads(results, [lambda i=i: job.advance_epoch(f"w{i}", 30) for i in range(3)])
    wait_for(lambda: len(epoch_barrier(job.context).state().arrived) == 3, 10)
    time.sleep(0.3)
    _restart(server)
    assert job.advance_epoch("w3", 30) == 1
    for t in threads:
        t.join(15)
    assert [results.get_nowait() for _ in range(3)] == [1, 1, 1]
    assert job.current_epoch() == 1  # moved once: no arrival counted twice
    for w in workers:
        w.stop_heartbeat()
    job.close()


def test_a_rendezvous_join_rides_out_a_restart(redis_factory: Callable[..., RedisServer]) -> None:
    server = redis_factory(aof=True)
    job = strata_redis.connect(server.url, "outage", heartbeat_timeout=30.0)
    workers = [job.register_worker(f"w{i}", heartbeat_interval=1.0) for i in range(2)]
    rdzv = Rendezvous(job.context, min_workers=2, last_call=0.1, timeout=30)
    results: queue.Queue[Any] = queue.Queue()
    (thread,) = _threads(results, [lambda: rdzv.join("w0", workers[0].incarnation)])
    time.sleep(0.5)  # w0 blocks on the rendezvous events
    _restart(server)
    mine = rdzv.join("w1", workers[1].incarnation)
    thread.join(15)
    other = results.get_nowait()
    assert not isinstance(other, BaseException), other
    assert (other.number, other.world_size) == (mine.number, 2) == (1, 2)
    assert {other.rank, mine.rank} == {0, 1}
    for w in workers:
        w.stop_heartbeat()
    job.close()


def test_an_outage_past_the_budget_is_a_clear_error(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory(aof=True)
    job = strata_redis.connect(server.url, "outage", heartbeat_timeout=30.0, redis_retry=1.0)
    for i in range(2):
        job.register_worker(f"w{i}", heartbeat_interval=None)
    barrier = job.barrier("b", expected=2, timeout=30)
    results: queue.Queue[Any] = queue.Queue()
    (thread,) = _threads(results, [lambda: barrier.wait("w0")])
    wait_for(_arrived(job, "b", 1), 10)
    time.sleep(0.3)
    start = time.monotonic()
    server.stop()
    thread.join(10)
    took = time.monotonic() - start
    err = results.get_nowait()
    assert isinstance(err, strata_redis.RedisUnavailableError), err
    assert isinstance(err, redis.ConnectionError)  # redis-py's handlers still catch it
    assert 1.0 <= took < 5.0 and err.seconds >= 1.0 and err.job_id == "outage"
    assert "unreachable for" in str(err) and "redis_retry" in str(err)
    # once Redis is back, calling again is a retry of the same arrival: counted once
    server.start()
    (thread,) = _threads(results, [lambda: barrier.wait("w0")])
    wait_for(_arrived(job, "b", 1), 10)
    release = barrier.wait("w1")
    thread.join(10)
    assert results.get_nowait() == release and release.participants == 2
    job.close()


def test_a_checkpoint_wait_rides_out_a_restart(
    redis_factory: Callable[..., RedisServer], tmp_path: Path
) -> None:
    server = redis_factory(aof=True)
    job = strata_redis.connect(server.url, "outage", heartbeat_timeout=30.0)
    ranks = [
        strata_redis.CheckpointManager(
            str(tmp_path), redis=job, worker_id=f"w{r}", rank=r, world_size=2, commit_timeout=30
        )
        for r in range(2)
    ]
    first = ranks[0].save(b"rank 0", step=1)
    time.sleep(0.5)  # rank 0 acked and waits for rank 1 in Redis
    assert not first.done()
    _restart(server)
    info = ranks[1].save(b"rank 1", step=1).result(30)
    assert first.result(30) == info and sorted(info.workers.values()) == ["w0", "w1"]
    assert ranks[0].load(step=1) == b"rank 0"
    for r in ranks:
        r.close()
    job.close()


class _GatedStorage(strata_redis.LocalStorage):
    """Local storage whose part writes wait for ``gate``: a save held in its upload."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.writing = threading.Event()

    def write(self, path: str, data: object) -> None:
        if not path.endswith("metadata.json"):
            self.writing.set()
            self.gate.wait(30)
        super().write(path, data)


def test_a_save_in_flight_across_a_restart_commits(
    redis_factory: Callable[..., RedisServer], tmp_path: Path
) -> None:
    server = redis_factory(aof=True)
    job = strata_redis.connect(server.url, "outage", heartbeat_timeout=30.0)
    gated = _GatedStorage(tmp_path)
    ranks = [
        strata_redis.CheckpointManager(
            storage, redis=job, worker_id=f"w{r}", rank=r, world_size=2, commit_timeout=30
        )
        for r, storage in enumerate([gated, strata_redis.LocalStorage(tmp_path)])
    ]
    first = ranks[0].save(b"rank 0", step=1)
    assert gated.writing.wait(10)  # rank 0 began the step and is uploading
    # Redis goes down while the upload runs: the ack is sent while it is down, then again
    # once it is back (not a failed save, not an aborted step)
    server.stop()
    gated.gate.set()
    time.sleep(0.3)
    server.start()
    info = ranks[1].save(b"rank 1", step=1).result(30)
    assert first.result(30) == info and sorted(info.workers.values()) == ["w0", "w1"]
    assert ranks[0].load(step=1) == b"rank 0"
    totals = job.client.hgetall(job.keys.checkpoint_totals)
    assert totals["saves"] == "2" and int(totals.get("aborted_steps", 0)) == 0, totals
    for r in ranks:
        r.close()
    job.close()


def test_a_repeated_ack_is_recorded_once(redis_url: str, tmp_path: Path) -> None:
    # an ack whose reply was lost is sent again: the same ack, recorded once, and answered
    # as an ack after the step committed
    job = strata_redis.connect(redis_url, "outage-ack")
    ranks = [
        strata_redis.CheckpointManager(
            str(tmp_path), redis=job, worker_id=f"w{r}", rank=r, world_size=2, commit_timeout=30
        )
        for r in range(2)
    ]
    cid = CheckpointId(1, None, 0)
    files = {"rank_0/model.bin": FileEntry("rank_0/model.bin", "model.bin", 0, 6, "crc32:00000000")}
    protocol = ranks[0].protocol
    protocol.begin(cid)
    assert protocol.ack(cid, files, 6, 0.1) is None
    assert protocol.ack(cid, files, 6, 0.1) is None  # again: recorded once
    totals = job.client.hgetall(job.keys.checkpoint_totals)
    assert totals["saves"] == "1" and totals["saved_bytes"] == "6", totals
    assert len(job.client.xrange(job.keys.checkpoint_records)) == 1
    info = ranks[1].save(b"rank 1", step=1).result(30)
    assert info.world_size == 2
    assert protocol.ack(cid, files, 6, 0.1) is None  # after the commit: still an ack
    assert job.client.hget(job.keys.checkpoint_totals, "saves") == "2"
    for r in ranks:
        r.close()
    job.close()


def test_the_readme_loop_reading_the_epoch_rides_out_a_restart(
    redis_factory: Callable[..., RedisServer], tmp_path: Path
) -> None:
    # three README loops that read orchestrator.epoch every batch; Redis restarts (0.3 s
    # down, AOF with appendfsync always: nothing is lost) mid-epoch, and the job finishes
    server = redis_factory(aof=True)
    logs = tmp_path / "logs"
    cfg = {"workers": 3, "sleep": 0.01, "save_every": 10, "read_epoch": True,
           "heartbeat_timeout": 5.0}  # fmt: skip
    procs = loops.start(server.url, logs, tmp_path / "ckpt", cfg)
    _restart(server, down=0.3)
    loops.assert_finished_once(procs, logs)


def test_public_reads_ride_out_a_restart(
    redis_factory: Callable[..., RedisServer], tmp_path: Path
) -> None:
    server = redis_factory(aof=True)
    job = strata_redis.connect(server.url, "outage", heartbeat_timeout=30.0)
    job.register_worker("w0", heartbeat_interval=None)
    shards = strata_redis.ShardManager(job)
    shards.register_dataset_params("d", 100, 10, True, 1)
    leases = job.leases("d", 0, "w0")
    leases.prepare()
    ckpt = strata_redis.CheckpointManager(str(tmp_path), redis=job, worker_id="w0")
    calls: list[Callable[[], Any]] = [
        job.current_epoch, job.workers, job.membership_generation, job.reap, job.state,
        leases.progress, leases.holders, leases.completed_by,
        lambda: shards.get_shard_for_worker("d", "w0", 0), ckpt.list, ckpt.latest,
        job.barrier("b", expected=2).state, lambda: job.leases("d", 1, "w0"),
    ]  # fmt: skip
    server.stop()  # each call is made while Redis is down, and answered once it is back
    results: queue.Queue[Any] = queue.Queue()
    threads = _threads(results, calls)
    time.sleep(0.3)
    server.start()
    for t in threads:
        t.join(30)
    got = [results.get_nowait() for _ in calls]
    assert not [r for r in got if isinstance(r, BaseException)], got
    ckpt.close()
    job.close()

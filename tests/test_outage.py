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
from strata_redis.coordination.epochs import epoch_barrier
from strata_redis.coordination.rendezvous import Rendezvous
from strata_redis.server import RedisServer

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

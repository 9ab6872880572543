"""Shard-lease throughput beside raw redis-py round trips and two Redis locks, same run.

    python perf/bench_leases.py -o perf/results/leases.json

One operation = take a lease and give it back:

- strata, the training loop (``for lease in leases: lease.complete()``): each ``complete``
  records the shard and leases the next one in one EVALSHA round trip (fenced, recorded
  exactly once);
- strata, ``acquire()`` + ``complete()`` called by hand: two EVALSHA round trips;
- raw redis-py: ``SET NX PX`` + ``DEL``, two round trips; and the same two commands in one
  pipelined round trip (``DEL`` of the last key + ``SET NX`` of the next), which is what
  the loop's single round trip is up against;
- redis-py's ``Lock`` and python-redis-lock: ``acquire`` + ``release``.

Each runs on one connection, and again from 4 processes at once.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from typing import Any

import redis
import redis_lock
from common import make_runner

import strata_redis
from strata_redis import ShardManager
from strata_redis.data import ShardLeases

PROCESSES = 4
RATIOS = [
    ("raw SET NX + DEL", "strata lease loop"),
    ("raw SET NX + DEL pipelined", "strata lease loop"),
    ("raw SET NX + DEL", "strata lease acquire + complete"),
    ("raw SET NX + DEL", "redis-py Lock acquire + release"),
    ("raw SET NX + DEL", "python-redis-lock acquire + release"),
    ("raw SET NX + DEL x4 processes", "strata lease loop x4 processes"),
    ("raw SET NX + DEL pipelined x4 processes", "strata lease loop x4 processes"),
]


def raw_ops(loops: int, url: str, tag: str) -> float:
    client = redis.Redis.from_url(url, decode_responses=True)
    key = f"bench:{{raw}}:{tag}"
    start = _go()
    for _ in range(loops):
        client.set(key, "1", nx=True, px=30_000)
        client.delete(key)
    return time.perf_counter() - start


def raw_pipelined_ops(loops: int, url: str, tag: str) -> float:
    client = redis.Redis.from_url(url, decode_responses=True)
    keys = [f"bench:{{raw}}:{tag}:{i % 2}" for i in range(2)]
    client.set(keys[1], "1")
    start = _go()
    for i in range(loops):
        with client.pipeline(transaction=False) as pipe:
            pipe.delete(keys[(i + 1) % 2])  # give back the last one ...
            pipe.set(keys[i % 2], "1", nx=True, px=30_000)  # ... and take the next
            pipe.execute()
    return time.perf_counter() - start


def fresh_epoch(loops: int, url: str, tag: str) -> ShardLeases:
    """A fresh epoch of ``loops`` shards for one worker, its pool created beforehand."""
    job = strata_redis.connect(url, "bench-leases", heartbeat_timeout=3600)
    worker = f"worker-{tag}"
    job.register_worker(worker, replace=True, heartbeat_interval=None)
    params = ShardManager(job).register_dataset_params(f"bench-{tag}-{loops}", loops, 1)
    epoch = int(job.client.incr("bench:{leases}:epoch"))  # fresh in every process
    leases = ShardLeases(job.context, params, epoch, worker)
    leases.prepare()
    return leases


def loop_ops(loops: int, url: str, tag: str) -> float:
    leases = fresh_epoch(loops, url, tag)
    start = _go()
    done = 0
    for lease in leases:
        done += lease.complete()
    assert done == loops
    return time.perf_counter() - start


def lease_ops(loops: int, url: str, tag: str) -> float:
    leases = fresh_epoch(loops, url, tag)
    start = time.perf_counter()
    for _ in range(loops):
        lease = leases.acquire()
        assert lease is not None
        lease.complete()
    return time.perf_counter() - start


def redispy_lock_ops(loops: int, url: str, tag: str) -> float:
    client = redis.Redis.from_url(url)
    lock = client.lock(f"bench:{{lock}}:{tag}", timeout=30)
    start = time.perf_counter()
    for _ in range(loops):
        lock.acquire()
        lock.release()
    return time.perf_counter() - start


def python_redis_lock_ops(loops: int, url: str, tag: str) -> float:
    client = redis.Redis.from_url(url)
    lock = redis_lock.Lock(client, f"prl-{tag}", expire=30)
    start = time.perf_counter()
    for _ in range(loops):
        lock.acquire()
        lock.release()
    return time.perf_counter() - start


#: in a child of ``in_processes``: every child and the parent pass it before timing starts
_START: Any = None


def _go() -> float:
    """Wait for the other processes (if any) to finish their setup; then start the clock."""
    if _START is not None:
        _START.wait()
    return time.perf_counter()


def _child(name: str, url: str, loops: int, tag: str, start: Any, done: Any) -> None:
    global _START
    _START = start
    OPS[name](loops, url, tag)
    done.put(tag)


OPS: dict[str, Callable[[int, str, str], float]] = {
    "raw": raw_ops, "pipelined": raw_pipelined_ops, "loop": loop_ops,
}  # fmt: skip


def in_processes(name: str) -> Callable[[int, str], float]:
    """Time ``loops`` operations spread over PROCESSES processes running at once: from the
    moment all of them have finished their setup (connection, registration, a fresh epoch)
    until the last one is done."""
    ctx = multiprocessing.get_context("spawn")

    def bench(loops: int, url: str) -> float:
        per = max(1, loops // PROCESSES)
        start, done = ctx.Barrier(PROCESSES + 1), ctx.Queue()
        procs = [
            ctx.Process(target=_child, args=(name, url, per, f"p{i}", start, done))
            for i in range(PROCESSES)
        ]
        for proc in procs:
            proc.start()
        start.wait(timeout=120)
        began = time.perf_counter()
        for _ in procs:
            done.get(timeout=600)
        elapsed = time.perf_counter() - began
        for proc in procs:
            proc.join(10)
        return elapsed

    return bench


if __name__ == "__main__":
    runner = make_runner()
    url = runner.args.redis_url
    runner.bench_time_func("raw SET NX + DEL", raw_ops, url, "one")
    runner.bench_time_func("raw SET NX + DEL pipelined", raw_pipelined_ops, url, "one")
    runner.bench_time_func("strata lease loop", loop_ops, url, "one")
    runner.bench_time_func("strata lease acquire + complete", lease_ops, url, "one")
    runner.bench_time_func("redis-py Lock acquire + release", redispy_lock_ops, url, "one")
    runner.bench_time_func("python-redis-lock acquire + release", python_redis_lock_ops, url, "one")
    runner.bench_time_func("raw SET NX + DEL x4 processes", in_processes("raw"), url)
    runner.bench_time_func(
        "raw SET NX + DEL pipelined x4 processes", in_processes("pipelined"), url
    )
    runner.bench_time_func("strata lease loop x4 processes", in_processes("loop"), url)

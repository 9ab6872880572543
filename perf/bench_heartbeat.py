"""Heartbeat round trip beside a raw redis-py ZADD round trip, in one run.

python perf/bench_heartbeat.py -o perf/results/heartbeat.json
"""

from __future__ import annotations

import time

import redis
from common import make_runner

import strata_redis

RATIOS = [
    ("strata heartbeat", "raw redis-py ZADD"),
    ("strata heartbeat+reap tick", "raw redis-py ZADD"),
]


def bench_raw_zadd(loops: int, url: str) -> float:
    client = redis.Redis.from_url(url, decode_responses=True)
    key = "bench:{raw}:heartbeats"
    start = time.perf_counter()
    for i in range(loops):
        client.zadd(key, {"worker-01": i})
    return time.perf_counter() - start


def bench_heartbeat(loops: int, url: str) -> float:
    job = strata_redis.connect(url, "bench-heartbeat", heartbeat_timeout=60)
    worker = job.register_worker("worker-01", replace=True, heartbeat_interval=None)
    start = time.perf_counter()
    for _ in range(loops):
        worker.heartbeat()
    return time.perf_counter() - start


def bench_heartbeat_tick(loops: int, url: str) -> float:
    """What the background thread sends each interval: heartbeat + reaper step, one round trip."""
    job = strata_redis.connect(url, "bench-heartbeat", heartbeat_timeout=60)
    worker = job.register_worker("worker-01", replace=True, heartbeat_interval=None)
    calls = [worker.heartbeat_call(), job.reap_call()]
    start = time.perf_counter()
    for _ in range(loops):
        job.scripts.run_many(calls)
    return time.perf_counter() - start


if __name__ == "__main__":
    runner = make_runner()
    url = runner.args.redis_url
    runner.bench_time_func("raw redis-py ZADD", bench_raw_zadd, url)
    runner.bench_time_func("strata heartbeat", bench_heartbeat, url)
    runner.bench_time_func("strata heartbeat+reap tick", bench_heartbeat_tick, url)

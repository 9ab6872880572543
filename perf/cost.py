"""Per-worker cost and recovery: what one worker costs Redis and its host, and how fast its
shards come back when it dies.

    python perf/cost.py [--workers 1000] [--shards 100000] [--results perf/results]

Measures, into ``<results>/cost.json``:

- Redis bytes per registered worker (``used_memory`` before and after registering
  ``--workers``, and ``MEMORY USAGE`` of the registry keys), and per shard of an epoch's
  lease pool as it opens (its keys' ``MEMORY USAGE``) and per completion of the first 1,000
  (what they added: record segments are created whole, so this is an upper bound; see
  ``perf/epochs.py`` for an epoch's bytes at 10^7 shards);
- a worker process's RSS (Python + strata_redis + a registered worker with its heartbeat
  thread) beside a bare Python process with redis-py that sent one command;
- the heartbeat thread's CPU share at the default interval (CPU seconds per tick, measured
  over many fast ticks, over the 2 s interval), beside a raw redis-py heartbeat + reaper
  tick (ZADD + ZRANGEBYSCORE, pipelined);
- worker start-up: process start, import, connect, register -> its first heartbeat seen by
  another process (median of 5), beside a bare redis-py process writing one ZADD;
- recovery: a worker holding a lease is SIGKILLed; seconds until its shard is back in the
  pool or leased to another worker, beside the heartbeat timeout (our bar: timeout + 1 s).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

import strata_redis
from strata_redis.data.record import epoch_keys
from strata_redis.server import RedisServer

HERE = Path(__file__).resolve().parent
TIMEOUT = 2.0  # the recovery run's heartbeat timeout, seconds

RSS = "int(open(f'/proc/{os.getpid()}/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')"
BARE = f"import os, sys, redis; redis.Redis.from_url(sys.argv[1]).ping(); print({RSS})"
WORKER = f"""import os, sys, time, strata_redis
job = strata_redis.connect(sys.argv[1], "cost-rss")
w = job.register_worker("rss", replace=True)
time.sleep(4.5)
print({RSS})
w.deregister()"""
STARTUP = """import sys, time, strata_redis
job = strata_redis.connect(sys.argv[1], "cost-start")
job.register_worker(sys.argv[2], heartbeat_interval=1.0)
time.sleep(30)"""
#: the reference: a process that imports redis-py and writes its own heartbeat (one ZADD)
BARE_STARTUP = """import sys, time, redis
redis.Redis.from_url(sys.argv[1]).zadd(sys.argv[3], {sys.argv[2]: time.time()})
time.sleep(30)"""
HOLDER = f"""import sys, time, strata_redis
job = strata_redis.connect(sys.argv[1], "cost-recover", heartbeat_timeout={TIMEOUT})
job.register_worker("victim", heartbeat_interval=0.5)
lease = job.leases("ds", 0, "victim", ttl=3600).acquire()
print(lease.shard_id, flush=True)
time.sleep(60)"""


def redis_bytes(url: str, workers: int, shards: int) -> dict[str, float]:
    client = redis.Redis.from_url(url, decode_responses=True)
    job = strata_redis.connect(url, "cost-mem", heartbeat_timeout=3600)
    before = client.info("memory")["used_memory"]
    for i in range(workers):
        job.register_worker(f"w{i:06d}", heartbeat_interval=None)
    after = client.info("memory")["used_memory"]
    k = job.keys
    registry = sum(
        client.memory_usage(key, samples=0) or 0
        for key in (k.heartbeats, k.status, k.incarnation, k.info)
    )
    strata_redis.ShardManager(job).register_dataset_params("ds", shards * 10, 10, True, 1)
    leases = job.leases("ds", 0, "w000000")
    leases.prepare()
    keys = epoch_keys(job.context, leases.params, 0)
    pool = sum(client.memory_usage(k, samples=0) or 0 for k in keys)
    done = 0
    for lease in leases:
        lease.complete()
        done += 1
        if done == 1000:
            break
    record = sum(client.memory_usage(k, samples=0) or 0 for k in keys) - pool
    return {
        "redis_bytes_per_worker": (after - before) / workers,
        "registry_key_bytes_per_worker": registry / workers,
        "pool_bytes_per_shard": pool / shards,
        "record_bytes_per_completion": record / done,
    }


def rss(url: str) -> dict[str, float]:
    bare = int(subprocess.check_output([sys.executable, "-c", BARE, url], timeout=60))
    worker = int(subprocess.check_output([sys.executable, "-c", WORKER, url], timeout=60))
    return {"bare_rss_mb": bare / 1e6, "worker_rss_mb": worker / 1e6}


def heartbeat_cpu(url: str, ticks: int = 300) -> dict[str, float]:
    """CPU per heartbeat tick, beside a raw redis-py tick (ZADD + a ZRANGEBYSCORE of the
    stale, pipelined: a hand-rolled heartbeat and reaper), interleaved on one thread."""
    job = strata_redis.connect(url, "cost-cpu")
    worker = job.register_worker("cpu", heartbeat_interval=None, replace=True)
    raw = redis.Redis.from_url(url, decode_responses=True)
    calls = [worker.heartbeat_call(), job.reap_call()]
    ours = ref = wall = 0.0
    for i in range(ticks):  # what the thread does each interval, on this thread to time it
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        job.scripts.run_many(calls)
        ours += time.thread_time() - cpu0
        wall += time.perf_counter() - wall0
        cpu0 = time.thread_time()
        with raw.pipeline(transaction=False) as pipe:
            pipe.zadd("cost:{raw}:heartbeats", {"cpu": i})
            pipe.zrangebyscore("cost:{raw}:heartbeats", "-inf", i - 1000)
            pipe.execute()
        ref += time.thread_time() - cpu0
    return {
        "heartbeat_cpu_s_per_tick": ours / ticks,
        "raw_heartbeat_cpu_s_per_tick": ref / ticks,
        "heartbeat_round_trip_ms": wall / ticks * 1e3,
        "heartbeat_cpu_percent": ours / ticks / 2.0 * 100,  # the default interval: 2 s
        "raw_heartbeat_cpu_percent": ref / ticks / 2.0 * 100,
    }


def startup(url: str, runs: int = 5) -> dict[str, float]:
    """Process start -> its first heartbeat seen by this process (median of ``runs``), for a
    strata worker and for the reference (a bare redis-py process's ZADD), taking turns."""
    client = redis.Redis.from_url(url, decode_responses=True)
    heartbeats = strata_redis.connect(url, "cost-start").keys.heartbeats
    times: dict[str, list[float]] = {"startup_ms": [], "bare_startup_ms": []}
    for i in range(runs):
        pair = (("startup_ms", STARTUP, heartbeats), ("bare_startup_ms", BARE_STARTUP, "c:beats"))
        for name, script, key in pair:
            start = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-c", script, url, f"s{i}", key])
            try:
                while client.zscore(key, f"s{i}") is None:
                    if time.perf_counter() - start > 60:
                        raise RuntimeError("the worker never registered")
                    time.sleep(0.002)
                times[name].append(time.perf_counter() - start)
            finally:
                proc.kill()
                proc.wait()
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def recovery(url: str) -> dict[str, float]:
    job = strata_redis.connect(url, "cost-recover", heartbeat_timeout=TIMEOUT)
    strata_redis.ShardManager(job).register_dataset_params("ds", 1000, 10, False, 0)
    job.register_worker("survivor", heartbeat_interval=0.5)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, url], stdout=subprocess.PIPE, text=True)
    try:
        shard = proc.stdout.readline().strip()  # type: ignore[union-attr]
        leases = job.leases("ds", 0, "survivor", ttl=3600)
        holders = leases.keys.holders
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.perf_counter()
        while True:
            leases.acquire()  # what a survivor's loop does: sweeps failed holders' leases
            held = job.client.hget(holders, shard)
            if held is None or not held.endswith(" victim"):
                break
            if time.perf_counter() - killed > 10 * TIMEOUT:
                raise RuntimeError("the shard never came back")
            time.sleep(0.02)
        return {"recovery_s": time.perf_counter() - killed, "heartbeat_timeout_s": TIMEOUT,
                "recovery_bar_s": TIMEOUT + 1.0}  # fmt: skip
    finally:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--shards", type=int, default=100_000)
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--redis-url", help="default: a private redis-server")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    args = parser.parse_args(argv)
    if args.smoke:
        args.workers, args.shards = 50, 2000
    args.results.mkdir(parents=True, exist_ok=True)
    server = None if args.redis_url else RedisServer().start()
    url = args.redis_url or server.url  # type: ignore[union-attr]
    try:
        redis.Redis.from_url(url).flushall()
        doc: dict[str, Any] = {"workers": args.workers, "shards": args.shards}
        for part in (redis_bytes(url, args.workers, args.shards), rss(url), heartbeat_cpu(url),
                     startup(url), recovery(url)):  # fmt: skip
            doc.update(part)
            print(", ".join(f"{k} {v:.4g}" for k, v in part.items()), flush=True)
        (args.results / "cost.json").write_text(json.dumps(doc, indent=2))
    finally:
        if server is not None:
            server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

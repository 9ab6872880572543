"""What a dataset's epochs cost Redis: an epoch in progress per shard, a finished epoch, and a
job's bytes as epochs finish (issue 24's bars).

    python perf/epochs.py [--shards 10000000] [--curve-shards 30000] [--results perf/results]

Measures, into ``<results>/epochs.json``, on a private redis-server (it reads its SLOWLOG):

- ``progress_bytes_per_shard``: ``MEMORY USAGE`` summed over an epoch's keys (every key
  ``strata:{J}:*:<epoch>:<dataset>``), over its shards, once one worker has completed 3,000
  (``--done``) of them (its own, in the epoch's shuffled order: spread over the whole id
  range, so every per-shard structure has reached its full size; it does not grow as more
  complete) and holds one lease. Bar: <= 16 bytes at 10^7 shards;
- ``finished_epoch_bytes``: the same sum once the job advanced and the next epoch's pool
  was built (the finished epoch closed into its summary);
- ``slowest_call_ms``: the longest command or script in the server's SLOWLOG over both (the
  bar: a few ms; this machine's load shows in it);
- ``job_bytes_by_epoch``: a job's bytes (every key ``strata:{J}:*``) after each of 9 epochs
  of ``--curve-shards`` shards drained by 3 workers taking turns (flat: each finished epoch
  closes when the next begins), and ``epochs_9_over_3``: after 9 over after 3 (bar: 1.25).

Only keys and ``MEMORY USAGE``: it runs against any version of the library (``git stash``
or a checkout of main, with ``PYTHONPATH`` at it, gives the "before").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import redis

import strata_redis
from strata_redis import ShardManager
from strata_redis.server import RedisServer

HERE = Path(__file__).resolve().parent


def key_bytes(client: redis.Redis, pattern: str) -> int:
    """``MEMORY USAGE`` summed over the keys matching ``pattern``."""
    keys = list(client.scan_iter(pattern, count=1000))
    return sum(client.memory_usage(k, samples=0) or 0 for k in keys)


def slowest_ms(client: redis.Redis) -> float:
    entries = [e for e in client.slowlog_get(10_000) if b"SLOWLOG" not in e["command"].upper()]
    return max((e["duration"] for e in entries), default=0) / 1000


def epoch_bytes(url: str, shards: int, done: int = 3_000) -> dict[str, float]:
    client = redis.Redis.from_url(url)
    job = strata_redis.connect(url, "epochs-big")
    ShardManager(job).register_dataset_params("ds", shards, 1)
    job.register_worker("w", heartbeat_interval=None)
    leases = job.leases("ds", 0, "w")
    began = time.perf_counter()
    leases.prepare()
    prepared = time.perf_counter() - began
    client.slowlog_reset()
    for n, lease in enumerate(leases, start=1):
        lease.complete()
        if n == done:
            break
    held = leases.acquire()
    assert held is not None
    slowest = slowest_ms(client)  # (before MEMORY USAGE: O(n) on a big hash or sorted set)
    progress = key_bytes(client, "strata:{epochs-big}:*:0:ds")
    job.advance_epoch("w", timeout=60)
    client.slowlog_reset()
    job.leases("ds", 1, "w").prepare()
    slowest = max(slowest, slowest_ms(client))
    finished = key_bytes(client, "strata:{epochs-big}:*:0:ds")
    job.close()
    return {
        "shards": shards,
        "progress_bytes_per_shard": progress / shards,
        "finished_epoch_bytes": finished,
        "slowest_call_ms": slowest,
        "prepare_s": prepared,
    }


def drain(job: strata_redis.Job, epoch: int, workers: list[str]) -> None:
    """One epoch, the workers taking turns (an acquire and a complete each)."""
    leases = [job.leases("ds", epoch, w) for w in workers]
    while True:
        got = [lz.acquire() for lz in leases]
        if not any(got):
            return
        for lease in got:
            if lease is not None:
                lease.complete()


def curve(url: str, shards: int, epochs: int = 9) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    job = strata_redis.connect(url, "epochs-curve")
    ShardManager(job).register_dataset_params("ds", shards, 1)
    workers = ["w0", "w1", "w2"]
    for w in workers:
        job.register_worker(w, heartbeat_interval=None)
    by_epoch = []
    for epoch in range(epochs):
        drain(job, epoch, workers)
        by_epoch.append(key_bytes(client, "strata:{epochs-curve}:*"))
        print(f"  after epoch {epoch}: {by_epoch[-1]} bytes", flush=True)
    job.close()
    return {
        "curve_shards": shards,
        "job_bytes_by_epoch": by_epoch,
        "epochs_9_over_3": by_epoch[8] / by_epoch[2] if epochs >= 9 else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=10_000_000)
    parser.add_argument("--curve-shards", type=int, default=30_000)
    parser.add_argument("--done", type=int, default=3_000, help="shards completed, in progress")
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--redis-url", help="ignored: a private server (its SLOWLOG is read)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    args = parser.parse_args(argv)
    if args.smoke:
        args.shards, args.curve_shards, args.done = 100_000, 150, 300
    args.results.mkdir(parents=True, exist_ok=True)
    extra = ["--slowlog-log-slower-than", "200", "--slowlog-max-len", "10000"]
    server = RedisServer(extra=extra).start()
    try:
        doc: dict[str, Any] = {}
        parts = (epoch_bytes(server.url, args.shards, args.done),
                 curve(server.url, args.curve_shards))  # fmt: skip
        for part in parts:
            doc.update(part)
            print(", ".join(f"{k} {v}" for k, v in part.items()), flush=True)
        (args.results / "epochs.json").write_text(json.dumps(doc, indent=2))
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

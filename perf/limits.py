"""Limits: the longest command the library sends at large epochs, and heartbeats on time with
many workers in one busy process.

    python perf/limits.py [--shards 100000,1000000,10000000] [--workers 100,300,1000]
    python perf/limits.py --smoke

Measures, into ``<results>/limits.json``:

- the longest command Redis ran (``SLOWLOG``, every command logged) while the library
  builds an epoch's lease pool (``prepare``), leases and completes shards, and restores
  the epoch to a checkpoint's data position, at each ``--shards`` size: no call may hold
  Redis for more than a few milliseconds at any size the library accepts;
- heartbeats on time with N workers registered in one process (each with its heartbeat
  thread, at a 1 s interval, 10 s timeout), for each ``--workers`` N: the longest gap
  between two heartbeats of any worker, read from Redis by another process every 100 ms, as
  a multiple of the interval, and how many workers were declared failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import redis

import strata_redis
from strata_redis.data.position import restore_position
from strata_redis.server import RedisServer

HERE = Path(__file__).resolve().parent
INTERVAL, TIMEOUT = 1.0, 10.0  # the heartbeat run's interval and timeout, seconds
FLOOR_US = 200  # commands faster than this are not logged (microseconds)

#: N workers with heartbeat threads in one process, until stdin closes
BUSY = f"""import sys, strata_redis
job = strata_redis.connect(sys.argv[1], "limits-beat", heartbeat_timeout={TIMEOUT})
workers = [job.register_worker(f"w{{i}}", heartbeat_interval={INTERVAL})
           for i in range(int(sys.argv[2]))]
print("ready", flush=True)
sys.stdin.read()
for w in workers:
    w.leave()"""


def longest_command(url: str, shards: int) -> dict[str, float]:
    """The longest command (ms) while an epoch of ``shards`` is prepared, leased, restored."""
    raw = redis.Redis.from_url(url, decode_responses=True)
    raw.flushall(asynchronous=True)  # a 10^7-shard epoch takes seconds to free
    # every command over FLOOR_US is logged (a chunk of a big epoch takes milliseconds)
    raw.config_set("slowlog-log-slower-than", FLOOR_US)
    raw.config_set("slowlog-max-len", 100_000)
    job = strata_redis.connect(url, "limits-big")
    params = strata_redis.ShardManager(job).register_dataset_params("ds", shards, 1)
    job.register_worker("w1", heartbeat_interval=None)
    longest = 0.0
    for phase in ("prepare", "lease", "restore"):
        raw.slowlog_reset()
        start = time.perf_counter()
        if phase == "prepare":
            job.leases("ds", 0, "w1").prepare()
        elif phase == "lease":
            leases = job.leases("ds", 0, "w1")
            for _ in range(100):
                lease = leases.acquire()
                assert lease is not None
                leases.complete(lease)
        else:
            done = set(range(0, shards, 3))
            offsets = {s: 1 for s in range(1, min(shards, 30_000), 3)}
            restore_position(
                job.context, params, 0, done, offsets, workers=["w1"], mark=1, later_epochs=0
            )
        took = time.perf_counter() - start
        # (not this harness's own SLOWLOG RESET: clearing ~40,000 entries takes 100 ms)
        entries = [e for e in raw.slowlog_get(100_000)
                   if not _text(e["command"]).upper().startswith("SLOWLOG")]  # fmt: skip
        # none logged: every command took under FLOOR_US (that bound is reported)
        phase_max = max((e["duration"] for e in entries), default=FLOOR_US) / 1000
        worst = max(entries, key=lambda e: e["duration"], default=None)
        if worst is not None:
            words = _text(worst["command"]).split()
            what = " ".join(words[:2] if words[0].upper() != "EVALSHA" else [words[0], *words[3:4]])
            print(f"    the longest: {what} ...", flush=True)
        print(f"  {shards:,} shards, {phase}: {took:.1f} s; longest command {phase_max:.2f} ms",
              flush=True)  # fmt: skip
        longest = max(longest, phase_max)
    raw.config_set("slowlog-log-slower-than", 10_000)
    job.close()
    return {f"longest_command_ms_{shards}": longest}


def _text(raw: object) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def heartbeats(url: str, workers: int, seconds: float) -> dict[str, float]:
    """Longest heartbeat gap (x interval) of ``workers`` heartbeating from one process."""
    raw = redis.Redis.from_url(url, decode_responses=True)
    raw.flushall(asynchronous=True)  # a 10^7-shard epoch takes seconds to free
    keys = strata_redis.Job(url, "limits-beat").keys
    proc = subprocess.Popen(
        [sys.executable, "-c", BUSY, url, str(workers)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        last: dict[str, float] = {}
        gap = 0.0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            now_s, now_us = raw.time()
            now = now_s * 1000 + now_us / 1000
            beats = dict(raw.zrange(keys.heartbeats, 0, -1, withscores=True))
            for worker, score in beats.items():
                if worker in last and score > last[worker]:
                    gap = max(gap, score - last[worker])
                last[worker] = score
                gap = max(gap, now - score)  # a heartbeat still outstanding counts too
            time.sleep(0.1)
        statuses = raw.hvals(keys.status)
    finally:
        proc.stdin.close()
        proc.wait(60)
    failed = sum(s == "failed" for s in statuses)
    print(
        f"  {workers} workers in one process: longest gap {gap / 1000:.2f} s "
        f"({gap / 1000 / INTERVAL:.2f}x the interval), {failed} declared failed",
        flush=True,
    )
    return {f"heartbeat_gap_x_{workers}": gap / 1000 / INTERVAL, f"failed_{workers}": failed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", default="100000,1000000,10000000")
    parser.add_argument("--workers", default="100,300,1000")
    parser.add_argument("--seconds", type=float, default=20.0, help="per heartbeat run")
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--redis-url", help="default: a private redis-server")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    args = parser.parse_args(argv)
    if args.smoke:
        args.shards, args.workers, args.seconds = "10000", "20", 3.0
    sizes = [int(s) for s in args.shards.split(",")]
    counts = [int(n) for n in args.workers.split(",")]
    args.results.mkdir(parents=True, exist_ok=True)
    server = None if args.redis_url else RedisServer().start()
    url = args.redis_url or server.url  # type: ignore[union-attr]
    doc: dict[str, Any] = {"shards": sizes, "workers": counts, "interval_s": INTERVAL}
    try:
        for size in sizes:
            doc.update(longest_command(url, size))
        for n in counts:
            doc.update(heartbeats(url, n, args.seconds))
    finally:
        if server is not None:
            server.close()
    doc["longest_command_ms"] = float(np.max([doc[f"longest_command_ms_{s}"] for s in sizes]))
    doc["longest_command_ms_largest"] = doc[f"longest_command_ms_{sizes[-1]}"]
    doc["heartbeat_gap_x_largest"] = doc[f"heartbeat_gap_x_{counts[-1]}"]
    doc["failed_largest"] = doc[f"failed_{counts[-1]}"]
    (args.results / "limits.json").write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

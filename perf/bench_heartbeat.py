"""Heartbeat round trip beside a raw redis-py ZADD round trip, in one run; and the era check's
cost (the same script with and without the era prelude).

python perf/bench_heartbeat.py -o perf/results/bench_heartbeat.json

Two kinds of figure:

- pyperf means (``-o``): each value is the mean of many calls; the regression check compares
  these (Welch's t over the values), and ``RATIOS`` are their ratios;
- per-call percentiles (``heartbeat.json`` beside ``-o``, perf/report.py's ``heartbeat``
  summary): after the pyperf runs, this (master) process times every single call of the
  raw ZADD, the heartbeat and the heartbeat+reap tick, interleaved round-robin on their own
  connections so that the same load drift hits all three, and writes p50/p99/p999 of single
  calls. The targets' latency rows read these: a p99 of means is not a per-call p99.

The era A/B: ``era.py`` prepends an era check (a ``GET`` of the era key and a compare) to
every script, and the client appends the era key and value to each call. Here the heartbeat
script is also registered without it (inside this benchmark only: ``NKEYS``/``NARGV`` as the
plain counts, then the same script body, its codes inlined), and both are sent the
same way (EVALSHA on one connection), the era one with the library's own ``stamp``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import redis
from common import make_runner

import strata_redis
from strata_redis import scripts, status

RATIOS = [
    ("strata heartbeat", "raw redis-py ZADD"),
    ("strata heartbeat+reap tick", "raw redis-py ZADD"),
    ("heartbeat script, era check", "heartbeat script, no era check"),
]
#: per-call samples of each kind (the full run; a smoke run takes SMOKE_CALLS)
CALLS = 20_000
SMOKE_CALLS = 200
WARMUP = 500


def bench_raw_zadd(loops: int, url: str) -> float:
    client = redis.Redis.from_url(url, decode_responses=True)
    key = "bench:{raw}:heartbeats"
    start = time.perf_counter()
    for i in range(loops):
        client.zadd(key, {"worker-01": i})
    return time.perf_counter() - start


def _worker(url: str) -> tuple[strata_redis.Job, Any]:
    job = strata_redis.connect(url, "bench-heartbeat", heartbeat_timeout=60)
    return job, job.register_worker("worker-01", replace=True, heartbeat_interval=None)


def bench_heartbeat(loops: int, url: str) -> float:
    _, worker = _worker(url)
    start = time.perf_counter()
    for _ in range(loops):
        worker.heartbeat()
    return time.perf_counter() - start


def bench_heartbeat_tick(loops: int, url: str) -> float:
    """What the background thread sends each interval: heartbeat + reaper step, one round trip."""
    job, worker = _worker(url)
    calls = [worker.heartbeat_call(), job.reap_call()]
    start = time.perf_counter()
    for _ in range(loops):
        job.scripts.run_many(calls)
    return time.perf_counter() - start


# -- the era A/B -----------------------------------------------------------------------------
def no_era_source(name: str) -> str:
    """Script ``name`` as Redis would run it without the era and clock check (this benchmark
    only)."""
    head = status.prelude()
    if not scripts.compiled()[name].startswith(head):
        raise RuntimeError("scripts no longer start with status.prelude(): update this bench")
    # NKEYS/NARGV are the plain counts when no era key and value are appended
    return "local NKEYS, NARGV = #KEYS, #ARGV " + scripts.body(name)


def era_pair(job: strata_redis.Job, worker: Any) -> tuple[Any, Any]:
    """Two callables sending ``worker``'s heartbeat script: with the era check, and without."""
    name, keys, args = worker.heartbeat_call()
    client = job.client
    with_era = job.scripts[name]
    without = client.register_script(no_era_source(name))
    client.script_load(with_era.script)
    client.script_load(without.script)

    def era() -> Any:
        k, a = job.scripts.stamp(keys, args)  # the library's own stamping, every call
        return job.scripts.unwrap(client.evalsha(with_era.sha, len(k), *k, *a), a)

    def plain() -> Any:
        return client.evalsha(without.sha, len(keys), *keys, *args)

    # both must do the same: a heartbeat answered OK
    for fn in (era, plain):
        reply = fn()
        if int(reply[0]) != int(status.Status.OK):
            raise RuntimeError(f"heartbeat script answered {reply!r}")
    return era, plain


def bench_era(loops: int, url: str, which: int) -> float:
    fn = era_pair(*_worker(url))[which]
    start = time.perf_counter()
    for _ in range(loops):
        fn()
    return time.perf_counter() - start


# -- per-call percentiles (the master process, after the pyperf runs) ------------------------
def per_call(url: str, calls: int) -> dict[str, Any]:
    """p50/p99/p999 of single calls of each kind, interleaved round-robin."""
    raw = redis.Redis.from_url(url, decode_responses=True)
    job, worker = _worker(url)
    tick = [worker.heartbeat_call(), job.reap_call()]
    era, plain = era_pair(job, worker)
    counter = iter(range(10**12))
    kinds = {
        "raw_zadd": lambda: raw.zadd("bench:{raw}:heartbeats", {"worker-01": next(counter)}),
        "heartbeat": worker.heartbeat,
        "tick": lambda: job.scripts.run_many(tick),
        "era": era,
        "no_era": plain,
    }
    fns = list(kinds.values())
    for _ in range(WARMUP):
        for fn in fns:
            fn()
    samples = np.empty((len(fns), calls), dtype=np.int64)
    clock = time.perf_counter_ns
    for i in range(calls):
        k0 = i % len(fns)  # rotate who goes first
        for k in (*range(k0, len(fns)), *range(k0)):
            fn = fns[k]
            t0 = clock()
            fn()
            samples[k, i] = clock() - t0
    doc: dict[str, Any] = {
        "calls": calls,
        "how": "single calls, each timed alone (perf_counter_ns), kinds interleaved round-robin",
    }
    for k, kind in enumerate(kinds):
        p = np.percentile(samples[k], [50, 99, 99.9]) / 1e6
        doc[f"{kind}_p50_ms"], doc[f"{kind}_p99_ms"], doc[f"{kind}_p999_ms"] = map(float, p)
        doc[f"{kind}_mean_ms"] = float(samples[k].mean() / 1e6)
    return doc


if __name__ == "__main__":
    runner = make_runner()
    url = runner.args.redis_url
    runner.bench_time_func("raw redis-py ZADD", bench_raw_zadd, url)
    runner.bench_time_func("strata heartbeat", bench_heartbeat, url)
    runner.bench_time_func("strata heartbeat+reap tick", bench_heartbeat_tick, url)
    runner.bench_time_func("heartbeat script, era check", bench_era, url, 0)
    runner.bench_time_func("heartbeat script, no era check", bench_era, url, 1)
    if not runner.args.worker:
        n = SMOKE_CALLS if runner.args.debug_single_value else CALLS
        summary = per_call(url, n)
        print(
            f"per call ({n} each): "
            + ", ".join(
                f"{k} p50 {summary[f'{k}_p50_ms']:.3f} / p99 {summary[f'{k}_p99_ms']:.3f} / "
                f"p999 {summary[f'{k}_p999_ms']:.3f} ms"
                for k in ("raw_zadd", "heartbeat", "tick", "era", "no_era")
            ),
            flush=True,
        )
        if runner.args.output:  # beside the pyperf results: perf/report.py's "heartbeat"
            out = Path(runner.args.output).with_name("heartbeat.json")
            out.write_text(json.dumps(summary, indent=2))

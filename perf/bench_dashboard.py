"""``GET /api/dashboard`` at 10, 100 and 1,000 workers beside the raw pipelined reads it needs.

    python perf/bench_dashboard.py -o perf/results/dashboard.json

Each job has N live workers (statuses mixed, each holding one shard lease), 20 more that
left, a dataset of 10,000 shards half done in the current epoch, 500 barrier releases and
1,000 committed checkpoint steps with their 1,000 save records (``--debug-single-value``
smoke runs: 50 steps, at most 50 lease holders). Everything is built with the library's own
calls, once per Redis (about a minute for the 1,000-worker job).

- ``GET /api/dashboard?job=J, N workers``: the Flask app in process (WSGI: routing, the
  reads, JSON), the shared-read cache off, so every request reads Redis;
- ``... (HTTP, waitress)``: the same through ``strata_redis.dashboard.serve``'s waitress on
  loopback, with a keep-alive connection;
- ``raw pipelined reads, N workers``: the Redis commands one document costs, sent by raw
  redis-py in the same two pipelined round trips, replies parsed by redis-py only: what
  the dashboard is up against.

The master prints the Redis commands per request (``INFO commandstats``, before and after
one request) and stores them in the results' metadata.
"""

from __future__ import annotations

import http.client
import os
import shutil
import tempfile
import threading
import time
from typing import Any

import redis
from common import make_runner

import strata_redis
from strata_redis.dashboard import create_app
from strata_redis.dashboard.state import (
    CHECKPOINTS_READ,
    EVENTS_READ,
    LATENCIES_READ,
    RECORDS_READ,
)
from strata_redis.keys import Keys

SIZES = (10, 100, 1000)
SHARDS = 10_000
LEFT = 20
RELEASES = 500
STATUSES = ("training", "training", "checkpointing", "idle")
RATIOS = [(f"GET /api/dashboard, {n} workers", f"raw pipelined reads, {n} workers") for n in SIZES]
RATIOS.append(
    ("GET /api/dashboard (HTTP, waitress), 1000 workers", "raw pipelined reads, 1000 workers")
)


def job_id(n: int) -> str:
    return f"bench-dashboard-{n}"


def build(url: str, n: int, records: int, holders: int) -> None:
    """Job ``n``'s state, made once per Redis with the library's own calls."""
    client = redis.Redis.from_url(url, decode_responses=True)
    marker = f"bench:{{dashboard}}:built:{n}:{records}:{holders}"
    if client.exists(marker):
        return
    job = strata_redis.connect(url, job_id(n), heartbeat_timeout=86400)
    ids = [f"worker-{i:04d}" for i in range(n)]
    workers = [
        job.register_worker(w, host=f"gpu-{i % 64:02d}", address=f"10.0.{i // 250}.{i % 250}:1",
                            gpu_count=8, labels={"rack": f"r{i % 8}"}, replace=True,
                            heartbeat_interval=None)
        for i, w in enumerate(ids)
    ]  # fmt: skip
    for i, w in enumerate(workers):
        w.set_status(STATUSES[i % len(STATUSES)])
    for i in range(LEFT):
        job.register_worker(f"gone-{i:02d}", heartbeat_interval=None, replace=True).deregister()
    sm = strata_redis.ShardManager(job)
    sm.register_dataset_params("tokens", SHARDS * 100, 100, True, 1)
    # Each worker's first acquire sends the epoch's whole pool to init_epoch (~40 ms here):
    # ``holders`` workers take part, and each then holds one lease (its shard in progress).
    leases = [job.leases("tokens", 0, w) for w in ids[:holders]]
    for i in range(SHARDS // 2):  # half the epoch done, spread over them
        lease = leases[i % holders].acquire()
        assert lease is not None
        lease.complete()
    for own in leases:
        assert own.acquire() is not None
    for i in range(RELEASES):
        job.barrier("step", expected=1).wait(ids[i % n])
    job.barrier_latencies()  # flush the latency records
    directory = tempfile.mkdtemp(prefix="strata-bench-dashboard-")
    try:
        with strata_redis.CheckpointManager(directory, keep_count=records, redis=job,
                                            worker_id=ids[0]) as ckpt:  # fmt: skip
            for step in range(1, records + 1):
                ckpt.save(os.urandom(1024), step=step, epoch=0).result()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    client.set(marker, "1")
    job.close()
    client.close()


def bench_api(loops: int, url: str, n: int) -> float:
    client = create_app(url, job=job_id(n), min_interval=0).test_client()
    path = f"/api/dashboard?job={job_id(n)}"
    assert client.get(path).status_code == 200  # warm: committed steps decoded once
    start = time.perf_counter()
    for _ in range(loops):
        reply = client.get(path)
        reply.get_data()
    elapsed = time.perf_counter() - start
    assert reply.status_code == 200
    return elapsed


_SERVERS: dict[int, int] = {}  # workers -> the port of this process's waitress server


def _server_port(url: str, n: int) -> int:
    """One waitress server per process and job, left running until the process exits
    (waitress has no clean way to stop a loop running in another thread)."""
    from waitress import create_server

    if n not in _SERVERS:
        app = create_app(url, job=job_id(n), min_interval=0)
        server: Any = create_server(app, host="127.0.0.1", port=0, threads=4)
        threading.Thread(target=server.run, daemon=True).start()
        _SERVERS[n] = server.effective_port
    return _SERVERS[n]


def bench_http(loops: int, url: str, n: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", _server_port(url, n), timeout=30)
    path = f"/api/dashboard?job={job_id(n)}"
    conn.request("GET", path)
    conn.getresponse().read()
    start = time.perf_counter()
    for _ in range(loops):
        conn.request("GET", path)
        reply = conn.getresponse()
        reply.read()
    elapsed = time.perf_counter() - start
    assert reply.status == 200
    conn.close()
    return elapsed


def newest_ids(client: redis.Redis, n: int) -> list[str]:
    """The newest entry id of each stream the document reads (its kept tails' ends)."""
    k = Keys(job_id(n))
    keys = (k.events, k.barrier_latency, k.checkpoint_records)
    return [str(client.xrevrange(key, count=1)[0][0]) for key in keys]


def raw_reads(client: redis.Redis, n: int, newest: list[str]) -> None:
    """The commands of one document in the steady state (stream tails and committed steps
    kept from the previous document), with redis-py's plainest calls."""
    k = Keys(job_id(n))
    with client.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.info("stats")
        pipe.execute_command("ZRANGE", k.heartbeats, 0, -1, "WITHSCORES")
        pipe.hlen(k.status)
        pipe.get(k.generation)
        pipe.get(k.epoch)
        pipe.hgetall(k.datasets)
        for key, last, cap in zip(
            (k.events, k.barrier_latency, k.checkpoint_records), newest,
            (EVENTS_READ, LATENCIES_READ, RECORDS_READ), strict=True,
        ):  # fmt: skip
            pipe.xrevrange(key, max="+", min=f"({last}", count=cap)
            pipe.xlen(key)
        pipe.zrange(k.checkpoints, 0, CHECKPOINTS_READ - 1, desc=True)
        pipe.get(k.fence)
        pipe.get(k.failures)
        pipe.hmget(k.checkpoint_totals, ["saves", "saved_bytes", "save_ms",
                                         "aborted_steps", "aborted_saves"])  # fmt: skip
        heads = pipe.execute()
    listed = [w for w, _ in heads[2]] + [f"gone-{i:02d}" for i in range(LEFT)]
    page = listed[:1000]
    lk = k.lease_keys("tokens", 0)
    with client.pipeline(transaction=False) as pipe:
        pipe.hmget(k.status, listed)
        pipe.hmget(k.info, page)
        pipe.hmget(k.incarnation, page)
        pipe.hmget(lk.meta, ["created_ms", "steals", "closed_ms", "done"])
        pipe.hlen(lk.holders)
        pipe.hgetall(lk.holders)
        # the completions per worker (the epoch meta's counts) are read by one document in
        # every DISTRIBUTION_EVERY_S seconds: not in the steady state measured here
        pipe.execute()


def bench_raw(loops: int, url: str, n: int) -> float:
    client = redis.Redis.from_url(url, decode_responses=True)
    newest = newest_ids(client, n)
    raw_reads(client, n, newest)
    start = time.perf_counter()
    for _ in range(loops):
        raw_reads(client, n, newest)
    return time.perf_counter() - start


def commands_per_request(url: str, n: int) -> tuple[int, int]:
    """(commands one request costs, commands of the raw reference), by INFO commandstats."""

    def calls(client: redis.Redis) -> int:
        stats = client.info("commandstats")
        return sum(v["calls"] for v in stats.values())

    client = redis.Redis.from_url(url, decode_responses=True)
    app = create_app(url, job=job_id(n), min_interval=0).test_client()
    app.get(f"/api/dashboard?job={job_id(n)}")
    before = calls(client)
    app.get(f"/api/dashboard?job={job_id(n)}")
    api = calls(client) - before - 1  # the INFO of "before" itself
    newest = newest_ids(client, n)
    before = calls(client)
    raw_reads(client, n, newest)
    raw = calls(client) - before - 1
    return api, raw


if __name__ == "__main__":
    runner = make_runner()
    url = runner.args.redis_url
    smoke = runner.args.debug_single_value  # proves it runs: a smaller state, built faster
    records = 50 if smoke else 1000
    if not runner.args.worker:
        for n in SIZES:
            build(url, n, records, min(n, 50) if smoke else n)
            api, raw = commands_per_request(url, n)
            runner.metadata[f"dashboard_commands_per_request_{n}"] = api
            runner.metadata[f"raw_commands_per_request_{n}"] = raw
            print(f"{n} workers: {api} Redis commands per GET /api/dashboard "
                  f"(raw reference: {raw}), 2 round trips", flush=True)  # fmt: skip
    for n in SIZES:
        runner.bench_time_func(f"raw pipelined reads, {n} workers", bench_raw, url, n)
        runner.bench_time_func(f"GET /api/dashboard, {n} workers", bench_api, url, n)
    runner.bench_time_func(
        "GET /api/dashboard (HTTP, waitress), 1000 workers", bench_http, url, 1000
    )

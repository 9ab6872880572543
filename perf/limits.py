"""Limits: the longest command the library sends at large epochs, and heartbeats on time with
many workers in one busy process.

    python perf/limits.py [--shards 100000,1000000,10000000] [--workers 100,300,1000]
    python perf/limits.py --smoke

Measures, into ``<results>/limits.json``:

- the longest command Redis ran (``SLOWLOG``, every command logged) while the library
  builds an epoch's lease pool (``prepare``), leases and completes shards, and restores
  the epoch to a checkpoint's data position, at each ``--shards`` size: no call may hold
  Redis for more than a few milliseconds at any size the library accepts; meanwhile another
  job's 4 workers heartbeat on the same Redis (2 s timeout): none may be declared failed;
- the longest command with N workers in one job, for each ``--job-workers`` N (up to the
  documented 10^5): registering them, a "live" barrier of all of them released, a count
  barrier timing out (its record names the absent), a lease sweep after a membership change
  with N leases held, a reaper step, a rendezvous round of all of them (joins and close, the
  check after one left, the survivors' next round), ``job.workers()`` and a dashboard read;
- heartbeats on time with N workers registered in one process (each with its heartbeat
  thread, at a 1 s interval, 10 s timeout), half of them waiting at one barrier, for each
  ``--workers`` N: the longest gap between two heartbeats of any worker, read from Redis by
  another process every 100 ms, as a multiple of the interval, how many workers were
  declared failed, how many barrier waits raised, and "unreachable" warnings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import redis

import strata_redis
from strata_redis.connection import hash_items
from strata_redis.coordination import Rendezvous
from strata_redis.dashboard.state import DashboardState
from strata_redis.data.leases import new_grant
from strata_redis.data.position import restore_position
from strata_redis.errors import BarrierTimeoutError, RoundBrokenError
from strata_redis.keys import LeaseKeys
from strata_redis.server import RedisServer
from strata_redis.status import Status

HERE = Path(__file__).resolve().parent
INTERVAL, TIMEOUT = 1.0, 10.0  # the heartbeat run's interval and timeout, seconds
FLOOR_US = 200  # commands faster than this are not logged (microseconds)

#: N workers with heartbeat threads in one process, half of them waiting at one barrier
#: (it releases when the other half arrives, after stdin closes); prints the waits' errors
BUSY = f"""import logging, sys, threading, strata_redis
unreachable = []
class Seen(logging.Handler):
    def emit(self, record):
        if "unreachable" in record.getMessage():
            unreachable.append(record.getMessage())
logging.getLogger("strata_redis").addHandler(Seen())
job = strata_redis.connect(sys.argv[1], "limits-beat", heartbeat_timeout={TIMEOUT})
n = int(sys.argv[2])
workers = [job.register_worker(f"w{{i}}", heartbeat_interval={INTERVAL}) for i in range(n)]
barrier, errors = job.barrier("hold", n), []
def wait(w):
    try:
        barrier.wait(w.worker_id, timeout=600)
    except Exception as exc:
        errors.append(repr(exc))
waiters = [threading.Thread(target=wait, args=(w,)) for w in workers]
for t in waiters[: n // 2]:
    t.start()
print("ready", flush=True)
sys.stdin.read()
for t in waiters[n // 2 :]:
    t.start()
for t in waiters:
    t.join(120)
print("errors", len(errors), len(unreachable), *errors[:3], *unreachable[:3], flush=True)
for w in workers:
    w.leave()"""


#: another job's workers heartbeating on the same Redis (0.5 s interval, 2 s timeout) while a
#: big epoch is built, until stdin closes; prints how many of them were declared failed
NEIGHBOUR = """import sys, strata_redis
job = strata_redis.connect(sys.argv[1], "limits-neighbour", heartbeat_timeout=2.0)
workers = [job.register_worker(f"n{i}", heartbeat_interval=0.5) for i in range(4)]
print("ready", flush=True)
sys.stdin.read()
print(sum(w.status == "failed" for w in job.workers()), flush=True)"""


def longest_command(url: str, shards: int) -> dict[str, float]:
    """The longest command (ms) while an epoch of ``shards`` is prepared, leased, restored,
    and how many of another job's heartbeating workers were declared failed meanwhile."""
    raw = redis.Redis.from_url(url, decode_responses=True)
    raw.flushall(asynchronous=True)  # a 10^7-shard epoch takes seconds to free
    neighbour = subprocess.Popen(
        [sys.executable, "-c", NEIGHBOUR, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert neighbour.stdout is not None and neighbour.stdin is not None
    assert neighbour.stdout.readline().strip() == "ready"
    _log_every_command(raw)
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
        longest = max(longest, _slowlog_max(raw, f"{shards:,} shards, {phase} ({took:.1f} s)"))
    raw.config_set("slowlog-log-slower-than", 10_000)
    job.close()
    neighbour.stdin.close()
    failed = int(neighbour.stdout.read().split()[0])
    neighbour.wait(60)
    print(f"  another job's 4 workers (2 s timeout) declared failed meanwhile: {failed}",
          flush=True)  # fmt: skip
    return {f"longest_command_ms_{shards}": longest, f"neighbour_failed_{shards}": failed}


def _log_every_command(raw: redis.Redis) -> None:
    """SLOWLOG keeps every command over FLOOR_US (a chunk of a big epoch takes milliseconds)."""
    raw.config_set("slowlog-log-slower-than", FLOOR_US)
    raw.config_set("slowlog-max-len", 100_000)
    raw.slowlog_reset()


def _slowlog_max(raw: redis.Redis, what: str) -> float:
    """The longest command (ms) since the last reset, printed with ``what`` and the command;
    then a reset. None logged: every command took under FLOOR_US (that bound is reported)."""
    # (not this harness's own SLOWLOG RESET: clearing ~40,000 entries takes 100 ms)
    entries = [e for e in raw.slowlog_get(100_000)
               if not _text(e["command"]).upper().startswith("SLOWLOG")]  # fmt: skip
    worst = max(entries, key=lambda e: e["duration"], default=None)
    longest = FLOOR_US / 1000 if worst is None else worst["duration"] / 1000
    command = ""
    if worst is not None:
        words = _text(worst["command"]).split()
        command = " ".join(words[:2] if words[0].upper() != "EVALSHA" else [words[0], *words[3:4]])
    print(f"    {what}: longest command {longest:.2f} ms {command}", flush=True)
    raw.slowlog_reset()
    return longest


def job_of(url: str, n: int) -> dict[str, float]:
    """The longest command (ms) with ``n`` workers in one job (see the module doc)."""
    raw = redis.Redis.from_url(url, decode_responses=True)
    raw.flushall(asynchronous=True)
    _log_every_command(raw)
    job = strata_redis.connect(url, "limits-many", heartbeat_timeout=3600)
    names = [f"w{i:06d}" for i in range(n)]
    start = time.perf_counter()
    for name in names:
        job.register_worker(name, heartbeat_interval=None)
    print(f"  {n:,} workers in one job (registered in {time.perf_counter() - start:.0f} s)",
          flush=True)  # fmt: skip
    phases = {"register": _slowlog_max(raw, "registering")}
    live = job.barrier("all", "live")
    calls = [live.arrive_call(w, uuid.uuid4().hex, 1, 600) for w in names]
    for first in range(0, n - 1, 2_000):
        job.scripts.run_many(calls[first : min(n - 1, first + 2_000)])
    raw.slowlog_reset()
    job.scripts.run_many(calls[-1:])  # the last arrival releases all of them
    phases["live_release"] = _slowlog_max(raw, "the last arrival of a live barrier")
    count = job.barrier("count", n)
    job.scripts.run_many([count.arrive_call(names[0], uuid.uuid4().hex, 1, 600)])
    raw.slowlog_reset()
    with contextlib.suppress(BarrierTimeoutError):
        count.wait(names[1], timeout=0.5)
    phases["timeout"] = _slowlog_max(raw, "a count barrier timing out")
    strata_redis.ShardManager(job).register_dataset_params("ds", n * 10, 10)
    holder = job.leases("ds", 0, names[0], ttl=3600)
    holder.prepare()
    # one worker holds n leases (the sweep's cost is per lease held, not per worker)
    call = (
        "acquire_shard",
        holder._handoff_keys(),
        [*holder._acquire_args, "", "", "", "", new_grant()],
    )
    for first in range(0, n, 2_000):
        job.scripts.run_many([call] * min(2_000, n - first))
    assert raw.hlen(LeaseKeys(job.keys, "ds", 0).holders) == n
    other = job.leases("ds", 0, names[1], ttl=3600)
    other.prepare()
    job.register_worker("late", heartbeat_interval=None)  # the membership moves
    raw.slowlog_reset()
    for _ in range(10):
        other.acquire()
    phases["sweep"] = _slowlog_max(raw, "acquires after a membership change (the sweep)")
    job.reap()
    phases["reap"] = _slowlog_max(raw, "a reaper step")
    phases.update(_rendezvous_of(job, raw, names))
    job.workers()
    phases["workers_read"] = _slowlog_max(raw, "job.workers() (strata status)")
    DashboardState(job.client, heartbeat_timeout=3600).read("limits-many", limit=100)
    phases["dashboard_read"] = _slowlog_max(raw, "a dashboard document")
    raw.config_set("slowlog-log-slower-than", 10_000)
    job.close()
    doc = {f"job_workers_{phase}_ms_{n}": ms for phase, ms in phases.items()}
    doc[f"job_workers_longest_ms_{n}"] = max(phases.values())
    return doc


def _rendezvous_of(job: strata_redis.Job, raw: redis.Redis, names: list[str]) -> dict[str, float]:
    """A rendezvous round of every worker: joins, the close, a member lost (check_round), the
    survivors' next round (closing early when all are back); the longest command of each."""
    incs = {w: int(i) for w, i in hash_items(raw, job.keys.incarnation).items()}
    rdzv = Rendezvous(job.context, min_workers=2, max_workers=len(names),
                                   last_call=3600)  # fmt: skip

    def join_all(members: list[str], guess: int, leaving: int) -> None:
        for w in members:
            reply = rdzv.join_step(w, incs[w], guess, leaving)
            if int(reply[0]) == Status.ROUND_MOVED:
                reply = rdzv.join_step(w, incs[w], int(reply[1]), leaving)
            guess = int(reply[2])

    join_all(names, 0, 0)  # closes at max_workers
    first = rdzv.join(names[0], incs[names[0]])
    phases = {"rendezvous_round": _slowlog_max(raw, f"a rendezvous round of {len(names):,}")}
    k = job.keys
    job.scripts.run("deregister_worker",  # names[1] leaves, as Worker.deregister does
                    [k.heartbeats, k.status, k.incarnation, k.generation, k.events],
                    [names[1], incs[names[1]], job.events_cap], {})  # fmt: skip
    try:
        rdzv.check(first)
        raise AssertionError("check_round missed the lost member")
    except RoundBrokenError:
        pass
    phases["rendezvous_check"] = _slowlog_max(raw, "check_round after a member was lost")
    join_all([names[0], *names[2:]], first.number, first.number)  # closes when all are back
    assert rdzv.join(names[0], incs[names[0]]).world_size == len(names) - 1
    phases["rendezvous_again"] = _slowlog_max(raw, "the survivors' next round")
    return phases


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
        report = proc.stdout.read().split()
        proc.wait(60)
    failed = sum(s == "failed" for s in statuses)
    # "errors <barrier waits that raised> <'unreachable' warnings> <the first ones>"
    errors, unreachable = (int(report[1]), int(report[2])) if report[:1] == ["errors"] else (-1, -1)
    print(
        f"  {workers} workers in one process, {workers // 2} of them at a barrier: longest gap "
        f"{gap / 1000:.2f} s ({gap / 1000 / INTERVAL:.2f}x the interval), {failed} declared "
        f"failed, {errors} barrier errors, {unreachable} 'unreachable' warnings",
        flush=True,
    )
    return {
        f"heartbeat_gap_x_{workers}": gap / 1000 / INTERVAL,
        f"failed_{workers}": failed,
        f"barrier_errors_{workers}": errors,
        f"unreachable_{workers}": unreachable,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", default="100000,1000000,10000000")
    parser.add_argument("--workers", default="100,300,1000")
    parser.add_argument(
        "--job-workers", default="10000,99999", help="workers in one job (a ring holds 10^5)"
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="per heartbeat run")
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--redis-url", help="default: a private redis-server")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    args = parser.parse_args(argv)
    if args.smoke:
        args.shards, args.workers, args.seconds, args.job_workers = "10000", "20", 3.0, "2000"
    sizes = [int(s) for s in args.shards.split(",")]
    counts = [int(n) for n in args.workers.split(",")]
    per_job = [int(n) for n in args.job_workers.split(",")]
    args.results.mkdir(parents=True, exist_ok=True)
    server = None if args.redis_url else RedisServer().start()
    url = args.redis_url or server.url  # type: ignore[union-attr]
    doc: dict[str, Any] = {"shards": sizes, "workers": counts, "interval_s": INTERVAL}
    try:
        for size in sizes:
            doc.update(longest_command(url, size))
        for n in per_job:
            doc.update(job_of(url, n))
        for n in counts:
            doc.update(heartbeats(url, n, args.seconds))
    finally:
        if server is not None:
            server.close()
    doc["longest_command_ms"] = float(np.max([doc[f"longest_command_ms_{s}"] for s in sizes]))
    doc["longest_command_ms_largest"] = doc[f"longest_command_ms_{sizes[-1]}"]
    doc["neighbour_failed_largest"] = doc[f"neighbour_failed_{sizes[-1]}"]
    doc["heartbeat_gap_x_largest"] = doc[f"heartbeat_gap_x_{counts[-1]}"]
    doc["failed_largest"] = doc[f"failed_{counts[-1]}"]
    doc["barrier_errors_largest"] = doc[f"barrier_errors_{counts[-1]}"]
    doc["job_workers_longest_ms_largest"] = doc[f"job_workers_longest_ms_{per_job[-1]}"]
    (args.results / "limits.json").write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What ``durability="replicated"`` costs: a lease hand-off and a checkpoint commit in the
default durability at 0 and 1 replicas, and in the replicated one at 1 replica, one run.

    python perf/durability_cost.py [-o perf/results/durability.json] [--fast]

The master starts two private deployments on loopback (no persistence): a lone primary,
and a primary with one replica (``--replicaof``, in sync before the run); pyperf's workers
get both URLs. One operation:

- a lease hand-off: ``acquire()`` + ``complete()`` by hand (two EVALSHA round trips; in the
  replicated mode each is followed by a ``WAIT 1`` on its connection, in the same round
  trip, answered once the replica acknowledged it);
- a checkpoint commit: ``CheckpointManager.save(1 KiB, step).result()`` of one rank to a
  local directory (begin, upload, ack, ``metadata.json``, commit: the commit is the call
  that waits in the replicated mode), retention of ``keep_count=2`` included.

The master prints each replicated figure as a ratio to the default's at 1 replica (what the
mode adds) and at 0 replicas.
"""

from __future__ import annotations

import argparse
import atexit
import itertools
import shutil
import tempfile
import time
from typing import Any

import pyperf
import redis

import strata_redis
from strata_redis import ShardManager
from strata_redis.data import ShardLeases
from strata_redis.server import RedisServer

#: (label, deployment, durability)
VARIANTS = [
    ("default, 0 replicas", "solo", "default"),
    ("default, 1 replica", "pair", "default"),
    ("replicated, 1 replica", "pair", "replicated"),
]
_tags = itertools.count()


def _pass_args(cmd: list[str], args: argparse.Namespace) -> None:
    # pyperf re-runs this script in worker processes: hand them the same deployments
    cmd.extend(["--solo-url", args.solo_url, "--pair-url", args.pair_url, "--dir", args.dir])


def _deployments(args: argparse.Namespace) -> None:
    """Start the lone primary and the primary with its replica (the master only)."""
    solo = RedisServer().start()
    primary = RedisServer().start()
    replica = RedisServer(extra=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    for server in (replica, primary, solo):
        atexit.register(server.close)
    with redis.Redis(port=primary.port) as client:
        deadline = time.monotonic() + 30
        while int(client.execute_command("WAIT", 1, 100)) < 1:
            if time.monotonic() > deadline:
                raise TimeoutError("the replica did not sync")
    args.solo_url, args.pair_url = solo.url, primary.url
    args.dir = tempfile.mkdtemp(prefix="strata-durability-")
    atexit.register(shutil.rmtree, args.dir, True)


def _job(url: str, mode: str) -> strata_redis.Job:
    job = strata_redis.connect(url, "durability-cost", heartbeat_timeout=3600, durability=mode)
    return job


def handoffs(loops: int, url: str, mode: str) -> float:
    """``loops`` lease hand-offs (acquire + complete) on a fresh epoch of ``loops`` shards."""
    job = _job(url, mode)
    tag = f"{mode}-{next(_tags)}-{time.monotonic_ns()}"
    worker = f"w-{tag}"
    job.register_worker(worker, heartbeat_interval=None)
    params = ShardManager(job).register_dataset_params(f"ds-{tag}", loops, 1)
    leases = ShardLeases(job.context, params, 0, worker)
    leases.prepare()
    start = time.perf_counter()
    for _ in range(loops):
        lease = leases.acquire()
        assert lease is not None
        lease.complete()
    elapsed = time.perf_counter() - start
    job.close()
    return elapsed


def commits(loops: int, url: str, mode: str, root: str) -> float:
    """``loops`` checkpoint saves of 1 KiB by one rank, each waited for (its commit)."""
    job = _job(url, mode)
    tag = f"{mode}-{next(_tags)}-{time.monotonic_ns()}"
    worker = f"c-{tag}"
    job.register_worker(worker, heartbeat_interval=None)
    manager = strata_redis.CheckpointManager(
        f"{root}/{tag}", keep_count=2, redis=job, job_id=f"ckpt-{tag}", worker_id=worker
    )
    data = bytes(1024)
    start = time.perf_counter()
    for step in range(loops):
        manager.save(data, step=step + 1).result()
    elapsed = time.perf_counter() - start
    manager.close()
    job.close()
    return elapsed


def main() -> None:
    runner = pyperf.Runner(add_cmdline_args=_pass_args)
    parser = runner.argparser
    parser.add_argument("--solo-url", help=argparse.SUPPRESS)
    parser.add_argument("--pair-url", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = runner.parse_args()
    if args.solo_url is None:
        _deployments(args)
    urls = {"solo": args.solo_url, "pair": args.pair_url}
    results: dict[str, Any] = {}
    for label, where, mode in VARIANTS:
        name = f"lease hand-off, {label}"
        results[name] = runner.bench_time_func(name, handoffs, urls[where], mode)
    for label, where, mode in VARIANTS:
        name = f"checkpoint commit, {label}"
        results[name] = runner.bench_time_func(name, commits, urls[where], mode, args.dir)
    if args.worker or any(r is None for r in results.values()):
        return
    print("\nreplicated at 1 replica, as a ratio:")
    for op in ("lease hand-off", "checkpoint commit"):
        mean = {label: results[f"{op}, {label}"].mean() for label, _, _ in VARIANTS}
        durable = mean["replicated, 1 replica"]
        one, none = durable / mean["default, 1 replica"], durable / mean["default, 0 replicas"]
        print(f"  {op:18s} x{one:.2f} of the default at 1 replica, x{none:.2f} at 0")


if __name__ == "__main__":
    main()

"""Scaling curves: how each cost grows with the work, and whether it grows as it should.

    python perf/curves.py                 # every curve, full sizes (minutes)
    python perf/curves.py --smoke         # tiny sizes, seconds
    python perf/curves.py --only assignment-shards,lease-epoch

Each curve times one operation at growing sizes (median of repeats) and writes
``<results>/curves.json``, ``curves.md`` (a table per curve) and ``curve_<name>.png``
(log-log, with the ``matplotlib`` of the ``bench`` extra). The growth is read off the
measured log-log slope between the smallest and largest size: constant (< 0.25), sublinear
(< 0.75), linear (< 1.25) or superlinear; a curve growing faster than its natural growth
(``NATURAL``) is marked as a defect to fix.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

import strata_redis
from strata_redis.data import hashring
from strata_redis.data.sharding import DatasetParams, assignment
from strata_redis.server import RedisServer

HERE = Path(__file__).resolve().parent
MiB = 1024 * 1024
GROWTH = [(0.25, "constant"), (0.75, "sublinear"), (1.25, "linear"), (math.inf, "superlinear")]
#: the growth each curve should have at most, from what the operation must do
NATURAL = {
    "assignment-shards": "linear",  # every shard is placed
    "assignment-workers": "linear",  # the ring is built from every worker's points
    "lease-epoch": "constant",  # one hand-off touches a few entries of sorted sets and hashes
    "register-workers": "constant",
    "heartbeat-workers": "constant",
    "reap-workers": "constant",  # a range query from the oldest: nothing to declare failed
    "barrier-participants": "linear",  # N arrivals and N wake-ups per release
    "checkpoint-size": "linear",
}
SIZES = {
    "assignment-shards": [1_000, 10_000, 100_000, 1_000_000],
    "assignment-workers": [10, 100, 1_000, 10_000],
    "lease-epoch": [1_000, 10_000, 100_000, 1_000_000],
    "register-workers": [100, 1_000, 10_000, 100_000],
    "heartbeat-workers": [100, 1_000, 10_000, 100_000],
    "reap-workers": [100, 1_000, 10_000, 100_000],
    "barrier-participants": [10, 100, 1_000],
    "checkpoint-size": [1, 4, 16, 64, 256],
}
SMOKE = {
    "assignment-shards": [1_000, 10_000], "assignment-workers": [10, 100],
    "lease-epoch": [1_000, 10_000], "register-workers": [100, 1_000],
    "heartbeat-workers": [100, 1_000], "reap-workers": [100, 1_000],
    "barrier-participants": [10, 20], "checkpoint-size": [1, 2],
}  # fmt: skip
UNITS = {"checkpoint-size": "MiB"}


def median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # untimed: first-call costs (imports, script loads, page faults) are not the curve
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def assignment_shards(n: int, ctx: dict[str, Any]) -> float:
    workers = [f"w{i:04d}" for i in range(1000)]
    params = DatasetParams("curve", n * 10, 10, True, 1)

    def once() -> None:
        hashring._cached_ring.cache_clear()  # from scratch: the ring is built too
        assignment(params, workers)

    return median_time(once, ctx["repeats"])


def assignment_workers(n: int, ctx: dict[str, Any]) -> float:
    workers = [f"w{i:05d}" for i in range(n)]
    params = DatasetParams("curve", 100_000, 10, True, 1)

    def once() -> None:
        hashring._cached_ring.cache_clear()
        assignment(params, workers)

    return median_time(once, ctx["repeats"])


def lease_epoch(n: int, ctx: dict[str, Any]) -> float:
    job = _fresh_job(ctx, "curve-lease")
    strata_redis.ShardManager(job).register_dataset_params("ds", n * 10, 10, True, 1)
    job.register_worker("w", heartbeat_interval=None)
    leases = job.leases("ds", 0, "w", ttl=3600)
    leases.prepare()  # the pool is made before the clock starts
    steps = min(n, ctx["ops"])
    it = iter(leases)
    start = time.perf_counter()
    for _ in range(steps):
        next(it).complete()  # one round trip: records this shard, leases the next
    elapsed = time.perf_counter() - start
    it.close()  # type: ignore[attr-defined]
    return elapsed / steps


def _registered(ctx: dict[str, Any], n: int) -> strata_redis.Job:
    """A job with ``n`` registered workers, shared by the registry curves of that size."""
    cached = ctx.get("registry")
    if cached is not None and cached[0] == n:
        return cached[1]  # type: ignore[no-any-return]
    job = _fresh_job(ctx, "curve-registry")
    for i in range(n):  # 100,000 registrations take ~30 s: the cost of the biggest point
        job.register_worker(f"w{i:06d}", heartbeat_interval=None)
    ctx["registry"] = (n, job)
    return job


def register_workers(n: int, ctx: dict[str, Any]) -> float:
    job = _registered(ctx, n)
    count = iter(range(10**9))
    return median_time(
        lambda: job.register_worker(f"extra{next(count)}", heartbeat_interval=None),
        ctx["ops"],
    )


def heartbeat_workers(n: int, ctx: dict[str, Any]) -> float:
    job = _registered(ctx, n)
    worker = job.register_worker("beating", heartbeat_interval=None)
    return median_time(worker.heartbeat, ctx["ops"])


def reap_workers(n: int, ctx: dict[str, Any]) -> float:
    job = _registered(ctx, n)
    return median_time(job.reap, ctx["ops"])


def barrier_participants(n: int, ctx: dict[str, Any]) -> float:
    out = Path(ctx["tmp"]) / f"barrier-{n}.json"
    rounds = "3" if ctx["smoke"] else "50"
    subprocess.run(
        [sys.executable, str(HERE / "bench_barrier.py"), "--participants", str(n), "--modes",
         "strata", "--rounds", rounds, "--warmups", "2", "-o", str(out), "--redis-url",
         ctx["url"]],
        check=True, cwd=HERE, capture_output=True, timeout=600,
    )  # fmt: skip
    data = json.loads(out.read_text())
    values = [v for b in data["benchmarks"] for r in b["runs"] for v in r.get("values", [])]
    return statistics.median(values)


def checkpoint_size(mib: int, ctx: dict[str, Any]) -> float:
    data = os.urandom(mib * MiB)
    with tempfile.TemporaryDirectory(dir=ctx["tmp"]) as root:
        job = _fresh_job(ctx, "curve-ckpt")
        with strata_redis.CheckpointManager(root, keep_count=1, redis=job) as ckpt:
            steps = iter(range(10**9))
            return median_time(
                lambda: ckpt.save(data, step=next(steps)).result(timeout=600), ctx["repeats"]
            )


def _fresh_job(ctx: dict[str, Any], job_id: str) -> strata_redis.Job:
    ctx.pop("registry", None)
    redis.Redis.from_url(ctx["url"]).flushall()
    return strata_redis.connect(ctx["url"], job_id, heartbeat_timeout=3600)


CURVES: dict[str, Callable[[int, dict[str, Any]], float]] = {
    "assignment-shards": assignment_shards,
    "assignment-workers": assignment_workers,
    "lease-epoch": lease_epoch,
    "heartbeat-workers": heartbeat_workers,
    "reap-workers": reap_workers,
    "register-workers": register_workers,
    "barrier-participants": barrier_participants,
    "checkpoint-size": checkpoint_size,
}


def growth(sizes: list[int], seconds: list[float]) -> tuple[float, str]:
    """The log-log slope from the smallest to the largest size, and its name."""
    slope = math.log(seconds[-1] / seconds[0]) / math.log(sizes[-1] / sizes[0])
    return slope, next(name for limit, name in GROWTH if slope < limit)


def worse_than(measured: str, natural: str) -> bool:
    names = [name for _, name in GROWTH]
    return names.index(measured) > names.index(natural)


def plot(name: str, sizes: list[int], seconds: list[float], out: Path) -> None:
    import matplotlib  # the bench extra; only this function needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=100)
    ax.loglog(sizes, [s * 1e3 for s in seconds], marker="o")
    ax.set_xlabel(UNITS.get(name, "size"))
    ax.set_ylabel("ms (median)")
    ax.set_title(name)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help=f"comma-separated, of {','.join(CURVES)}")
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--redis-url", help="default: a private redis-server")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
    parser.add_argument("--no-plot", action="store_true", help="tables only (no matplotlib)")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(CURVES)
    unknown = set(names) - set(CURVES)
    if unknown:
        parser.error(f"unknown curves {sorted(unknown)}; choose from {', '.join(CURVES)}")
    args.results.mkdir(parents=True, exist_ok=True)
    server = None if args.redis_url else RedisServer().start()
    url = args.redis_url or server.url  # type: ignore[union-attr]
    sizes_of = SMOKE if args.smoke else SIZES
    if not args.smoke and "CHECKPOINT_SIZE_MB" in os.environ:
        top = int(os.environ["CHECKPOINT_SIZE_MB"])
        sizes_of["checkpoint-size"] = [s for s in SIZES["checkpoint-size"] if s < top] + [top]
    doc: dict[str, Any] = {}
    md = ["# Scaling curves", ""]
    try:
        with tempfile.TemporaryDirectory(prefix="strata-curves-") as tmp:
            ctx = {"url": url, "tmp": tmp, "smoke": args.smoke,
                   "repeats": 1 if args.smoke else 5, "ops": 20 if args.smoke else 200}  # fmt: skip
            for name in names:
                sizes = sizes_of[name]
                seconds = []
                for size in sizes:
                    seconds.append(CURVES[name](size, ctx))
                    print(f"{name} {size}: {seconds[-1] * 1e3:.3f} ms", flush=True)
                slope, grows = growth(sizes, seconds)
                defect = worse_than(grows, NATURAL[name])
                doc[name] = {"sizes": sizes, "seconds": seconds, "slope": slope, "growth": grows,
                             "natural": NATURAL[name], "defect": defect}  # fmt: skip
                md += [f"## {name}: {grows} (slope {slope:.2f}; natural: {NATURAL[name]})"
                       + (" — GROWS FASTER THAN IT SHOULD" if defect else ""), "",
                       f"| {UNITS.get(name, 'size')} | ms |", "|---|---|"]  # fmt: skip
                md += [f"| {s:,} | {t * 1e3:.3f} |" for s, t in zip(sizes, seconds, strict=True)]
                md.append("")
                if not args.no_plot:
                    plot(name, sizes, seconds, args.results / f"curve_{name}.png")
    finally:
        if server is not None:
            server.close()
    (args.results / "curves.json").write_text(json.dumps(doc, indent=2))
    (args.results / "curves.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())

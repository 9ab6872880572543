"""Scaling curves: how each cost grows with the work, and whether it grows as it should.

    python perf/curves.py                 # every curve, full sizes (minutes)
    python perf/curves.py --smoke         # tiny sizes, seconds
    python perf/curves.py --only assignment-shards,lease-epoch

Each curve times one operation at growing sizes (median of repeats) and writes
``<results>/curves.json``, ``curves.md`` (a table per curve) and ``curve_<name>.png``
(log-log, with the ``matplotlib`` of the ``bench`` extra; run by ``perf/run.py`` these land in
``perf/results/``). The growth is read off the log-log slope fitted by least squares over
every measured point (not the two end points): constant (< 0.25), sublinear (< 0.75), linear
(< 1.25) or superlinear; a curve growing faster than its natural growth (``NATURAL``) is
marked as a defect to fix. The table also gives each point's deviation from the fit.

The barrier curve runs the library's own ``Barrier.wait`` in N-1 threads of this process
(one job: its waiters share one blocked connection, ``coordination/waiters.py``, so 10,000
participants need no 10,000 connections) and times the last arrival's ``wait`` until the
last thread has woken; fewer rounds at the big sizes keep it to a few minutes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
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
    "barrier-participants": [10, 100, 1_000, 10_000],
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


#: timed barrier releases per size (after one untimed): fewer where a round takes seconds
BARRIER_ROUNDS = {10: 30, 100: 20, 1_000: 8, 10_000: 3}
#: stop repeating a size after this long (seconds), once 2 rounds are in
BARRIER_BUDGET_S = 90.0


class _Waiters:
    """``n - 1`` threads of this process, each a participant calling ``Barrier.wait`` once a
    round, all on one job (so their waits share the job's one blocked connection)."""

    def __init__(self, job: strata_redis.Job, name: str, ids: list[str], n: int) -> None:
        self.job, self.ids = job, ids
        self.lock = threading.Lock()
        self.rounds: dict[int, threading.Event] = {}
        self.woke = [0.0] * len(ids)
        self.done, self.all_done = 0, threading.Event()
        self.errors: list[str] = []
        self.stop = False
        old = threading.stack_size(256 * 1024)  # 10,000 threads: small stacks
        try:
            for i in range(len(ids)):
                barrier = job.barrier(name, expected=n, timeout=120.0)
                threading.Thread(target=self.run, args=(i, barrier), daemon=True).start()
        finally:
            threading.stack_size(old)

    def event(self, r: int) -> threading.Event:
        with self.lock:
            return self.rounds.setdefault(r, threading.Event())

    def run(self, i: int, barrier: Any) -> None:
        r = 0
        while True:
            self.event(r).wait()
            if self.stop:
                return
            try:
                barrier.wait(self.ids[i])
            except Exception as exc:  # reported by the round, which then fails
                self.errors.append(f"{self.ids[i]}: {exc!r}")
            self.woke[i] = time.perf_counter()
            with self.lock:
                self.done += 1
                if self.done == len(self.ids):
                    self.all_done.set()
            r += 1

    def arm(self, r: int) -> None:
        self.done = 0
        self.all_done.clear()
        self.event(r).set()

    def close(self, r: int) -> None:
        self.stop = True
        self.event(r).set()


def barrier_participants(n: int, ctx: dict[str, Any]) -> float:
    """Median release latency of an ``n``-participant barrier: the last arrival's ``wait``
    until the last of the other ``n - 1`` (threads here, one shared job) has woken."""
    job = _fresh_job(ctx, "curve-barrier")
    ids = [f"p{i:05d}" for i in range(n)]
    for worker_id in ids:  # 10,000 registrations: a few seconds, untimed
        job.register_worker(worker_id, heartbeat_interval=None)
    name = "curve"
    last = job.barrier(name, expected=n, timeout=120.0)
    arrived_key = job.keys.barrier_arrived(name)
    waiters = _Waiters(job, name, ids[:-1], n)
    rounds = 1 if ctx["smoke"] else BARRIER_ROUNDS.get(n, 3)
    times: list[float] = []
    began = time.monotonic()
    r = 0
    try:
        for r in range(rounds + 1):  # round 0 untimed: first-call costs are not the curve
            waiters.arm(r)
            deadline = time.monotonic() + 300
            while int(job.client.scard(arrived_key)) < n - 1:
                if time.monotonic() > deadline or waiters.errors:
                    raise RuntimeError(f"barrier x{n}: arrivals stalled {waiters.errors[:3]}")
                time.sleep(0.005)
            time.sleep(0.02)  # every waiter blocked, settled
            start = time.perf_counter()
            last.wait(ids[-1])
            if not waiters.all_done.wait(120) or waiters.errors:
                raise RuntimeError(f"barrier x{n}: waiters did not wake {waiters.errors[:3]}")
            if r:
                times.append(max(max(waiters.woke), start) - start)
            if r >= 2 and time.monotonic() - began > BARRIER_BUDGET_S:
                break
    finally:
        waiters.close(r + 1)
    return statistics.median(times)


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


def fit(sizes: list[int], seconds: list[float]) -> tuple[float, float]:
    """Least-squares line through every (log size, log seconds) point: (slope, intercept)."""
    xs, ys = [math.log(s) for s in sizes], [math.log(t) for t in seconds]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx


def growth(sizes: list[int], seconds: list[float]) -> tuple[float, str]:
    """The log-log slope fitted over every measured point, and its name."""
    slope, _ = fit(sizes, seconds)
    return slope, next(name for limit, name in GROWTH if slope < limit)


def worse_than(measured: str, natural: str) -> bool:
    names = [name for _, name in GROWTH]
    return names.index(measured) > names.index(natural)


def plot(name: str, sizes: list[int], seconds: list[float], out: Path) -> None:
    import matplotlib  # the bench extra; only this function needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=100)
    ax.loglog(sizes, [s * 1e3 for s in seconds], marker="o", label="measured (median)")
    slope, intercept = fit(sizes, seconds)
    ax.loglog(sizes, [math.exp(intercept) * s**slope * 1e3 for s in sizes], linestyle="--",
              label=f"least-squares fit, slope {slope:.2f}")  # fmt: skip
    ax.legend(fontsize=7)
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
                _, intercept = fit(sizes, seconds)
                fitted = [math.exp(intercept) * s**slope for s in sizes]
                ends = math.log(seconds[-1] / seconds[0]) / math.log(sizes[-1] / sizes[0])
                defect = worse_than(grows, NATURAL[name])
                doc[name] = {"sizes": sizes, "seconds": seconds, "slope": slope, "growth": grows,
                             "natural": NATURAL[name], "defect": defect,
                             "fit": "least squares on log-log, every point",
                             "end_points_slope": ends}  # fmt: skip
                md += [f"## {name}: {grows} (fitted slope {slope:.2f} over {len(sizes)} points; "
                       f"end points alone {ends:.2f}; natural: {NATURAL[name]})"
                       + (" — GROWS FASTER THAN IT SHOULD" if defect else ""), "",
                       f"| {UNITS.get(name, 'size')} | ms | fit, ms | off the fit |",
                       "|---|---|---|---|"]  # fmt: skip
                md += [f"| {s:,} | {t * 1e3:.3f} | {f * 1e3:.3f} | {t / f - 1:+.0%} |"
                       for s, t, f in zip(sizes, seconds, fitted, strict=True)]  # fmt: skip
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

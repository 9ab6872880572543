"""Shard assignment, 10,000 shards over 1,000 workers: from scratch and with the ring cached,
beside uhashring (a ketama ring: build over 1,000 nodes + 10,000 lookups).

Bars (DESIGN.md): < 5 ms from scratch, < 1 ms with the ring cached, busiest worker <= 1.25x
the mean, >= (1 - 1/N) - 2% of shards kept when one of N fails. Besides the timings, the
parent process prints balance (max/mean) and the fraction of shards moved by one failure and
by one join, for ours and for uhashring, and the time ratios side by side.

    python perf/bench_sharding.py --fast -o /tmp/shard.json

Pure (no Redis): ``--redis-url`` is accepted, for ``perf/run.py``, and ignored.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyperf  # type: ignore[import-untyped]
from uhashring import HashRing  # type: ignore[import-untyped]

from strata_redis.data import sharding

NUM_WORKERS = 1_000
NUM_SHARDS = 10_000
WORKERS = [f"worker-{i:04d}" for i in range(NUM_WORKERS)]
PARAMS = sharding.DatasetParams("bench", NUM_SHARDS * 128, 128, True, 42)
SHARD_KEYS = [f"bench:{i}" for i in range(NUM_SHARDS)]

#: (subject, reference) pairs whose mean ratio perf/run.py prints
RATIOS = [
    ("uhashring-build-1000-nodes", "assignment-from-scratch"),
    ("uhashring-10000-lookups", "assignment-ring-cached"),
]


TimeFunc = Callable[[int], float]


def timed(body: Callable[[], object], before: Callable[[], object] | None = None) -> TimeFunc:
    """A pyperf time function running ``body`` ``loops`` times (``before`` untimed, each loop)."""

    def run(loops: int) -> float:
        total = 0.0
        for _ in range(loops):
            if before is not None:
                before()
            start = time.perf_counter()
            body()
            total += time.perf_counter() - start
        return total

    return run


def ours(workers: Sequence[str]) -> list[str]:
    a = sharding.assignment(PARAMS, workers)
    return [a.workers[i] for i in a.owner.tolist()]


def uhashring(workers: Sequence[str]) -> list[str]:
    ring = HashRing(nodes=list(workers))
    return [ring.get_node(key) for key in SHARD_KEYS]


def figures(name: str, place: Callable[[Sequence[str]], list[str]], into: dict[str, float]) -> str:
    """Balance, and the fraction of shards moved by one failure and by one join (also put
    in ``into``, as percentages: ``<name>_moved_fail_pct``, ``<name>_moved_join_pct``)."""
    before = np.array(place(WORKERS), dtype=object)
    loads = Counter(before.tolist())
    balance = max(loads.values()) / (NUM_SHARDS / NUM_WORKERS)
    busiest = max(loads, key=lambda w: (loads[w], w))
    failed = np.array(place([w for w in WORKERS if w != busiest]), dtype=object)
    moved_fail = float(np.mean(failed != before))
    after_balance = max(Counter(failed.tolist()).values()) / (NUM_SHARDS / (NUM_WORKERS - 1))
    joined = np.array(place([*WORKERS, "worker-new"]), dtype=object)
    moved_join = float(np.mean(joined != before))
    into[f"{name}_moved_fail_pct"] = moved_fail * 100
    into[f"{name}_moved_join_pct"] = moved_join * 100
    into[f"{name}_balance"] = balance
    into["one_over_n_pct"] = 100 / NUM_WORKERS
    return (
        f"{name:10s} balance {balance:.2f}x mean ({after_balance:.2f}x after the failure); "
        f"busiest worker fails: {moved_fail:.2%} moved ({1 - moved_fail:.2%} kept, "
        f"bar >= {(1 - 1 / NUM_WORKERS) - 0.02:.2%}); one join: {moved_join:.2%} moved "
        f"(1/N = {1 / NUM_WORKERS:.2%})"
    )


def main() -> None:
    def pass_args(cmd: list[str], args: argparse.Namespace) -> None:
        if args.redis_url:
            cmd.extend(["--redis-url", args.redis_url])

    runner = pyperf.Runner(add_cmdline_args=pass_args)
    runner.argparser.add_argument("--redis-url", help="ignored: this benchmark needs no Redis")
    runner.metadata["description"] = __doc__.splitlines()[0] if __doc__ else ""
    args = runner.parse_args()
    built: list[HashRing] = []

    def build_uhashring() -> None:
        built[:] = [HashRing(nodes=WORKERS)]

    def ensure_uhashring() -> None:
        if not built:
            build_uhashring()

    def lookup_uhashring() -> None:
        ring = built[0]
        for key in SHARD_KEYS:
            ring.get_node(key)

    sharding.assignment(PARAMS, WORKERS)  # warm the membership cache
    results = {
        "scratch": runner.bench_time_func(
            "assignment-from-scratch",
            timed(lambda: sharding.assignment(PARAMS, WORKERS), before=sharding.clear_cache),
        ),
        "warm": runner.bench_time_func(
            "assignment-ring-cached", timed(lambda: sharding.assignment(PARAMS, WORKERS))
        ),
        "one_worker": runner.bench_time_func(
            "shards_for_worker-ring-cached",
            timed(lambda: sharding.shards_for_worker(PARAMS, WORKERS, "worker-0007", 3)),
        ),
        "dict": runner.bench_time_func(
            "assign-all-shard-objects-ring-cached",
            timed(lambda: sharding.assign(PARAMS, WORKERS, 3)),
        ),
        "uh_build": runner.bench_time_func("uhashring-build-1000-nodes", timed(build_uhashring)),
        "uh_lookup": runner.bench_time_func(
            "uhashring-10000-lookups", timed(lookup_uhashring, before=ensure_uhashring)
        ),
    }
    if args.worker:
        return

    print()
    summary: dict[str, float] = {}
    print(figures("ours", ours, summary))
    print(figures("uhashring", uhashring, summary))
    if args.output:  # beside the pyperf results: perf/report.py's "sharding" summary
        Path(args.output).with_name("sharding.json").write_text(json.dumps(summary, indent=2))
    means = {k: b.mean() for k, b in results.items() if b is not None}
    if len(means) == len(results):
        uh = means["uh_build"] + means["uh_lookup"]
        print(
            f"from scratch: ours {means['scratch'] * 1e3:.2f} ms (bar < 5 ms) vs uhashring "
            f"build + lookups {uh * 1e3:.1f} ms: {uh / means['scratch']:.0f}x faster"
        )
        print(
            f"ring cached: ours {means['warm'] * 1e3:.3f} ms (bar < 1 ms) vs uhashring lookups "
            f"alone {means['uh_lookup'] * 1e3:.1f} ms: {means['uh_lookup'] / means['warm']:.0f}x "
            "faster"
        )
        print(
            f"one worker's shards (ring cached): {means['one_worker'] * 1e3:.3f} ms; all "
            f"10,000 Shard objects (assign(), ring cached): {means['dict'] * 1e3:.2f} ms"
        )


if __name__ == "__main__":
    main()

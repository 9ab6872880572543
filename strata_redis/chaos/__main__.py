"""``python -m strata_redis.chaos``: fault runs over seeds, their violations and a summary."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from .run import CLIENTS, STORAGES, RunConfig, check_guards, run
from .schedule import KINDS, WORKLOADS, draw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m strata_redis.chaos",
        description="Play fault schedules drawn from seeds against real worker processes and a "
        "real Redis primary and replica, then check the whole history. Exit 1 on a violation.",
    )
    parser.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds from --seed on")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of faults a run")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument(
        "--workload", choices=[*WORKLOADS, "both", "all"], default="leases",
        help="leases: the raw lease API; loop: the README loop with checkpoints (and the "
        "recovery after a lost state); torch: PyTorch's guide loop (LeaseBatchSampler, "
        "strata_redis.torch.save/load; needs torch); both: each seed with leases and loop; "
        "all: each seed with each (default leases)",
    )  # fmt: skip
    parser.add_argument(
        "--clients", choices=CLIENTS, default=None,
        help="how the workers reach Redis: vip (a proxy a failover points at the new primary) "
        "or sentinel (a redis+sentinel:// URL); default drawn from each seed",
    )  # fmt: skip
    parser.add_argument(
        "--storage", choices=STORAGES, default=None,
        help="the loop's checkpoints: a local directory, or the S3 stand-in (moto's server, "
        "behind a proxy the storage faults cut and stall); default drawn from each seed (S3 "
        "when moto is installed and the schedule stalls storage)",
    )  # fmt: skip
    parser.add_argument("--faults", type=int, default=0, help="faults a run (0: one per 6 s)")
    parser.add_argument(
        "--kinds", default="", help=f"comma-separated fault kinds (default all: {', '.join(KINDS)})"
    )
    parser.add_argument(
        "--disable-guard", default="",
        help="test-only: switch guards off (history, fencing, anchors, commit) to see the checker "
        "fail",
    )  # fmt: skip
    parser.add_argument("--keep", type=Path, help="keep each run's history under this folder")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] or None
    workloads = {"both": ["leases", "loop"], "all": list(WORKLOADS)}.get(
        args.workload, [args.workload]
    )
    try:  # a misspelt kind or guard is a usage error (exit 2), not a run's violation (1)
        for workload in workloads:
            draw(0, args.duration, args.workers, kinds, args.faults, workload)
        check_guards(args.disable_guard)
    except ValueError as exc:
        parser.error(str(exc))
    total: Counter[str] = Counter()
    violations = operations = 0
    runs = 0
    for seed in range(args.seed, args.seed + args.seeds):
        for workload in workloads:
            cfg = RunConfig(
                seed=seed, duration=args.duration, workers=args.workers, kinds=kinds,
                faults=args.faults, disable=args.disable_guard, workload=workload,
                clients=args.clients, storage=args.storage,
                keep=args.keep / f"seed-{seed}-{workload}" if args.keep else None,
            )  # fmt: skip
            outcome = run(cfg, progress=True)
            for line in outcome.lines():
                print(line, flush=True)
            total.update(outcome.played)
            violations += len(outcome.report.violations)
            operations += outcome.report.operations
            runs += 1
    kinds_line = ", ".join(f"{k} {n}" for k, n in sorted(total.items())) or "none"
    print(
        f"summary: {args.seeds} seeds, {runs} runs; faults injected: {kinds_line}; "
        f"operations checked {operations}; violations {violations}"
    )
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())

"""Run every pyperf benchmark in perf/, print the side-by-side ratios, compare to a baseline.

    python perf/run.py                    # full run; results in perf/results/ (a scratch
                                          # folder git ignores: no run rewrites a tracked file)
    python perf/run.py --fast             # fewer values (pyperf --fast)
    python perf/run.py --smoke            # one value each: proves every benchmark still runs
    python perf/run.py --save-baseline    # then copy the results to perf/baseline/: the
                                          # pyperf suites and the summaries (load, cost,
                                          # sharding, limits, heartbeat, epochs, curves)
                                          # and the curves' table and charts; the report
                                          # goes into the docs (report.DOCS_REPORT)
    python perf/run.py --compare perf/baseline --fail-on regression
    python perf/run.py bench_heartbeat    # only some benchmarks
    python perf/run.py bench_dashboard    # GET /api/dashboard at 10, 100, 1,000 workers
    python perf/run.py bench_torch        # strata_redis.torch beside DistributedSampler, torch.save
    python perf/run.py capacity           # only perf/capacity.py: Redis CPU per heartbeat,
                                          # lease hand-off, barrier arrival, checkpoint ack
                                          # (INFO commandstats; runs in every full run, and
                                          # with --no-load: ~1.5 min); --save-baseline keeps
                                          # its summary, capacity.json
    python perf/run.py --node-loss        # also perf/node_loss.py --repeat 1: torchrun node
                                          # loss under strata and c10d, both victims
                                          # (~3 min; not part of the default run)

perf/bench_shards.py (shards in storage beside litdata, MosaicML streaming, webdataset) is
not a pyperf suite and is not run here: ``python -m perf.bench_shards --full``.

Each benchmark module may define ``RATIOS``: (name, reference name) pairs whose mean ratio
is printed after the run; ratios are measured in one run, side by side, on one machine.
The run ends with the targets table (``perf/targets.toml``, filled by ``perf/report.py``),
also written to ``<results>/report.md`` and ``report.json``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyperf
import report

from strata_redis.server import RedisServer

HERE = Path(__file__).resolve().parent
#: bench_* modules that need an optional extra: skipped (said so) when it is not installed
NEEDS = {"bench_torch": "torch"}
#: summary scripts run by name like a benchmark (and in every run that names none), each on a
#: private redis-server of its own (they read and reset its INFO): perf/<name>.py --results
STANDALONE = ("capacity",)
#: bench_* modules that are not pyperf suites and run on their own (``python -m perf.<name>``):
#: bench_shards measures torch DataLoaders beside peers that need installs of their own
ON_THEIR_OWN = ("bench_shards",)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmarks", nargs="*", help="bench_* module names (default: all)")
    parser.add_argument("--fast", action="store_true", help="pyperf --fast")
    parser.add_argument("--smoke", action="store_true", help="one value per benchmark")
    parser.add_argument("--save-baseline", action="store_true")
    parser.add_argument("--compare", type=Path, help="a baseline folder (default perf/baseline)")
    parser.add_argument(
        "--fail-on", choices=["critical", "degraded", "regression"], help="exit 1 when a row is"
    )
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--redis-url", help="default: a private redis-server")
    parser.add_argument(
        "--no-load",
        action="store_true",
        help="skip load.py, cost.py, curves.py, limits.py, epochs.py",
    )
    parser.add_argument(
        "--node-loss",
        action="store_true",
        help="also perf/node_loss.py --repeat 1 (torchrun, strata beside c10d; needs torch)",
    )
    args = parser.parse_args()

    names = args.benchmarks or sorted(p.stem for p in HERE.glob("bench_*.py"))
    standalone = [n for n in STANDALONE if not args.benchmarks or n in args.benchmarks]
    names = [n for n in names if n not in STANDALONE and n not in ON_THEIR_OWN]
    args.results.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE))
    server = None
    if args.redis_url is None:
        server = RedisServer().start()
        args.redis_url = server.url
    failed = []
    began = time.time()
    try:
        for name in names:
            out = args.results / f"{name}.json"
            out.unlink(missing_ok=True)
            need = NEEDS.get(name)
            if need and importlib.util.find_spec(need) is None:
                print(f"== {name}: skipped, no {need} (scripts/setup.sh --{need})", flush=True)
                continue
            cmd = [
                sys.executable,
                str(HERE / f"{name}.py"),
                "--quiet",
                "-o",
                str(out),
                "--redis-url",
                args.redis_url,
            ]
            if args.smoke:
                cmd.append("--debug-single-value")
            elif args.fast:
                cmd.append("--fast")
            print(f"== {name}", flush=True)
            if subprocess.run(cmd, cwd=HERE).returncode != 0:
                failed.append(name)
                continue
            if not args.smoke:
                print_ratios(name, out)
            baseline = (args.compare or HERE / "baseline") / f"{name}.json"
            if baseline.exists() and not args.smoke:
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "pyperf",
                        "compare_to",
                        str(baseline),
                        str(out),
                        "--table",
                    ],
                    check=False,
                )
            if args.save_baseline and not args.smoke:
                (HERE / "baseline").mkdir(exist_ok=True)
                shutil.copy(out, HERE / "baseline" / out.name)
        for script in standalone:
            print(f"== {script} (perf/{script}.py)", flush=True)
            cmd = [sys.executable, str(HERE / f"{script}.py"), "--results", str(args.results)]
            cmd += ["--smoke"] if args.smoke else []
            if subprocess.run(cmd, cwd=HERE).returncode != 0:
                failed.append(script)
        if not args.no_load:
            # load scenarios; per-worker cost and recovery; scaling curves; limits; epochs
            for script in ("load", "cost", "curves", "limits", "epochs"):
                print(f"== {script} (perf/{script}.py)", flush=True)
                cmd = [sys.executable, str(HERE / f"{script}.py"), "--results",
                       str(args.results), "--redis-url", args.redis_url]  # fmt: skip
                cmd += ["--smoke"] if args.smoke else []
                if subprocess.run(cmd, cwd=HERE).returncode != 0:
                    failed.append(script)
        if args.node_loss and not args.smoke:
            if importlib.util.find_spec("torch") is None:
                print("== node_loss: skipped, no torch (scripts/setup.sh --torch)", flush=True)
            else:
                print("== node_loss (perf/node_loss.py --repeat 1)", flush=True)
                cmd = [sys.executable, str(HERE / "node_loss.py"), "--repeat", "1",
                       "--results", str(args.results), "--redis-url", args.redis_url]  # fmt: skip
                if subprocess.run(cmd, cwd=HERE).returncode != 0:
                    failed.append("node_loss")
    finally:
        if server is not None:
            server.close()
    if args.save_baseline and not args.smoke:
        save_summaries(args.results, HERE / "baseline", since=began)
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    compare = args.compare or (HERE / "baseline")
    # (a run that just saved the baseline would only be compared with itself)
    use = compare if compare.is_dir() and not args.smoke and not args.save_baseline else None
    # the baseline's report is the one the docs show (docs/design/benchmarks.md includes it)
    docs = report.DOCS_REPORT if args.save_baseline and not args.smoke else None
    return report.report(
        args.results, use, args.fail_on, docs=docs, source="python perf/run.py --save-baseline"
    )


#: what the baseline keeps of a run besides the summaries: the curves' table and charts
CURVE_FILES = ("curves.md", "curve_*.png")


def save_summaries(results: Path, baseline: Path, since: float = 0.0) -> None:
    """Copy the run's summaries (``report.BASELINE_SUMMARIES``) into the baseline folder, so
    that ``--compare`` checks the load, cost, sharding, limits, heartbeat and curve rows too,
    with the curves' table and charts (``CURVE_FILES``). Only files written since ``since``
    (this run's): a stale summary is never saved."""
    baseline.mkdir(exist_ok=True)
    saved = []
    for pattern in (*report.BASELINE_SUMMARIES, *CURVE_FILES):
        for path in sorted(results.glob(pattern)):
            if path.stat().st_mtime < since:
                continue
            shutil.copy(path, baseline / path.name)
            saved.append(path.name)
    print(f"baseline: summaries saved to {baseline}: {', '.join(saved) or 'none'}", flush=True)


def print_ratios(name: str, path: Path) -> None:
    """Print mean(name) / mean(reference) for the module's RATIOS pairs."""
    ratios = getattr(importlib.import_module(name), "RATIOS", [])
    suite = pyperf.BenchmarkSuite.load(str(path))
    means = {b.get_name(): b.mean() for b in suite.get_benchmarks()}
    for subject, reference in ratios:
        if subject in means and reference in means:
            print(
                f"   {subject} / {reference} = {means[subject] / means[reference]:.2f}x "
                f"({means[subject] * 1e6:.0f} us vs {means[reference] * 1e6:.0f} us)"
            )


if __name__ == "__main__":
    sys.exit(main())

"""The report: the targets table filled from a run's pyperf results, and regressions against a
baseline. Used by ``perf/run.py``; also ``python perf/report.py RESULTS [--compare BASELINE]``.

Every report goes to ``<results>/report.md`` and ``report.json`` (a scratch folder). The
baseline run's report also goes into the docs: ``perf/run.py --save-baseline`` (or
``--docs``) writes it to ``DOCS_REPORT``, which ``docs/design/benchmarks.md`` includes; no
other run touches a tracked file.

A row's status: ``target`` / ``acceptable`` / ``degraded`` (past acceptable, within critical) /
``critical`` / ``not measured``; with a reference, the ratio to it is shown and checked
against our goal. A regression is a change past ``THRESHOLD`` (the guide's 10 %) in a row's
ratio to its reference where it has one (absolute times move with the machine), else in its
own value.
For pyperf rows (many values per run) the change must also be significant (Welch's t over
the two runs' values). Summary rows (load scenarios, cost, sharding, limits, the heartbeat's
per-call percentiles) and the scaling curves hold one value per run: no significance test
is possible, the 10 % rule alone decides, and the report says so. A row may name pyperf
benchmarks for its regression check (``compare_bench``/``compare_name``/``compare_reference``)
when its table figure comes from a summary: the heartbeat's per-call percentiles are shown,
the pyperf means (many values, a t-test) are compared.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

import pyperf

HERE = Path(__file__).resolve().parent
THRESHOLD = 0.10
#: |t| above this counts as significant (about 95 % for the sample sizes pyperf takes)
T_SIGNIFICANT = 2.0
#: summary files (a field per row, not pyperf suites; besides load_<scenario>) -> the perf/
#: script that writes them
SUMMARIES = {"cost": "cost", "sharding": "bench_sharding", "limits": "limits",
             "heartbeat": "bench_heartbeat", "epochs": "epochs",
             "capacity": "capacity"}  # fmt: skip
#: summary files a baseline keeps besides the bench_*.json suites (``--save-baseline``)
BASELINE_SUMMARIES = ("load_*.json", *(f"{s}.json" for s in SUMMARIES), "curves.json")
#: the docs' copy of the baseline run's report: an include of docs/design/benchmarks.md
DOCS_REPORT = HERE.parent / "docs" / "_generated" / "baseline-report.md"
STATUSES = ("target", "acceptable", "degraded", "critical", "not measured")
UNITS = {"p50": "ms", "p95": "ms", "p99": "ms", "p999": "ms", "mean": "ms", "mb_s": "MB/s",
         "gb_s": "GB/s", "rate": "req/s", "mb": "MB", "percent": "%", "seconds": "s",
         "fraction": "x", "count": "calls", "ms": "ms", "workers": "workers",
         "bytes": "B", "us": "us", "per_s": "/s"}  # fmt: skip


@dataclass
class Row:
    """One metric of the targets table, and what a run measured for it."""

    metric: str
    stat: str
    better: str
    target: float
    acceptable: float
    critical: float
    bench: str | None = None
    name: str | None = None
    reference: str | None = None
    ref_name: str | None = None
    goal: float | None = None
    compare_bench: str | None = None
    compare_name: str | None = None
    compare_reference: str | None = None
    measured: float | None = None
    unit: str = ""
    ratio: float | None = None
    status: str = "not measured"
    goal_met: bool | None = None
    notes: list[str] = field(default_factory=list)


def load_targets(path: Path = HERE / "targets.toml") -> list[Row]:
    """The rows of a targets file.

    Raises:
        ValueError: a row misses a field or has a bad one (named in the message).
    """
    rows = []
    for i, raw in enumerate(tomllib.loads(path.read_text())["row"]):
        try:
            row = Row(**raw)
        except TypeError as exc:
            raise ValueError(f"{path} row {i + 1}: {exc}") from None
        if row.better not in ("lower", "higher"):
            raise ValueError(f"{path} row {i + 1}: better must be lower or higher")
        ordered = [row.target, row.acceptable, row.critical]
        if ordered != sorted(ordered, reverse=row.better == "higher"):
            raise ValueError(f"{path} row {i + 1}: target, acceptable, critical out of order")
        rows.append(row)
    return rows


def load_results(results: Path) -> dict[tuple[str, str], pyperf.Benchmark]:
    """Every benchmark in a results folder, by (result file stem, benchmark name)."""
    out = {}
    for path in sorted(results.glob("bench_*.json")):
        for bench in pyperf.BenchmarkSuite.load(str(path)).get_benchmarks():
            out[(path.stem, bench.get_name())] = bench
    return out


def load_scenarios(results: Path) -> dict[str, dict[str, Any]]:
    """The summaries of ``perf/load.py`` (``load_peak``, ...), ``perf/cost.py`` (``cost``),
    ``perf/bench_sharding.py`` (``sharding``: shards moved by one failure or join) and
    ``perf/limits.py`` (``limits``: the longest command, heartbeats of a busy process)."""
    paths = [*sorted(results.glob("load_*.json")), *(results / f"{s}.json" for s in SUMMARIES)]
    return {p.stem: json.loads(p.read_text()) for p in paths if p.exists()}


def value(bench: pyperf.Benchmark, stat: str) -> float:
    """A benchmark's figure in the row's unit (ms for times; MB/s or GB/s for rates)."""
    values = bench.get_values()
    if stat in ("p50", "p99"):
        return _percentile(values, 50 if stat == "p50" else 99) * 1e3
    if stat == "mean":
        return statistics.fmean(values) * 1e3
    if stat == "seconds":
        return statistics.fmean(values)
    size = _size_bytes(bench)
    rate = size / statistics.fmean(values)
    return rate / 1e6 if stat == "mb_s" else rate / 1e9


def evaluate(
    rows: list[Row],
    results: dict[tuple[str, str], pyperf.Benchmark],
    scenarios: dict[str, dict[str, Any]] | None = None,
) -> list[Row]:
    """Fill each row's measured value, ratio to its reference and status."""
    for row in rows:
        row.unit = UNITS.get(row.stat, row.stat)
        if _is_summary(row):
            _evaluate_scenario(row, scenarios or {})
            continue
        bench = results.get((row.bench or "", row.name or ""))
        if bench is None:
            if row.bench:
                row.notes.append(f"no result for {row.bench}: {row.name!r}")
            continue
        row.measured = value(bench, row.stat)
        row.status = status(row, row.measured)
        ref = results.get((row.bench or "", row.reference or ""))
        if ref is not None:
            row.ratio = _mean(bench) / _mean(ref)
            row.goal_met = row.goal is None or row.ratio <= row.goal
    return rows


def _evaluate_scenario(row: Row, scenarios: dict[str, dict[str, Any]]) -> None:
    """A row filled from a load scenario's summary: ``name`` is the summary's field."""
    found = scenarios.get(row.bench or "", {}).get(row.name or "")
    if found is None:
        row.notes.append(f"no {row.name} in {row.bench}")
        return
    row.measured = float(found)
    row.status = status(row, row.measured)
    ref = scenarios.get(row.reference or "", {}).get(row.ref_name or row.name or "")
    if ref:
        # as a time ratio, like every other row: <= goal passes
        row.ratio = ref / row.measured if row.better == "higher" else row.measured / ref
        row.goal_met = row.goal is None or row.ratio <= row.goal


def status(row: Row, measured: float) -> str:
    """Where ``measured`` falls among the row's thresholds."""
    within = (lambda v, t: v <= t) if row.better == "lower" else (lambda v, t: v >= t)
    for name, threshold in (
        ("target", row.target), ("acceptable", row.acceptable), ("degraded", row.critical)
    ):  # fmt: skip
        if within(measured, threshold):
            return name
    return "critical"


@dataclass
class Change:
    """A benchmark (or a row's ratio) that moved between a baseline and a run."""

    what: str
    before: float
    after: float
    change: float  # relative: +0.20 is 20 % worse (a higher time or ratio, a lower rate)
    t: float | None  # None: one value per run, no significance test (the 10 % rule alone)
    regression: bool
    improvement: bool


def compare(
    rows: list[Row],
    baseline: dict[tuple[str, str], pyperf.Benchmark],
    results: dict[tuple[str, str], pyperf.Benchmark],
    threshold: float = THRESHOLD,
    base_summaries: dict[str, dict[str, Any]] | None = None,
    summaries: dict[str, dict[str, Any]] | None = None,
) -> list[Change]:
    """Each row's change from ``baseline`` to ``results`` (its ratio where it has a reference).

    pyperf rows (and rows naming ``compare_*`` pyperf benchmarks): values are times (or time
    ratios), higher is worse; the change must be significant too. Summary rows (given
    ``base_summaries`` and ``summaries``): one value per run, the row's ``better`` says
    which way is worse, the 10 % rule alone decides (``t`` is None).
    """
    changes = []
    for row in rows:
        if row.compare_name:
            bench, name, reference = row.compare_bench, row.compare_name, row.compare_reference
        elif _is_summary(row):
            if base_summaries is not None and summaries is not None:
                found = _summary_change(row, base_summaries, summaries, threshold)
                changes += [found] if found is not None else []
            continue
        else:
            bench, name, reference = row.bench, row.name, row.reference
        key = (bench or "", name or "")
        if key not in baseline or key not in results:
            continue
        ref = (bench or "", reference or "")
        if reference and ref in baseline and ref in results:
            before = _ratio_values(baseline[key], baseline[ref])
            after = _ratio_values(results[key], results[ref])
            what = f"{row.metric} (ratio to {reference})"
        else:
            before, after = baseline[key].get_values(), results[key].get_values()
            what = row.metric if not row.compare_name else f"{row.metric} ({name}, mean)"
        changes.append(_change(what, list(before), list(after), threshold))
    return changes


def _is_summary(row: Row) -> bool:
    return row.bench in SUMMARIES or (row.bench or "").startswith("load_")


def _summary_value(row: Row, docs: dict[str, dict[str, Any]]) -> tuple[float, str] | None:
    """A summary row's figure for the regression check: its ratio to the reference where it
    has one (a time ratio: higher is worse), else its value; and what it is."""
    found = docs.get(row.bench or "", {}).get(row.name or "")
    if found is None:
        return None
    ref = docs.get(row.reference or "", {}).get(row.ref_name or row.name or "")
    if row.reference and ref:
        ratio = ref / found if row.better == "higher" else found / ref
        return ratio, f"{row.metric} (ratio to {row.reference} {row.ref_name or row.name})"
    return float(found), row.metric


def _summary_change(
    row: Row,
    base: dict[str, dict[str, Any]],
    now: dict[str, dict[str, Any]],
    threshold: float,
) -> Change | None:
    """A summary row's change: one value each side, so the 10 % rule alone (``t`` None)."""
    before, after = _summary_value(row, base), _summary_value(row, now)
    if before is None or after is None or before[1] != after[1]:
        return None  # not in both, or a reference in one only: nothing like for like
    (b, what), (a, _) = before, after
    # a ratio is a time ratio (higher is worse); a bare value goes the row's way
    worse_up = row.better == "lower" or what != row.metric
    if b == a:
        change = 0.0
    elif b == 0 or a == 0:
        # from or to zero (errors, failed workers): no relative change; the direction counts
        change = math.inf if (a > b) == worse_up else -1.0
    else:
        change = a / b - 1 if worse_up else b / a - 1
    return Change(what, b, a, change, None,
                  regression=change > threshold, improvement=change < -threshold)  # fmt: skip


def compare_curves(
    base: dict[str, Any], now: dict[str, Any], threshold: float = THRESHOLD
) -> list[Change]:
    """Each scaling curve's growth over its measured range: the fitted time at the largest
    size over the fitted time at the smallest (a ratio within one run, so the machine
    cancels), from the least-squares log-log slope. One value per run: the 10 % rule."""
    changes = []
    for name, curve in now.items():
        old = base.get(name)
        if not old or old.get("sizes") != curve.get("sizes") or "slope" not in old:
            continue  # other sizes (a smoke run, a changed curve): not like for like
        span = curve["sizes"][-1] / curve["sizes"][0]
        b, a = span ** old["slope"], span ** curve["slope"]
        change = a / b - 1
        what = (f"curve {name}: growth {curve['sizes'][0]:,} -> {curve['sizes'][-1]:,} "
                "(fitted time ratio)")  # fmt: skip
        changes.append(Change(what, b, a, change, None, regression=change > threshold,
                              improvement=change < -threshold))  # fmt: skip
    return changes


def load_curves(folder: Path) -> dict[str, Any]:
    """``curves.json`` of a results or baseline folder ({} if none)."""
    path = folder / "curves.json"
    return json.loads(path.read_text()) if path.exists() else {}


def machine() -> dict[str, Any]:
    """The machine a run came from: CPU, cores, load average, Python, Redis."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = re.findall(r"model name\s*:\s*(.+)", f.read())
        cpu = names[0] if names else cpu
    except OSError:
        pass
    try:
        redis_v = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, timeout=10
        ).stdout.split()[2]
    except (OSError, IndexError, subprocess.SubprocessError):
        redis_v = "unknown"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "redis": redis_v.removeprefix("v="),
        "platform": platform.platform(),
    }


def render(rows: list[Row], host: dict[str, Any], changes: list[Change] | None = None) -> str:
    """The report as Markdown: the machine, the table, then regressions and improvements."""
    lines = [
        "# strata_redis performance report",
        "",
        f"Machine: {host['cpu']}, {host['cores']} cores, load average "
        f"{' / '.join(map(str, host['load_average']))}, Python {host['python']}, "
        f"Redis {host['redis']}.",
        "",
        "| metric | measured | target / acceptable / critical | status | ratio to reference "
        "(goal) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        measured = "-" if r.measured is None else f"{r.measured:.3g} {r.unit}"
        sign = "<" if r.better == "lower" else ">"
        bars = f"{sign} {r.target:g} / {r.acceptable:g} / {r.critical:g} {r.unit}"
        ratio = "-"
        if r.ratio is not None:
            mark = "met" if r.goal_met else "MISSED"
            goal = "" if r.goal is None else f" (<= {r.goal:g}x: {mark})"
            ratio = f"{r.ratio:.2f}x {r.ref_name or r.reference}{goal}"
        lines.append(f"| {r.metric} | {measured} | {bars} | {r.status} | {ratio} |")
    if changes is not None:
        lines += ["", "## Against the baseline", ""]
        moved = [c for c in changes if c.regression or c.improvement]
        for c in moved:
            kind = "REGRESSION" if c.regression else "improvement"
            how = "one value each: 10 % rule, no t-test" if c.t is None else f"t={c.t:.1f}"
            moved_by = f"{c.before:.4g} -> {c.after:.4g} ({c.change:+.1%}, {how})"
            lines.append(f"- {kind}: {c.what}: {moved_by}")
        if not moved:
            lines.append(f"No change past {THRESHOLD:.0%} (significant, where testable).")
        single = sum(c.t is None for c in changes)
        lines += ["", f"{len(changes)} rows and curves compared. pyperf rows: past "
                  f"{THRESHOLD:.0%} and significant (Welch's t >= {T_SIGNIFICANT:g}). Summary "
                  f"rows and curves ({single} here) have one value per run: no significance "
                  f"test is possible, the {THRESHOLD:.0%} rule alone decides, so expect "
                  "noise to show up there first."]  # fmt: skip
    return "\n".join(lines) + "\n"


def write(
    results: Path, rows: list[Row], host: dict[str, Any], changes: list[Change] | None
) -> str:
    """Write report.md and report.json into ``results``; return the Markdown."""
    text = render(rows, host, changes)
    (results / "report.md").write_text(text)
    doc = {
        "machine": host,
        "rows": [asdict(r) for r in rows],
        "changes": None if changes is None else [asdict(c) for c in changes],
    }
    (results / "report.json").write_text(json.dumps(doc, indent=2))
    return text


def write_docs(text: str, path: Path = DOCS_REPORT, source: str = "perf/report.py") -> None:
    """Write a report into the docs as an include: the machine line and the table (the
    page has its own title), under a comment naming what wrote it."""
    body = text.split("\n", 2)[2] if text.startswith("# ") else text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<!-- written by {source}: do not edit, run it again -->\n\n{body}")


def _mean(bench: pyperf.Benchmark) -> float:
    return statistics.fmean(bench.get_values())


def _ratio_values(subject: pyperf.Benchmark, reference: pyperf.Benchmark) -> list[float]:
    # each subject value over the reference's mean: the ratio's spread is the subject's
    ref = _mean(reference)
    return [v / ref for v in subject.get_values()]


def _change(what: str, before: list[float], after: list[float], threshold: float) -> Change:
    b, a = statistics.fmean(before), statistics.fmean(after)
    change = a / b - 1
    t = _welch_t(before, after)
    significant = abs(t) >= T_SIGNIFICANT
    return Change(
        what, b, a, change, t,
        regression=significant and change > threshold,
        improvement=significant and change < -threshold,
    )  # fmt: skip


def _welch_t(x: list[float], y: list[float]) -> float:
    """Welch's t of mean(y) - mean(x); with single values, the change itself is the evidence."""
    if len(x) < 2 or len(y) < 2:
        return math.inf if statistics.fmean(y) != statistics.fmean(x) else 0.0
    vx, vy = statistics.variance(x) / len(x), statistics.variance(y) / len(y)
    diff = statistics.fmean(y) - statistics.fmean(x)
    if vx + vy == 0:
        return math.inf if diff else 0.0
    return diff / math.sqrt(vx + vy)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _size_bytes(bench: pyperf.Benchmark) -> int:
    description = str(bench.get_metadata().get("description", ""))
    match = re.search(r"(\d+)\s*MiB", description)
    if not match:
        raise ValueError(f"{bench.get_name()}: no size ('N MiB') in its description metadata")
    return int(match.group(1)) * 1024 * 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="?", default=HERE / "results")
    parser.add_argument("--compare", type=Path, help="a baseline folder of pyperf results")
    parser.add_argument("--fail-on", choices=["critical", "degraded", "regression"])
    parser.add_argument(
        "--docs",
        action="store_true",
        help=f"also write the report into the docs ({DOCS_REPORT.relative_to(HERE.parent)})",
    )
    args = parser.parse_args(argv)
    docs = DOCS_REPORT if args.docs else None
    return report(args.results, args.compare, args.fail_on, docs=docs)


def report(
    results: Path,
    baseline: Path | None = None,
    fail_on: str | None = None,
    docs: Path | None = None,
    source: str = "python perf/report.py --docs",
) -> int:
    """Print and write the report (also into ``docs``, an include of the docs' benchmarks
    page, when given); the exit status ``fail_on`` asks for."""
    found = load_results(results)
    summaries = load_scenarios(results)
    rows = evaluate(load_targets(), found, summaries)
    changes = None
    if baseline is not None:
        changes = compare(
            rows,
            load_results(baseline),
            found,
            base_summaries=load_scenarios(baseline),
            summaries=summaries,
        )
        changes += compare_curves(load_curves(baseline), load_curves(results))  # fmt: skip
    text = write(results, rows, machine(), changes)
    print(text)
    if docs is not None:
        write_docs(text, docs, source)
    bad = {"critical": {"critical"}, "degraded": {"critical", "degraded"}}.get(fail_on or "", set())
    if any(r.status in bad for r in rows):
        return 1
    if fail_on == "regression" and changes and any(c.regression for c in changes):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

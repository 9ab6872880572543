"""Shards in storage, read side by side: the raw floor, strata's ``ShardDataset``, litdata,
MosaicML streaming and webdataset, over the same samples, the same stores, in one run
(issue 37, item 6).

    python -m perf.bench_shards --full    # 200,000 samples of 2 KB in 200 shards; a torch
                                          # DataLoader at num_workers 0, 2, 4; local disk
                                          # and the S3 stand-in (moto's server on loopback)
    python -m perf.bench_shards           # the smoke form: 2,000 samples, 10 shards,
                                          # num_workers 0 and 2, local only (tests run it)
    python -m perf.bench_shards --samples 50000 --workers 0,2 --stores local --readers floor,strata

The corpus is written once per store (``perf/shards_peers.py``): webdataset ``.tar`` shards
under strata's layout (``{dataset}/shards/shard-NNNNNN.tar``), read in place by the raw
floor, strata and webdataset; the same samples as MDS shards (MosaicML) and as litdata's
``optimize()`` chunks, one shard or chunk per 1,000 samples as the tars. Each sample is
2,048 bytes (its id, then payload); every reader yields it as ``bytes`` and batches of 256
are collated as a ``list`` (``collate_fn=list``): the same bytes cross between processes.

Rows (``<results>/shards.json`` and ``shards.md``; printed):

- **throughput**: samples/s over one epoch through a torch ``DataLoader`` (litdata's own
  ``StreamingDataLoader``, strata's ``strata_redis.torch.DataLoader``: both are torch
  ``DataLoader`` subclasses), from the loader's first ``iter`` to its last batch, each row in a
  fresh process (litdata's obstore runtime and MosaicML's shared memory are per process),
  caches empty (litdata's and MosaicML's local caches in a fresh directory; the smoke form
  runs every row in one process, ``--in-process``, to be quick); every row's
  sample count is checked (``--check-ids``: each id once, on in the smoke form); and ``x
  floor``: over the raw floor at the same store and ``num_workers``. The raw floor reads each
  shard whole (one read, or one GET) in the DataLoader worker that owns it (``worker_id``
  modulo ``num_workers``), finds the members by their tar headers and yields them: no
  coordination, no shuffle, no cache. Peak memory (the process and its DataLoader workers,
  summed, each as its PSS, sampled every 50 ms) over what it was before the loader was made, is
  beside each: measured in rows of its own (``memory``, one per reader and setting after
  the timed ones), since the sampling thread takes CPU and the GIL from the process it
  measures (5 processes' PSS every 50 ms at ``num_workers=4``: ~15 ms of each 50) and slowed
  a reader with threads of its own more than one without.
- **resume to the first batch**: seconds from building the loader at a position (from each
  tool's own resume state) to its first batch, at ``num_workers=0``, at 10 and at 10^6
  batches done. A position past the end of an epoch is epoch ``done // samples`` and the
  sample ``done % samples`` in it (with 200,000 samples, 10^6 batches of 256 is the start of
  epoch 1,280). litdata: its ``StreamingDataLoader.state_dict()`` moved to that position;
  MosaicML: ``StreamingDataset.load_state_dict`` with ``epoch`` and ``sample_in_epoch``;
  strata: a job moved to the epoch (``advance_epoch``), trained to the sample (whole
  batches) and checkpointed, then a new orchestrator resumes from that checkpoint (timed
  from building the orchestrator);
  the raw floor: a ranged read from the member's offset; webdataset has no resume state, so
  it skips by iterating: at most ``--skip-cap`` batches (700) are iterated and timed, and the
  row reports the cap and the time extrapolated to all of them. Each tool's resume state is
  made in a process of its own (``--prepare``), and the timed resume runs in the row's
  fresh process, as a relaunch does: no reader's clients or caches are warm from making it
  (the smoke form, ``--in-process``, makes it in the row's process).
- **prefetch memory** (strata): the bound its prefetch states (``prefetch`` shards fetched
  ahead, to local files, in the lease-holding process) beside what its ``stats()`` saw at
  most (shards ahead; shards held: ahead and in use by batches in flight) and the peak
  memory (PSS) delta measured.

The peers' install traps and how this bench works around each are in
``perf/shards_peers.py``'s docstring; a peer that cannot be imported gets a row ``not
installed: <why>``. Install them with ``pip install --no-deps`` as ``scripts/setup.sh``
does not: ``pip install -e '.[bench-peers]' --no-deps`` is not enough (the extra names the
peers; see the docstring for the packages beside them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if __package__:
    from . import shards_peers as peers
else:  # python perf/bench_shards.py
    import shards_peers as peers  # type: ignore[no-redef]

SMOKE = {
    "samples": 2_000,
    "shards": 10,
    "workers": [0, 2],
    "stores": ["local"],
    "resume_at": [10, 100],
    "repeat": 1,
}
FULL = {"samples": 200_000, "shards": 200, "workers": [0, 2, 4], "stores": ["local", "s3"],
        "resume_at": [10, 10**6], "repeat": 3}  # fmt: skip
BATCH = 256
READER_NAMES = {"floor": peers.Floor, "strata": peers.Strata, "litdata": peers.Litdata,
                "mosaic": peers.Mosaic, "webdataset": peers.Webdataset}  # fmt: skip
ROW_TIMEOUT = 1200


# -- one row, in a process of its own --------------------------------------------------------
class PeakRss:
    """The peak, over a sampling thread's 50 ms ticks, of the memory of this process and its
    children (DataLoader workers) summed, each as its PSS (shared pages split among the
    processes sharing them: forked workers share torch's pages with the main process);
    ``delta`` is that over the sum at the start."""

    def __init__(self) -> None:
        import psutil

        self.me = psutil.Process()
        self.start = self.peak = self._now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _now(self) -> int:
        total = self.me.memory_full_info().pss
        for child in self.me.children(recursive=True):
            with contextlib.suppress(Exception):
                total += child.memory_full_info().pss
        return int(total)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(Exception):
                self.peak = max(self.peak, self._now())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def delta_mib(self) -> float:
        return round((self.peak - self.start) / 2**20, 1)


def one_row(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one row (``spec``: kind, reader, store, num_workers, corpus, ...)."""
    import torch  # noqa: F401  (imported before any timing or memory baseline, for all)

    reader = READER_NAMES[spec["reader"]]()
    corpus = peers.Corpus(**spec["corpus"])
    row: dict[str, Any] = {k: spec[k] for k in ("kind", "reader", "store", "num_workers")}
    row["name"] = reader.name
    if spec["kind"] == "resume":
        row["batches_done"] = spec["batches_done"]
    missing = reader.missing()
    if missing:
        return {**row, "missing": missing}
    absent = corpus.formats.get({"litdata": peers.LITDATA, "mosaic": peers.MDS}.get(
        spec["reader"], ""))  # fmt: skip
    if absent:
        return {**row, "missing": absent}
    scratch = tempfile.mkdtemp(prefix="run-", dir=spec["scratch"])
    run = peers.Run(corpus, spec["store"], spec["num_workers"], spec["batch_size"], scratch,
                    spec.get("redis_url"))  # fmt: skip
    try:
        if spec["kind"] in ("throughput", "memory"):
            memory = spec["kind"] == "memory"
            row.update(_throughput(reader, run, spec.get("check_ids", False), memory))
        else:
            fresh = spec["reader"] if spec.get("fresh_resume") else None
            row.update(_resume(reader, run, spec["batches_done"], spec["skip_cap"], fresh))
        row["note"] = reader.note
    finally:
        reader.close()
        peers.remove(scratch)
    return row


def _throughput(
    reader: peers.Reader, run: peers.Run, check_ids: bool, memory: bool = False
) -> dict[str, Any]:
    """One epoch; ``memory``: its peak memory sampled too (``PeakRss``: its thread takes CPU
    and the GIL from the process it measures, so a row that samples is not timed for the
    throughput tables)."""
    seen = 0
    ids: list[int] = []
    rss = PeakRss() if memory else None
    with rss or contextlib.nullcontext():
        loader = reader.loader(run)
        began = time.perf_counter()
        for batch in loader:
            seen += len(batch)
            if check_ids:
                ids.extend(peers.sample_id(p) for p in batch)
        took = time.perf_counter() - began
    out: dict[str, Any] = {"samples": seen, "seconds": round(took, 3)}
    out.update(samples_per_s=round(seen / took))
    if rss is not None:
        out["peak_rss_mib"] = rss.delta_mib
    if check_ids:
        out["distinct"] = len(set(ids))
        out["ids_ok"] = sorted(ids) == list(range(run.corpus.samples))
    out.update(reader.stats())
    if seen != run.corpus.samples:
        out["error"] = f"{seen} samples, expected {run.corpus.samples}"
    return out


def _resume(
    reader: peers.Reader, run: peers.Run, batches: int, cap: int, fresh: str | None = None
) -> dict[str, Any]:
    """(``fresh``: the reader's name in ``READER_NAMES``, whose resume state is made by a
    process of its own)"""
    done = batches * run.batch_size
    epoch, in_epoch = divmod(done, run.corpus.samples)
    out: dict[str, Any] = {"batches_done": batches, "epoch": epoch, "sample_in_epoch": in_epoch}
    if isinstance(reader, peers.Webdataset):
        # no resume state: iterate the batches already trained, at most `cap` of them
        skip = min(batches, cap)
        began = time.perf_counter()
        it = iter(_endless(reader, run))
        for _ in range(skip):
            next(it)
        first = next(it)
        took = time.perf_counter() - began
        out.update(seconds=round(took, 3), skipped_batches=skip, first_id=peers.sample_id(first[0]))
        if skip < batches:
            out["capped_at"] = cap
            out["extrapolated_s"] = round(took * (batches + 1) / (skip + 1), 1)
        return out
    if fresh:  # its state made by another process: this one made no client, opened nothing
        prepared = _prepare_elsewhere(fresh, run, in_epoch, epoch)
    else:
        prepared = reader.prepare_resume(run, in_epoch, epoch)
    began = time.perf_counter()
    loader = reader.resume(run, in_epoch, epoch, prepared)
    first = next(iter(loader))
    out["seconds"] = round(time.perf_counter() - began, 3)
    out["first_id"] = peers.sample_id(first[0])
    if not isinstance(reader, peers.Strata):  # (strata's order is the epoch's shuffle)
        out["expected_first_id"] = in_epoch
    return out


def _prepare_elsewhere(name: str, run: peers.Run, samples_done: int, epoch: int) -> Any:
    """``prepare_resume`` in a process of its own (``--prepare``): its state, as JSON."""
    spec = {"reader": name, "run": {**vars(run), "corpus": vars(run.corpus)},
            "samples_done": samples_done, "epoch": epoch}  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "perf.bench_shards", "--prepare",
                           json.dumps(spec)], capture_output=True, text=True,
                          timeout=ROW_TIMEOUT, cwd=HERE.parent, env=_env())  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"preparing the resume failed (exit {proc.returncode}): {tail}")
    return json.loads(lines[-1])["prepared"]


def _prepare_here(spec: dict[str, Any]) -> Any:
    reader = READER_NAMES[spec["reader"]]()
    run = peers.Run(**{**spec["run"], "corpus": peers.Corpus(**spec["run"]["corpus"])})
    try:
        return reader.prepare_resume(run, spec["samples_done"], spec["epoch"])
    finally:
        reader.close()


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(HERE.parent), os.environ.get("PYTHONPATH", "")) if p)}  # fmt: skip


def _endless(reader: peers.Reader, run: peers.Run) -> Any:
    while True:
        yield from reader.loader(run)


# -- the run ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="200,000 samples, 200 shards, ...")
    parser.add_argument("--samples", type=int)
    parser.add_argument("--shards", type=int)
    parser.add_argument("--workers", help="num_workers values, e.g. 0,2,4")
    parser.add_argument("--stores", help="local,s3")
    parser.add_argument("--readers", default=",".join(READER_NAMES), help="floor,strata,...")
    parser.add_argument("--batch-size", type=int, default=BATCH)
    parser.add_argument("--skip-cap", type=int, default=700, help="webdataset's skip cap")
    parser.add_argument("--no-resume", action="store_true")
    parser.add_argument("--no-throughput", action="store_true", help="the resume rows only")
    parser.add_argument("--resume-at", help="batches done, e.g. 10,1000000 (--full's)")
    parser.add_argument("--check-ids", action=argparse.BooleanOptionalAction)
    parser.add_argument(
        "--repeat", type=int, help="throughput rows per reader and setting, interleaved "
        "(--full's: 3; else 1): the tables give medians"
    )  # fmt: skip
    parser.add_argument("--dir", help="where the corpus goes (default: a temp dir, removed)")
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--redis-url", help="default: a private redis-server")
    parser.add_argument(
        "--in-process",
        action=argparse.BooleanOptionalAction,
        help="every row in this process (the smoke form's default: faster)",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a row's spec (JSON): internal
    parser.add_argument("--prepare", help=argparse.SUPPRESS)  # a resume's state: internal
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one_row(json.loads(args.one))), flush=True)
        return 0
    if args.prepare:
        print(json.dumps({"prepared": _prepare_here(json.loads(args.prepare))}), flush=True)
        return 0
    size = FULL if args.full else SMOKE
    samples = args.samples or size["samples"]
    shards = args.shards or (max(1, samples // 1000) if args.samples else size["shards"])
    workers = [int(w) for w in args.workers.split(",")] if args.workers else size["workers"]
    stores = args.stores.split(",") if args.stores else size["stores"]
    readers = args.readers.split(",")
    resume_at = [int(b) for b in args.resume_at.split(",")] if args.resume_at else size[
        "resume_at"]  # fmt: skip
    repeat = args.repeat or size["repeat"]
    if repeat < 1:
        parser.error(f"--repeat must be 1 or more, got {repeat}")
    check_ids = args.check_ids if args.check_ids is not None else not args.full
    in_process = args.in_process if args.in_process is not None else not args.full
    global ROW_TIMEOUT
    ROW_TIMEOUT = ROW_TIMEOUT if args.full or args.samples else 120
    args.results.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        base = args.dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="shards-"))
        root = os.path.join(base, "corpus")
        redis_url = args.redis_url
        if redis_url is None and "strata" in readers:
            from strata_redis.server import RedisServer

            server = stack.enter_context(RedisServer().start())
            redis_url = server.url
        endpoint = None
        if "s3" in stores:
            endpoint = stack.enter_context(_moto())
        corpus = peers.Corpus(samples, shards, root, endpoint)
        print(f"writing {samples:,} samples in {shards} shards ({', '.join(stores)}) ...",
              flush=True)  # fmt: skip
        took = peers.write_corpus(corpus)
        print("  " + ", ".join(f"{k} {v:.1f} s" for k, v in took.items()), flush=True)
        common = {"corpus": vars(corpus), "batch_size": args.batch_size, "scratch": base,
                  "redis_url": redis_url, "skip_cap": args.skip_cap,
                  "check_ids": check_ids}  # fmt: skip
        rows: list[dict[str, Any]] = []
        for store in stores:
            for nw in [] if args.no_throughput else workers:
                # each repetition runs every reader once, the order turned by one each time
                # (none always first after another's cleanup): a repetition's rows are a set
                for rep in range(repeat):
                    for name in readers[rep % len(readers) :] + readers[: rep % len(readers)]:
                        spec = {**common, "kind": "throughput", "reader": name, "store": store,
                                "num_workers": nw}  # fmt: skip
                        rows.append({**_run_row(spec, in_process), "rep": rep})
                for name in readers:  # the peak memory: rows of their own, not timed
                    spec = {**common, "kind": "memory", "reader": name, "store": store,
                            "num_workers": nw}  # fmt: skip
                    rows.append(_run_row(spec, in_process))
            if not args.no_resume:
                for name in readers:
                    for batches in resume_at:
                        spec = {**common, "kind": "resume", "reader": name, "store": store,
                                "num_workers": 0, "batches_done": batches,
                                "fresh_resume": not in_process}  # fmt: skip
                        rows.append(_run_row(spec, in_process))
    summary = summarize(rows, samples, shards, args.batch_size)
    (args.results / "shards.json").write_text(json.dumps(summary, indent=2))
    table = tables(summary)
    (args.results / "shards.md").write_text(table)
    print(table)
    errors = [r for r in rows if "error" in r]
    return 1 if errors else 0


@contextlib.contextmanager
def _moto() -> Any:
    from strata_redis.chaos.stand_in import ENV, MotoServer

    for var, value in ENV.items():
        os.environ.setdefault(var, value)
    server = MotoServer().start()
    try:
        yield server.endpoint_url
    finally:
        server.stop()


def _run_row(spec: dict[str, Any], in_process: bool = False) -> dict[str, Any]:
    """One row in a fresh process (``--one``), or in this one; a crash or a timeout is the
    row's error."""
    label = f"{spec['kind']} {spec['reader']} {spec['store']} nw={spec['num_workers']}"
    if spec["kind"] == "resume":
        label += f" at {spec['batches_done']:,} batches"
    if in_process:
        try:
            row = one_row(spec)
        except Exception as exc:
            row = {k: spec[k] for k in ("kind", "reader", "store", "num_workers")}
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        print(f"  {label}: {_brief(row)}", flush=True)
        return row
    cmd = [sys.executable, "-m", "perf.bench_shards", "--one", json.dumps(spec)]
    env = _env()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=ROW_TIMEOUT,
                              cwd=HERE.parent, env=env)  # fmt: skip
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode == 0 and lines:
            row: dict[str, Any] = json.loads(lines[-1])
        else:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            row = {k: spec[k] for k in ("kind", "reader", "store", "num_workers")}
            row["error"] = f"exit {proc.returncode}: {tail[:300]}"
    except subprocess.TimeoutExpired:
        row = {k: spec[k] for k in ("kind", "reader", "store", "num_workers")}
        row["error"] = f"timed out after {ROW_TIMEOUT} s"
    if spec["kind"] == "resume":
        row.setdefault("batches_done", spec["batches_done"])
    print(f"  {label}: {_brief(row)}", flush=True)
    return row


def _brief(row: dict[str, Any]) -> str:
    if "missing" in row:
        return row["missing"]
    if "error" in row:
        return "ERROR " + row["error"]
    if row["kind"] == "memory":
        return f"peak memory delta {row['peak_rss_mib']} MiB (PSS; not timed)"
    if row["kind"] == "throughput":
        return f"{row['samples_per_s']:,} samples/s ({row['samples']:,} samples)"
    return f"{row['seconds']} s"


def summarize(rows: list[dict[str, Any]], samples: int, shards: int, batch: int) -> dict[str, Any]:
    """The rows with ``x_floor`` filled (over the raw floor's row of the same repetition,
    store and ``num_workers``), each setting's medians (``medians``), and strata's prefetch
    bound beside its memory."""
    floor = {
        (r["store"], r["num_workers"], r.get("rep", 0)): r["samples_per_s"]
        for r in rows
        if r["kind"] == "throughput" and r["reader"] == "floor" and "samples_per_s" in r
    }
    for r in rows:
        ref = floor.get((r["store"], r["num_workers"], r.get("rep", 0)))
        if r["kind"] == "throughput" and "samples_per_s" in r and ref:
            r["x_floor"] = round(r["samples_per_s"] / ref, 2)
    shard_bytes = -(-samples // shards) * (512 + peers.SAMPLE_BYTES)
    return {
        "samples": samples, "shards": shards, "sample_bytes": peers.SAMPLE_BYTES,
        "batch_size": batch, "cores": os.cpu_count(),
        "strata_prefetch_bound_mib": round(2 * shard_bytes / 2**20, 1),
        "rows": rows, "medians": medians(rows),
    }  # fmt: skip


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per reader, store and ``num_workers`` over its repetitions: the median
    samples/s and ``x_floor`` (each repetition's ratio, then their median), the ratios' range,
    the peak memory its ``memory`` row measured (the most, if several); a setting none of
    whose rows ran keeps the first row's reason."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    peaks: dict[tuple[str, str, int], list[float]] = {}
    for r in rows:
        setting = (r["reader"], r["store"], r["num_workers"])
        if r["kind"] == "throughput":
            groups.setdefault(setting, []).append(r)
        elif r["kind"] == "memory" and "peak_rss_mib" in r:
            peaks.setdefault(setting, []).append(r["peak_rss_mib"])
    out = []
    for (reader, store, nw), group in groups.items():
        ran = [r for r in group if "samples_per_s" in r]
        entry: dict[str, Any] = {"reader": reader, "store": store, "num_workers": nw,
                                 "name": group[0].get("name", reader), "runs": len(ran),
                                 "note": group[0].get("note", "")}  # fmt: skip
        if not ran:
            entry["why"] = group[0].get("missing") or "error: " + group[0].get("error", "")
            out.append(entry)
            continue
        ratios = sorted(r["x_floor"] for r in ran if "x_floor" in r)
        entry.update(
            samples_per_s=round(statistics.median(r["samples_per_s"] for r in ran)),
            samples=ran[0]["samples"],
            errors=len(group) - len(ran),
        )
        if ratios:
            entry.update(x_floor=round(statistics.median(ratios), 2), x_floor_each=ratios)
        if (reader, store, nw) in peaks:
            entry["peak_rss_mib"] = max(peaks[(reader, store, nw)])
        out.append(entry)
    return out


def tables(summary: dict[str, Any]) -> str:
    """The throughput, resume and memory tables in Markdown."""
    rows = summary["rows"]
    out = [
        f"{summary['samples']:,} samples of {summary['sample_bytes']:,} B in "
        f"{summary['shards']} shards, batches of {summary['batch_size']}, "
        f"{summary['cores']} cores; throughput: the median of each setting's runs (x floor: "
        "each run over the floor's run beside it, then the median)",
        "",
        "| reader | store | num_workers | samples/s | x floor | x floor, each run | samples "
        "| peak memory Δ MiB (PSS) | note |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for m in summary["medians"]:
        name = m["name"]
        if "samples_per_s" in m:
            each = ", ".join(f"{x}" for x in m.get("x_floor_each", []))
            failed = f"; {m['errors']} run(s) failed" if m["errors"] else ""
            out.append(
                f"| {name} | {m['store']} | {m['num_workers']} | {m['samples_per_s']:,} | "
                f"{m.get('x_floor', '')} | {each} | {m['samples']:,} | "
                f"{m.get('peak_rss_mib', '')} | {m['note']}{failed} |"
            )
        else:
            out.append(f"| {name} | {m['store']} | {m['num_workers']} | | | | | | {m['why']} |")
    out += ["", "| reader | store | batches done | resume to first batch, s | note |",
            "| --- | --- | ---: | ---: | --- |"]  # fmt: skip
    for r in (r for r in rows if r["kind"] == "resume"):
        name = r.get("name", r["reader"])
        if "seconds" not in r:
            why = r.get("missing") or "error: " + r.get("error", "")
            out.append(f"| {name} | {r['store']} | {r['batches_done']:,} | | {why} |")
            continue
        note = f"epoch {r['epoch']:,}, sample {r['sample_in_epoch']:,}"
        if "capped_at" in r:
            note = (f"skipped by iterating {r['skipped_batches']:,} batches (cap); "
                    f"~{r['extrapolated_s']:,} s for all")  # fmt: skip
        elif "first_id" in r and r["first_id"] != r.get("expected_first_id", r["first_id"]):
            note += f"; first sample {r['first_id']}, expected {r['expected_first_id']}"
        out.append(f"| {name} | {r['store']} | {r['batches_done']:,} | {r['seconds']} | {note} |")
    strata = [r for r in rows if r["reader"] == "strata" and "max_held_shards" in r]
    if strata:
        out += ["", f"strata's prefetch, stated bound: 2 shards ahead "
                f"(~{summary['strata_prefetch_bound_mib']} MiB of shard files); measured:", "",
                "| store | num_workers | shards ahead at most | shards held at most (ahead + "
                "in use) | bytes held at most, MiB | peak memory Δ MiB (PSS), the most |",
                "| --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
        settings: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for r in strata:
            settings.setdefault((r["store"], r["num_workers"]), []).append(r)
        for (store, nw), runs in settings.items():  # (the most over the setting's runs)
            held = [r["max_held_bytes"] for r in runs if r.get("max_held_bytes") is not None]
            mib = round(max(held) / 2**20, 1) if held else ""
            ahead = max((r.get("max_ahead_shards", 0) for r in runs), default="")
            most = max((r.get("max_held_shards", 0) for r in runs), default="")
            peak = max((r["peak_rss_mib"] for r in runs if "peak_rss_mib" in r), default="")
            out.append(f"| {store} | {nw} | {ahead} | {most} | {mib} | {peak} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())

"""``strata status``'s view: the dashboard's snapshot as text for a terminal, fitted to its
width.

Tables never wrap: at a narrow width the least needed columns go first (an address before
a host, before the GPU count, ...), then a cell too long for its column is cut and marked
``~``; the last column takes what is left. Sentences wrap at words, indented.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from strata_redis.checkpoint.records import MB_S_DEFINITION
from strata_redis.dashboard.snapshot import JobSnapshot, Recent, Snapshot

#: the width when the output is no terminal and ``$COLUMNS`` is unset (a pipe, a file)
PIPE_WIDTH: Final = 160
#: the narrowest the last (flexible) column of a table gets
FLEX_MIN: Final = 8


@dataclass(frozen=True)
class Column:
    """A table column: its title, width (0: the flexible last column, at least ``least``
    wide), alignment, and how long it is kept as the width shrinks (higher: kept longer)."""

    title: str
    width: int
    keep: int
    right: bool = False
    least: int = FLEX_MIN


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "~"


def table(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> list[str]:
    """``rows`` under ``columns``' titles, fitted to ``width`` (see the module's doc)."""
    shown = list(range(len(columns)))

    def total(idx: list[int]) -> int:
        return sum(columns[i].width or columns[i].least for i in idx) + len(idx) - 1

    while total(shown) > width and len(shown) > 1:
        shown.remove(min(shown, key=lambda i: columns[i].keep))
    lines = []
    for cells in [[c.title for c in columns], *rows]:
        out, used = [], 0
        for n, i in enumerate(shown):
            col, cell = columns[i], cells[i]
            room = col.width or max(col.least, width - used)
            cell = _cut(cell, room)
            text = cell.rjust(room) if col.right else cell if not col.width else cell.ljust(room)
            out.append(text)
            used += len(text) + 1
            if n == len(shown) - 1:
                break
        lines.append(" ".join(out).rstrip()[:width])
    return lines


def _wrap(line: str, width: int) -> list[str]:
    """A sentence wrapped at words; its continuation lines indented."""
    if len(line) <= width:
        return [line]
    indent = " " * (len(line) - len(line.lstrip()) + 4)
    return textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False) or [""]


def width_now() -> int:
    """The width to fit: ``$COLUMNS``, else the terminal's, else ``PIPE_WIDTH``."""
    return max(40, shutil.get_terminal_size((PIPE_WIDTH, 24)).columns)


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"  # pragma: no cover - the loop always returns


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def window_words(seconds: float) -> str:
    """A window's length as people say it: ``10 min``, ``90 s``, ``2 h``."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def _at_least(recent: Recent) -> str:
    return "" if recent.complete else "at least "


def _bar(done: int, leased: int, total: int, width: int = 20) -> str:
    if total <= 0:
        return "[" + " " * width + "]"
    d = round(width * done / total)
    s = min(width - d, round(width * leased / total))
    return "[" + "#" * d + "~" * s + "." * (width - d - s) + "]"


DATASET_COLUMNS: Final = (
    Column("DATASET", 24, 9),
    Column("EPOCH", 5, 8, True),
    Column("DONE", 7, 7, True),
    Column("LEASED", 7, 4, True),
    Column("TO DO", 7, 3, True),
    Column("SHARDS", 7, 5, True),
    Column("STOLEN", 7, 2, True),
    Column("PROGRESS", 0, 6, least=29),
)
CHECKPOINT_COLUMNS: Final = (
    Column("EPOCH", 6, 8, True),
    Column("STEP", 10, 9, True),
    Column("RUN", 3, 3, True),
    Column("STATE", 10, 7),
    Column("SIZE", 9, 5, True),
    Column("RANKS", 7, 4, True),
    Column("MB/S", 8, 2, True),
    Column("NOTE", 0, 6, least=16),
)
WORKER_COLUMNS: Final = (
    Column("WORKER", 24, 9),
    Column("STATUS", 14, 8),
    Column("LAST SEEN", 10, 7, True),
    Column("HOST", 16, 3),
    Column("ADDRESS", 22, 1),
    Column("GPUS", 4, 2, True),
    Column("SHARD", 0, 5, least=12),
)


def _workers_said(job: JobSnapshot) -> str:
    """How many workers are live (heartbeating within the timeout) of those registered: a
    silent one is not counted live, and with every one silent there is no live count."""
    live = job.live_workers - job.silent_workers
    if job.all_silent:
        return (
            f"no worker heartbeating ({job.silent_workers} silent of "
            f"{job.registered_workers} workers)"
        )
    return f"{live} live of {job.registered_workers} workers"


def render_job(snap: Snapshot, job_id: str, width: int = PIPE_WIDTH) -> list[str]:
    """The lines of one job's overview, datasets, checkpoints and workers, ``width`` wide."""
    job = snap.find(job_id)
    counts = job.counts
    recent = job.recent
    stale = counts["stale"]
    lines = [
        f"job {job_id!r} ({job.state}): membership generation {job.generation}, "
        f"{_workers_said(job)}; epoch {job.epoch}",
        f"  workers: {counts['training']} training, {counts['checkpointing']} checkpointing, "
        f"{counts['idle']} idle; {_at_least(recent)}{recent.failed} failed and "
        f"{recent.left} left in the last {window_words(recent.window_s)} (membership "
        "events)"
        + (
            f", {stale} silent past the job's {job.heartbeat_timeout_s:g}s timeout" if stale else ""
        ),
    ]
    b = job.barrier
    if b.releases:
        lines.append(
            f"  barrier release latency: p50 {_num(b.p50_ms, 2)} ms, p99 "
            f"{_num(b.p99_ms, 2)} ms, max {_num(b.max_ms, 2)} ms "
            f"(newest {b.releases} releases)"
        )
    else:
        lines.append("  barrier release latency: no releases recorded")
    rate = snap.redis_rate.commands_per_s
    lines.append(
        f"  lease grants so far: {job.lease_grants_total}; Redis: "
        + ("-" if rate is None else f"{rate:.0f}")
        + " commands/s (whole server)"
    )
    lines.append(_training_line(job))
    lines = [part for line in lines for part in _wrap(line, width)]
    lines.append("")
    if job.datasets:
        rows = []
        for d in job.datasets:
            p = d.progress
            pct = 100 * p.done / p.total if p.total else 0.0
            progress = f"{_bar(p.done, p.leased, p.total)} {pct:5.1f}%" + (
                "" if p.initialized else "  (epoch not started)"
            )
            rows.append([plain(d.params.name), str(d.epoch), str(p.done), str(p.leased),
                         str(p.todo), str(p.total), str(p.steals), progress])  # fmt: skip
        lines += table(DATASET_COLUMNS, rows, width)
    else:
        lines.append("no datasets registered")
    lines.append("")
    if job.checkpoints:
        rows = []
        for c in job.checkpoints:
            ranks = (
                str(c.ranks_saved) if c.world_size is None else f"{c.ranks_saved}/{c.world_size}"
            )
            note = f"aborted by {c.culprit}: {c.reason}" if c.state == "aborted" else ""
            epoch = "-" if c.id.epoch is None else str(c.id.epoch)
            rows.append([epoch, str(c.id.step), str(c.id.run), c.state, _bytes(c.nbytes), ranks,
                         _num(c.mb_s), plain(note)])  # fmt: skip
        lines += table(CHECKPOINT_COLUMNS, rows, width)
        lines += _wrap(f"(MB/s = {MB_S_DEFINITION})", width)
    else:
        lines.append("no checkpoints recorded")
    lines.append("")
    rows = []
    for w in job.workers:
        seen = "-" if w.last_seen_s is None else f"{w.last_seen_s:.1f}s"
        shard = ", ".join(f"{s.dataset}#{s.shard_id}" for s in w.shards)
        rows.append([plain(w.worker_id), str(w.status), seen, plain(w.host or "-"),
                     plain(w.address or "-"), str(w.gpu_count), plain(shard)])  # fmt: skip
    if rows:
        lines += table(WORKER_COLUMNS, rows, width)
    shown = sum(len(j.workers) for j in snap.jobs)
    if snap.page.total > shown:
        lines.append(f"... {snap.page.total - shown} more workers not shown")
    if any(w.stale for w in job.workers):
        lines += _wrap(
            "(stale: no heartbeat for longer than the job's timeout; not yet reaped)", width
        )
    return lines


def _duration(seconds: float) -> str:
    whole = round(seconds)  # rounded first: 119.6 s is 2m00s, never 1m60s
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    minutes = round(seconds / 60)
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _training_line(job: JobSnapshot) -> str:
    """The job's samples/s, its epoch's ETA and its slowest worker, in one line; with every
    live worker silent, or nothing read within the rate's window, no rate and no ETA."""
    p = job.training
    rate, eta, left = p.samples_per_s, p.eta_s, p.epoch_remaining_samples
    if job.all_silent:
        line = "  training: no rate (no worker heartbeating)"
    elif rate is None:
        line = "  training: no rate (no recent data)"
    else:
        line = f"  training: {rate:.1f} samples/s"
    if eta == 0:
        line += f", epoch {job.epoch} done"
    elif eta is not None:
        line += f", epoch {job.epoch} ETA {_duration(eta)} ({left} samples left)"
    if p.slowest_worker is not None:
        line += f"; slowest {p.slowest_worker}"
    return line + f"; {p.samples_trained} samples trained"


def plain(text: str) -> str:
    """``text`` safe for a terminal: control characters (an escape sequence in a worker's
    host name or labels, written by anyone who can register) shown as ``\\x..`` escapes,
    line breaks kept."""
    if text.isprintable():
        return text
    return "".join(c if c == "\n" or c.isprintable() else repr(c)[1:-1] for c in text)


def render(snap: Snapshot, width: int | None = None) -> str:
    """The whole snapshot as text: each job in turn, fitted to ``width`` (default
    ``width_now()``), safe for a terminal (``plain``)."""
    width = width_now() if width is None else width
    blocks = ["\n".join(render_job(snap, j.job_id, width)) for j in snap.jobs]
    if not blocks:
        return "no strata jobs in this Redis"
    return plain("\n\n".join(blocks))

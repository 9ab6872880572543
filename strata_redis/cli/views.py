"""``strata status``'s view: the dashboard's snapshot as text for a terminal, fitted to its
width and, for ``--watch`` on a terminal, its height.

Width: tables never wrap. At a narrow width the least needed columns go first (an address
before a host, before the GPU count, ...), then a cell too long for its column is cut and
marked ``…`` at the end that matters least: a name keeps its start (``imagenet_tr…``), a
worker id and a shard their end (``…node-7-rank-3``, ``…net_train#17``: what tells them
apart); the last column takes what is left. Sentences wrap at words, indented.

Height (``render(..., height=)``): the header (the job's state, workers, barrier, training
lines) always stays; what gives way first is the worker table (cut to the rows that fit, a
``… N more workers`` line under it), then the checkpoint table (the newest kept), then the
datasets; a table with no row left is one ``… N <what> not shown`` line.

Why not ``rich``: its tables shrink and cut every column alike and cut only at a cell's end,
so dropping columns by need, cutting ids at their start and a height budget by section would
be this module's code anyway, beside a dependency of 13 MB installed (pygments,
markdown-it-py) in a base install of 115 MB; and ``--watch`` needs two terminal codes
(home, clear to the end), no live-display machinery.
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
#: the height when the output is no terminal and ``$LINES`` is unset
PIPE_HEIGHT: Final = 24
#: the narrowest the last (flexible) column of a table gets
FLEX_MIN: Final = 8
#: what marks a cell cut to fit
CUT: Final = "…"


@dataclass(frozen=True)
class Column:
    """A table column: its title, width (0: the flexible last column, at least ``least``
    wide), alignment, how long it is kept as the width shrinks (higher: kept longer), and
    whether a cell too long keeps its end (an id or a shard, told apart by their end)
    rather than its start."""

    title: str
    width: int
    keep: int
    right: bool = False
    least: int = FLEX_MIN
    keep_end: bool = False


def cut(text: str, width: int, keep_end: bool = False) -> str:
    """``text`` in at most ``width`` characters: cut and marked ``…`` where cut, keeping its
    end (``keep_end``) or its start."""
    if len(text) <= width:
        return text
    if width <= len(CUT):
        return CUT[:width]
    room = width - len(CUT)
    return CUT + text[len(text) - room :] if keep_end else text[:room] + CUT


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
            cell = cut(cell, room, col.keep_end)
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
    return max(40, shutil.get_terminal_size((PIPE_WIDTH, PIPE_HEIGHT)).columns)


def height_now() -> int:
    """The height to fit: ``$LINES``, else the terminal's, else ``PIPE_HEIGHT``."""
    return max(8, shutil.get_terminal_size((PIPE_WIDTH, PIPE_HEIGHT)).lines)


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
    Column("WORKER", 24, 9, keep_end=True),
    Column("STATUS", 14, 8),
    Column("LAST SEEN", 10, 7, True),
    Column("HOST", 16, 3),
    Column("ADDRESS", 22, 1),
    Column("GPUS", 4, 2, True),
    Column("SHARD", 0, 5, least=12, keep_end=True),
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


@dataclass
class _Block:
    """A table of the view, for fitting a height: its title row, its rows (the first kept
    longest), the notes under it, and rows it has that are not shown (``what`` names them)."""

    what: str
    head: list[str]
    rows: list[str]
    notes: list[str]
    hidden: int = 0

    def lines(self) -> list[str]:
        if self.head and not self.rows:  # no row left: one line says what is not shown
            return [f"{CUT} {self.hidden} {self.what} not shown"] if self.hidden else []
        more = [f"{CUT} {self.hidden} more {self.what} not shown"] if self.hidden else []
        return self.head + self.rows + more + self.notes


def render_job(
    snap: Snapshot, job_id: str, width: int = PIPE_WIDTH, height: int | None = None
) -> list[str]:
    """The lines of one job's overview, datasets, checkpoints and workers, ``width`` wide
    and, with ``height``, at most that many lines (see the module's doc: what gives way)."""
    head, blocks = _job_view(snap, job_id, width)
    if height is not None:
        _fit(head, blocks, height)
    lines = list(head)
    for block in blocks:
        shown = block.lines()
        lines += ["", *shown] if shown else []
    return lines if height is None else lines[:height]


def _fit(head: list[str], blocks: list[_Block], height: int) -> None:
    """Cut ``blocks`` (workers first, then checkpoints, then datasets) until the view takes
    at most ``height`` lines; the header stays."""

    def used() -> int:
        return len(head) + sum(1 + len(b.lines()) for b in blocks if b.lines())

    by_need = sorted(blocks, key=lambda b: _GIVES_WAY.index(b.what))
    for block in by_need:
        if used() <= height:
            return
        block.notes = []
        while block.rows and used() > height:
            block.rows.pop()
            block.hidden += 1


#: the tables in the order they give way to a short terminal
_GIVES_WAY: Final = ("workers", "checkpoints", "datasets")


def _job_view(snap: Snapshot, job_id: str, width: int) -> tuple[list[str], list[_Block]]:
    """One job's header lines and its tables (datasets, checkpoints, workers)."""
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
    head = [part for line in lines for part in _wrap(line, width)]
    blocks = []
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
        title, *cells = table(DATASET_COLUMNS, rows, width)
        blocks.append(_Block("datasets", [title], cells, []))
    else:
        blocks.append(_Block("datasets", [], [], ["no datasets registered"]))
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
        title, *cells = table(CHECKPOINT_COLUMNS, rows, width)
        blocks.append(
            _Block("checkpoints", [title], cells, _wrap(f"(MB/s = {MB_S_DEFINITION})", width))
        )
    else:
        blocks.append(_Block("checkpoints", [], [], ["no checkpoints recorded"]))
    rows = []
    for w in job.workers:
        seen = "-" if w.last_seen_s is None else f"{w.last_seen_s:.1f}s"
        shard = ", ".join(f"{s.dataset}#{s.shard_id}" for s in w.shards)
        rows.append([plain(w.worker_id), str(w.status), seen, plain(w.host or "-"),
                     plain(w.address or "-"), str(w.gpu_count), plain(shard)])  # fmt: skip
    title, *cells = table(WORKER_COLUMNS, rows, width) if rows else [""]
    shown = sum(len(j.workers) for j in snap.jobs)
    notes = []
    if any(w.stale for w in job.workers):
        notes = _wrap(
            "(stale: no heartbeat for longer than the job's timeout; not yet reaped)", width
        )
    workers = _Block("workers", [title] if rows else [], cells, notes)
    workers.hidden = max(0, snap.page.total - shown)  # beyond the page read
    blocks.append(workers)
    return head, blocks


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
    elif rate is None and job.live_workers == 0:
        line = "  training: no rate (no live worker)"
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


def render(snap: Snapshot, width: int | None = None, height: int | None = None) -> str:
    """The whole snapshot as text: each job in turn, fitted to ``width`` (default
    ``width_now()``) and, given a ``height``, to that many lines (each job an equal share;
    see the module's doc), safe for a terminal (``plain``)."""
    width = width_now() if width is None else width
    jobs = snap.jobs
    share = None if height is None or not jobs else max(1, (height + 1) // len(jobs) - 1)
    blocks = ["\n".join(render_job(snap, j.job_id, width, share)) for j in jobs]
    if not blocks:
        return "no strata jobs in this Redis"
    return plain("\n\n".join(blocks))

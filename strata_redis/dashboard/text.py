"""The dashboard document as text for a terminal (``strata status``)."""

from __future__ import annotations

from typing import Any


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


def _bar(done: int, leased: int, total: int, width: int = 20) -> str:
    if total <= 0:
        return "[" + " " * width + "]"
    d = round(width * done / total)
    s = min(width - d, round(width * leased / total))
    return "[" + "#" * d + "~" * s + "." * (width - d - s) + "]"


def render_job(doc: dict[str, Any], job_id: str) -> list[str]:
    """The lines of one job's overview, datasets, checkpoints and workers."""
    (job,) = (j for j in doc["jobs"] if j["job_id"] == job_id)
    (m,) = (x for x in doc["metrics"]["jobs"] if x["job_id"] == job_id)
    counts = m["workers"]
    stale = counts["stale"]
    lines = [
        f"job {job_id!r} ({job['state']}): membership generation "
        f"{job['membership_generation']}, "
        f"{job['live_workers']} live of {job['registered_workers']} workers; "
        f"epoch {job['epoch']}",
        f"  workers: {counts['training']} training, {counts['checkpointing']} checkpointing, "
        f"{counts['idle']} idle, {counts['failed']} failed and {counts['left']} left in the "
        f"last 10 min"
        + (
            f", {stale} silent past the job's {job['heartbeat_timeout_s']:g}s timeout"
            if stale
            else ""
        ),
    ]
    b = m["barrier"]
    if b["releases"]:
        lines.append(
            f"  barrier release latency: p50 {_num(b['p50_ms'], 2)} ms, p99 "
            f"{_num(b['p99_ms'], 2)} ms, max {_num(b['max_ms'], 2)} ms "
            f"(newest {b['releases']} releases)"
        )
    else:
        lines.append("  barrier release latency: no releases recorded")
    rate = doc["metrics"]["redis"]["commands_per_s"]
    lines.append(
        f"  lease grants so far: {m['lease_grants_total']}; Redis: "
        + ("-" if rate is None else f"{rate:.0f}")
        + " commands/s (whole server)"
    )
    datasets = [d for d in doc["datasets"] if d["job_id"] == job_id]
    lines.append("")
    if datasets:
        lines.append(
            f"{'DATASET':<24} {'EPOCH':>5} {'DONE':>7} {'LEASED':>7} {'TO DO':>7} {'SHARDS':>7}"
            f" {'STOLEN':>7}  PROGRESS"
        )
        for d in datasets:
            p = d["progress"]
            pct = 100 * p["done"] / p["total"] if p["total"] else 0.0
            lines.append(
                f"{d['name']:<24} {d['epoch']:>5} {p['done']:>7} {p['leased']:>7} {p['todo']:>7} "
                f"{p['total']:>7} {p['steals']:>7}  {_bar(p['done'], p['leased'], p['total'])} "
                f"{pct:5.1f}%" + ("" if p["initialized"] else "  (epoch not started)")
            )
    else:
        lines.append("no datasets registered")
    checkpoints = [c for c in doc["checkpoints"] if c["job_id"] == job_id]
    lines.append("")
    if checkpoints:
        lines.append(
            f"{'EPOCH':>6} {'STEP':>10} {'RUN':>3} {'STATE':<10} {'SIZE':>9} {'RANKS':>7} "
            f"{'MB/S':>8}  NOTE"
        )
        for c in checkpoints:
            ranks = (
                str(c["ranks_saved"]) if c["world_size"] is None
                else f"{c['ranks_saved']}/{c['world_size']}"
            )  # fmt: skip
            note = f"aborted by {c['culprit']}: {c['reason']}" if c["state"] == "aborted" else ""
            epoch = "-" if c["epoch"] is None else str(c["epoch"])
            lines.append(
                f"{epoch:>6} {c['step']:>10} {c.get('run', 0):>3} {c['state']:<10} "
                f"{_bytes(c['bytes']):>9} {ranks:>7} {_num(c['mb_s']):>8}  {note}".rstrip()
            )
    else:
        lines.append("no checkpoints recorded")
    workers = [w for w in doc["workers"] if w["job_id"] == job_id]
    lines.append("")
    if workers:
        lines.append(
            f"{'WORKER':<24} {'STATUS':<14} {'LAST SEEN':>10}  {'HOST':<16} {'ADDRESS':<22} "
            f"{'GPUS':>4}  SHARD"
        )
    for w in workers:
        seen = "-" if w["last_seen_s"] is None else f"{w['last_seen_s']:.1f}s"
        status = w["status"]
        shard = ", ".join(f"{s['dataset']}#{s['shard_id']}" for s in w["shards"])
        lines.append(
            f"{w['worker_id']:<24} {status:<14} {seen:>10}  {w['host'] or '-':<16} "
            f"{w['address'] or '-':<22} {w['gpu_count']:>4}  {shard}".rstrip()
        )
    page = doc["page"]
    if page["total"] > len(doc["workers"]):
        lines.append(f"... {page['total'] - len(doc['workers'])} more workers not shown")
    if any(w["stale"] for w in workers):
        lines.append("(stale: no heartbeat for longer than the job's timeout; not yet reaped)")
    return lines


def plain(text: str) -> str:
    """``text`` safe for a terminal: control characters (an escape sequence in a worker's
    host name or labels, written by anyone who can register) shown as ``\\x..`` escapes,
    line breaks kept."""
    if text.isprintable():
        return text
    return "".join(c if c == "\n" or c.isprintable() else repr(c)[1:-1] for c in text)


def render(doc: dict[str, Any]) -> str:
    """The whole document as text: each job in turn (``plain``: safe for a terminal)."""
    blocks = ["\n".join(render_job(doc, j["job_id"])) for j in doc["jobs"]]
    if not blocks:
        return "no strata jobs in this Redis"
    return plain("\n\n".join(blocks))

"""The ``strata`` command's commands: ``demo``, ``status``, ``jobs``, ``events``, ``doctor``,
``dashboard``; each takes the parsed arguments and returns the exit code."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

import orjson
import redis

from strata_redis.checkpoint import index
from strata_redis.connection import describe, make_client, redact
from strata_redis.coordination import epochs, lifecycle
from strata_redis.coordination.lifecycle import JobState
from strata_redis.coordination.registry import list_jobs
from strata_redis.demo import run_demo
from strata_redis.errors import JobNotFoundError
from strata_redis.identity import JOB_ENV
from strata_redis.job import Job

from .views import height_now, plain, width_now

if TYPE_CHECKING:
    from strata_redis.dashboard.state import DashboardState

#: the environment variable holding the dashboard's token
TOKEN_ENV = "STRATA_DASHBOARD_TOKEN"
#: the most job ids an "unknown job" message lists
JOBS_LISTED = 10


def jobs_here(client: redis.Redis) -> str:
    """The jobs this Redis holds, in a few words (at most ``JOBS_LISTED`` ids): what a
    mistyped ``--job`` is told."""
    ids = list_jobs(client)
    if not ids:
        return "this Redis holds no strata job"
    more = f", … ({len(ids)} in all: strata jobs lists them)" if len(ids) > JOBS_LISTED else ""
    return f"jobs in this Redis: {', '.join(ids[:JOBS_LISTED])}{more}"


def job_exists(client: redis.Redis, job_id: str) -> bool:
    """Whether ``job_id`` has any key in this Redis (a ``SCAN`` on its node that stops at
    the first key found)."""
    return next(lifecycle.job_keys(client, job_id), None) is not None


def unknown_job(client: redis.Redis, job_id: str, doing: str = "") -> int:
    """Say that ``job_id`` has nothing in this Redis and which jobs it has; exit code 1."""
    print(f"strata: no job {job_id!r} in {describe(client)}{doing}; {plain(jobs_here(client))}",
          file=sys.stderr)  # fmt: skip
    return 1


def status_cmd(args: argparse.Namespace) -> int:
    from strata_redis.dashboard.state import DashboardState

    client = make_client(args.redis_url)
    if args.job is None and not args.json and args.watch is None:
        jobs = list_jobs(client)
        if not jobs:
            print("no strata jobs in this Redis")
        for job_id in jobs:
            print(job_id)
        return 0
    if args.job is not None:
        Job(client, args.job)  # validates the id: a clear error for a bad one
    state = DashboardState(client, heartbeat_timeout=args.heartbeat_timeout)
    if args.watch is None:
        try:
            print(_frame(state, args))
        except JobNotFoundError:
            return unknown_job(client, args.job)
        return 0
    return _watch(client, state, args)


def _watch(client: redis.Redis, state: DashboardState, args: argparse.Namespace) -> int:
    """``strata status --watch``: a frame every ``args.watch`` seconds until Ctrl-C. On a
    terminal each frame is drawn in place and fits its height (``views.render``); a job not
    there yet is waited for (said in the frame); Redis going away is ridden out. Exit 0, or
    1 when the job never appeared."""
    tty = sys.stdout.isatty()
    footer = f"(every {args.watch:g} s; Ctrl-C stops)"
    down_since: str | None = None
    seen = args.job is None
    try:  # Ctrl-C is how --watch stops: wherever it lands, a clean exit
        while True:
            try:
                # on a terminal, the height less the footer's line
                text = _frame(state, args, height_now() - 1 if tty else None)
                down_since = None
                seen = True
            except JobNotFoundError:  # started before the job's first worker: wait for it
                text = (
                    f"no job {args.job!r} in {describe(client)} yet: waiting for its first "
                    f"worker, dataset or checkpoint; {jobs_here(client)}"
                )
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                # an outage is what --watch is kept open for: say so, and keep trying
                down_since = down_since or time.strftime("%H:%M:%S")
                text = f"Redis unreachable since {down_since}; retrying ({_text(exc)})"
            if tty:
                # Refresh in place: home the cursor, print each line clearing what the last
                # frame left on it, then clear below; no newline after the footer, so a
                # frame as tall as the terminal never scrolls its first line away.
                lines = _fit_lines(plain(text), height_now() - 1, width_now())
                sys.stdout.write("\x1b[H" + "\x1b[K\n".join([*lines, footer]) + "\x1b[K\x1b[J")
            else:  # a pipe or a file: frames one after another, no terminal codes
                sys.stdout.write(f"{text}\n\n")
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        if seen:
            return 0
        if tty:
            sys.stdout.write("\n")
        return unknown_job(client, args.job, " (watched; it never appeared)")


def _fit_lines(text: str, height: int, width: int) -> list[str]:
    """``text``'s lines, each cut to ``width`` and at most ``height`` of them: what a frame
    that is no table (a wait, an outage, JSON) needs to fit a terminal too."""
    from .views import cut

    lines = [cut(line, width) for line in text.split("\n")]
    if len(lines) > height:
        lines = [*lines[: max(0, height - 1)], f"… {len(lines) - height + 1} more lines"]
    return lines


def _frame(state: DashboardState, args: argparse.Namespace, height: int | None = None) -> str:
    """One read of the job(s), as JSON (the dashboard's document) or as text (fitted to
    ``height`` lines when given)."""
    from strata_redis.dashboard.document import document

    from .views import render

    snap = state.read(args.job, limit=args.limit)
    if args.json:
        return orjson.dumps(document(snap), option=orjson.OPT_INDENT_2).decode()
    return render(snap, height=height)


#: the widest a ``strata jobs`` table gets (a job id longer than fits is cut, marked ``~``)
TABLE_WIDTH = 80


def jobs_cmd(args: argparse.Namespace) -> int:
    if args.jobs_command == "rm":
        return _jobs_rm(args)
    client = make_client(args.redis_url)
    ids = lifecycle.discover_jobs(client)
    states = lifecycle.read_states(client, ids, args.heartbeat_timeout)
    with client.pipeline(transaction=False) as pipe:
        for job_id in ids:
            epochs.queue_epoch(pipe, job_id)
            index.queue_newest_steps(pipe, job_id, 1)
        replies = iter(pipe.execute())
    rows = []
    for st in states:
        epoch = epochs.take_epoch(replies)
        newest = index.take_newest_steps(replies)
        rows.append(_job_row(st, epoch, newest[0].as_dict() if newest else None))
    if args.json:
        doc = {"redis": describe(client), "jobs": rows}
        print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    elif not rows:
        print("no strata jobs in this Redis")
    else:
        print(_jobs_table(rows))
    return 0


def _job_row(st: JobState, epoch: int, checkpoint: dict[str, object] | None) -> dict[str, object]:
    """One job of ``strata jobs --json``."""
    rec = st.record
    return {
        "job_id": st.job_id,
        "state": st.state,
        "workers": {"live": st.live, "silent": st.silent, "total": st.registered},
        "epoch": epoch,
        "last_activity_ms": st.last_activity_ms,
        "idle_s": None if st.last_activity_ms is None
        else max(0.0, (st.now_ms - st.last_activity_ms) / 1000),
        "checkpoint": checkpoint,
        "heartbeat_timeout_s": st.heartbeat_timeout_s,
        "ended_ms": rec.ended_ms if rec else None,
        "expires_ms": rec.expires_ms if rec else None,
    }  # fmt: skip


def _ago(seconds: object) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def _jobs_table(rows: list[dict[str, object]]) -> str:
    """The rows as a table that fits ``TABLE_WIDTH`` columns."""
    cells = []
    for row in rows:
        workers = row["workers"]
        assert isinstance(workers, dict)
        ckpt = row["checkpoint"]
        if isinstance(ckpt, dict):
            point = (
                f"s{ckpt['step']}" if ckpt["epoch"] is None else f"e{ckpt['epoch']} s{ckpt['step']}"
            )
            if ckpt["run"]:
                point = f"r{ckpt['run']} {point}"
        else:
            point = "-"
        cells.append([
            str(row["job_id"]), str(row["state"]), f"{workers['live']}/{workers['total']}",
            str(row["epoch"]), _ago(row["idle_s"]), point,
        ])  # fmt: skip
    head = ["JOB", "STATE", "LIVE/ALL", "EPOCH", "ACTIVE", "CHECKPOINT"]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    room = TABLE_WIDTH - (sum(widths[1:]) + 2 * (len(head) - 1))
    widths[0] = max(8, min(widths[0], room))
    lines = []
    for c in [head, *cells]:
        job = c[0] if len(c[0]) <= widths[0] else c[0][: widths[0] - 1] + "~"
        parts = [job.ljust(widths[0])] + [
            v.rjust(w) if i in (2, 3) else v.ljust(w)
            for i, (v, w) in enumerate(zip(c[1:], widths[1:], strict=True), start=1)
        ]
        lines.append("  ".join(parts).rstrip()[:TABLE_WIDTH])
    return "\n".join(lines)


def _jobs_rm(args: argparse.Namespace) -> int:
    client = make_client(args.redis_url)
    job_id = args.job
    Job(client, job_id)  # validates the id: a clear error (exit 2) for a bad one
    if not job_exists(client, job_id):
        return unknown_job(client, job_id, ": nothing to delete")
    (st,) = lifecycle.read_states(client, [job_id], args.heartbeat_timeout)
    if st.live and not args.force:
        print(
            f"strata: job {job_id!r} has {st.live} live worker(s) (heartbeats within "
            f"{st.heartbeat_timeout_s:g}s): refusing to delete it; stop them first, or pass "
            "--force (they then fail with StateLostError)", file=sys.stderr,
        )  # fmt: skip
        return 1
    what = f"every Redis key of job {job_id!r} ({st.state}; checkpoints in storage are kept)"
    if not args.yes:
        if not sys.stdin.isatty():
            print(f"strata: not deleting {what}: pass --yes (stdin is not a terminal to "
                  "ask on)", file=sys.stderr)  # fmt: skip
            return 1
        answer = input(f"delete {what}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("strata: nothing deleted", file=sys.stderr)
            return 1
    deleted = lifecycle.delete_job(client, job_id)
    print(f"deleted {deleted} keys of job {job_id!r}; its checkpoints in storage are kept")
    return 0


#: how often ``strata events --follow`` looks for new events
FOLLOW_S = 0.5


def events_cmd(args: argparse.Namespace) -> int:
    from .feed import Event, Feed

    client = make_client(args.redis_url)
    job = Job(client, args.job)  # the id validated
    seen = job_exists(client, job.job_id)
    if not seen:
        if not args.follow:
            return unknown_job(client, job.job_id)
        # like --watch: started before the job, it waits for it (a typo is said at Ctrl-C)
        print(f"strata: no job {job.job_id!r} in {describe(client)} yet: following it, its "
              f"events print once it starts; {plain(jobs_here(client))}", file=sys.stderr,
              flush=True)  # fmt: skip

    def show(batch: list[Event]) -> None:
        nonlocal seen
        seen = seen or bool(batch)
        for event in batch:
            print(orjson.dumps(event.doc()).decode() if args.json else plain(event.line()))
        sys.stdout.flush()

    feed = Feed(client, job.job_id)
    show(feed.newest(args.count))
    if not args.follow:
        return 0
    down_since: str | None = None
    try:  # Ctrl-C is how --follow stops
        while True:
            time.sleep(FOLLOW_S)
            try:
                batch = feed.new()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if down_since is None:  # one line per outage
                    down_since = time.strftime("%H:%M:%S")
                    print(f"Redis unreachable since {down_since}; retrying ({_text(exc)})",
                          file=sys.stderr, flush=True)  # fmt: skip
                continue
            if down_since is not None:
                print("Redis reachable again", file=sys.stderr, flush=True)
                down_since = None
            show(batch)
    except KeyboardInterrupt:
        return 0 if seen else unknown_job(client, job.job_id, " (followed; it never appeared)")


def doctor_cmd(args: argparse.Namespace) -> int:
    from strata_redis import doctor

    client = make_client(args.redis_url)
    # never the derived default: the `strata` command is no training script
    job = Job(client, args.job or os.environ.get(JOB_ENV) or doctor.PROBE_JOB)  # validated
    checks = doctor.diagnose(client, job.job_id)
    if args.json:
        doc = [{"check": c.name, "level": c.level, "detail": c.detail} for c in checks]
        print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    else:
        print(doctor.render(checks))
    return 1 if doctor.worst(checks) == "fail" else 0


def demo_cmd(args: argparse.Namespace) -> int:
    return run_demo(
        args.redis_url, workers=args.workers, job_id=args.job, checkpoint_path=args.checkpoint_path
    )


def dashboard_cmd(args: argparse.Namespace) -> int:
    import ipaddress

    if args.demo:
        from strata_redis.dashboard.demo import run_demo

        return run_demo(args.host, args.port, workers=args.workers, threads=args.threads)
    from strata_redis.dashboard.app import create_app
    from strata_redis.dashboard.serving import serve

    token = os.environ.get(TOKEN_ENV) or None
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as f:
            token = f.read().strip() or None
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback and token is None and not args.no_token:
        raise ValueError(
            f"--host {args.host} is reachable from other machines: set a token (${TOKEN_ENV} "
            "or --token-file), or pass --no-token if something else guards the port"
        )
    app = create_app(
        args.redis_url, job=args.job, token=token, heartbeat_timeout=args.heartbeat_timeout
    )
    where = redact(args.redis_url) if args.redis_url else "$STRATA_REDIS_URL or localhost"
    _warn_if_unreachable(app.config["STRATA_STATE"].client)

    def ready(url: str) -> None:
        print(f"strata dashboard: serving {url} (reading {where}; Ctrl-C stops)", flush=True)

    serve(app, args.host, args.port, threads=args.threads, ready=ready)
    return 0


def _warn_if_unreachable(client: redis.Redis) -> None:
    """One warning on stderr when Redis does not answer at start; the dashboard serves
    anyway (its page shows a banner until Redis answers)."""
    try:
        client.ping()
    except (redis.AuthenticationError, redis.exceptions.NoPermissionError) as exc:
        problem = f"refuses the credentials ({_text(exc)})"
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        problem = f"is unreachable ({_text(exc)})"
    except redis.RedisError:
        return  # it answers: what it refused the page will say
    else:
        return
    print(
        f"strata dashboard: warning: Redis at {describe(client)} {problem}; serving anyway: "
        "the page shows a banner until Redis answers",
        file=sys.stderr, flush=True,
    )  # fmt: skip


def _text(exc: BaseException) -> str:
    """One line of an exception's message, credentials redacted."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return redact(lines[0]) if "@" in lines[0] else lines[0]


def _fail(message: str, code: int) -> int:
    print(f"strata: {message}", file=sys.stderr)
    return code

"""The ``strata`` command: ``demo``, ``status``, ``jobs``, ``events``, ``doctor``, ``dashboard``
(``python -m strata_redis``)."""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import TYPE_CHECKING

import orjson
import redis
from redis.exceptions import RedisClusterException

from .checkpoint import index
from .connection import describe, make_client, redact
from .coordination import epochs, lifecycle
from .coordination.lifecycle import JobState
from .coordination.registry import list_jobs
from .dashboard.serving import PortError
from .dashboard.text import plain
from .demo import run_demo
from .identity import JOB_ENV
from .job import Job

if TYPE_CHECKING:
    from .dashboard.state import DashboardState

#: the environment variable holding the dashboard's token
TOKEN_ENV = "STRATA_DASHBOARD_TOKEN"


def _status(args: argparse.Namespace) -> int:
    from .dashboard.state import DashboardState

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
        print(_frame(state, args))
        return 0
    down_since: str | None = None
    try:  # Ctrl-C is how --watch stops: wherever it lands, a clean exit
        while True:
            try:
                text = _frame(state, args)
                down_since = None
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                # an outage is what --watch is kept open for: say so, and keep trying
                down_since = down_since or time.strftime("%H:%M:%S")
                text = f"Redis unreachable since {down_since}; retrying ({_text(exc)})"
            if sys.stdout.isatty():
                # Refresh in place: home the cursor, print, clear what the last frame left.
                sys.stdout.write("\x1b[H" + text.replace("\n", "\x1b[K\n") + "\x1b[K\n\x1b[J")
                sys.stdout.write(f"(every {args.watch:g} s; Ctrl-C stops)\x1b[K\n")
            else:  # a pipe or a file: frames one after another, no terminal codes
                sys.stdout.write(f"{text}\n\n")
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _frame(state: DashboardState, args: argparse.Namespace) -> str:
    """One read of the job(s), as JSON or as text."""
    from .dashboard.text import render

    doc = state.read(args.job, limit=args.limit)
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() if args.json else render(doc)


#: the widest a ``strata jobs`` table gets (a job id longer than fits is cut, marked ``~``)
TABLE_WIDTH = 80


def _jobs(args: argparse.Namespace) -> int:
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
    if next(lifecycle.job_keys(client, job_id), None) is None:
        print(f"strata: no key of job {job_id!r} in this Redis: nothing to delete", file=sys.stderr)
        return 1
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


def _events(args: argparse.Namespace) -> int:
    from .dashboard.feed import Event, Feed

    client = make_client(args.redis_url)
    job = Job(client, args.job)  # the id validated

    def show(batch: list[Event]) -> None:
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
        return 0


def _doctor(args: argparse.Namespace) -> int:
    from . import doctor

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


def _demo(args: argparse.Namespace) -> int:
    return run_demo(
        args.redis_url, workers=args.workers, job_id=args.job, checkpoint_path=args.checkpoint_path
    )


def _dashboard(args: argparse.Namespace) -> int:
    import ipaddress

    if args.demo:
        from .dashboard.demo import run_demo

        return run_demo(args.host, args.port, workers=args.workers, threads=args.threads)
    from .dashboard.app import create_app
    from .dashboard.serving import serve

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


def _int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an int in ``[low, high]``, else a message naming the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in {low}..{high}")
        return value

    return parse


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text} seconds: it must be above 0")
    return value


#: the shortest ``--watch`` interval: each frame is a full read of the job
WATCH_MIN_S = 0.5


def _interval(text: str) -> float:
    """An argparse type: ``--watch``'s interval, at least ``WATCH_MIN_S`` seconds."""
    value = _seconds(text)
    if value < WATCH_MIN_S:
        raise argparse.ArgumentTypeError(
            f"{text} seconds: --watch refreshes at most every {WATCH_MIN_S:g} s"
        )
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``strata`` command."""
    parser = argparse.ArgumentParser(
        prog="strata",
        description="strata_redis: coordination for distributed ML training through Redis "
        "(python -m strata_redis is the same command).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument(
        "--version", action="version", version=f"strata {metadata.version('strata-redis')}"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    redis_help = "the Redis to read; default $STRATA_REDIS_URL or redis://localhost:6379/0"

    demo = sub.add_parser(
        "demo",
        help="run a simulated training cluster (starts its own Redis)",
        description="Run a simulated training cluster of real worker processes: they train, "
        "fail, steal shards and save checkpoints, and the demo checks the results.",
    )
    demo.add_argument("--redis-url", help="use this Redis instead of a private redis-server")
    demo.add_argument(
        "--workers",
        type=int,
        default=4,
        choices=range(4, 33),
        metavar="N",
        help="worker processes (4..32, default 4)",
    )
    demo.add_argument(
        "--checkpoint-path", help="checkpoint storage (path or s3:// URL); default a temp dir"
    )
    demo.add_argument(
        "--job", default="demo", help="the job's id: new to the Redis and storage (default demo)"
    )
    demo.set_defaults(func=_demo)

    status = sub.add_parser(
        "status",
        help="print a job's state: workers, datasets, checkpoints, barrier latency",
        description="Print a job's state as the dashboard shows it: the overview (epoch, "
        "membership generation, live and failed workers), datasets with their epoch "
        "progress, the latest checkpoints, barrier latency, and the workers. Without --job, "
        "list the jobs in this Redis.",
    )
    status.add_argument("--redis-url", help=redis_help)
    status.add_argument("--job", help="job id; without it, list the jobs (or, with --json, "
                        "print every job's document)")  # fmt: skip
    status.add_argument(
        "--json", action="store_true", help="print the GET /api/dashboard document instead"
    )
    status.add_argument(
        "--watch",
        type=_interval,
        nargs="?",
        const=2.0,
        metavar="SECONDS",
        help="refresh in place every SECONDS (default 2, at least 0.5) until Ctrl-C; keeps "
        "watching through Redis outages",
    )
    status.add_argument(
        "--heartbeat-timeout",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="heartbeat timeout of a job that has none stored (jobs store their own, and it is "
        "used: live workers silent for longer read stale); default 10",
    )
    status.add_argument(
        "--limit",
        type=_int_in(1, 100_000),
        default=1000,
        metavar="N",
        help="list at most N workers (default 1000)",
    )
    status.set_defaults(func=_status)

    jobs = sub.add_parser(
        "jobs",
        help="list every job in this Redis with its state; 'jobs rm JOB' deletes one",
        description="List every job in this Redis (found by SCAN, checkpoint-only ones too): "
        "its state (running, stale, ended, lost, idle), live/all workers, epoch, last "
        "activity and newest committed checkpoint (epoch, step). 'strata jobs rm JOB --yes' "
        "deletes every Redis key of one job (never its checkpoints in storage).",
    )
    jobs.add_argument("--redis-url", help=redis_help)
    jobs.add_argument("--json", action="store_true", help="print the rows as JSON")
    timeout_help = (
        "heartbeat timeout of a job that has none stored (jobs store their own; default 10)"
    )
    jobs.add_argument(
        "--heartbeat-timeout", type=_seconds, default=10.0, metavar="SECONDS", help=timeout_help
    )
    jobs.set_defaults(func=_jobs, jobs_command=None)
    jobs_sub = jobs.add_subparsers(dest="jobs_command", metavar="ACTION")
    rm = jobs_sub.add_parser(
        "rm",
        help="delete every Redis key of a job (its checkpoints in storage are kept)",
        description="Delete every Redis key of JOB, in bounded SCAN + UNLINK steps, and "
        "nothing of any other job; its checkpoints in storage are kept (a relaunch rebuilds "
        "the index from them). Refuses a job with live workers unless --force. Without --yes "
        "it asks on a terminal, and refuses when stdin is not one. Exit 0: deleted; 1: "
        "refused (or no such job); 2: bad usage.",
    )
    rm.add_argument("job", metavar="JOB", help="the job's id")
    rm.add_argument("--yes", action="store_true", help="do not ask")
    rm.add_argument("--force", action="store_true", help="delete it even with live workers")
    rm.add_argument("--redis-url", default=argparse.SUPPRESS, help=redis_help)
    rm.add_argument(
        "--heartbeat-timeout", type=_seconds, default=argparse.SUPPRESS, metavar="SECONDS",
        help=timeout_help,
    )  # fmt: skip

    events = sub.add_parser(
        "events",
        help="a job's membership, rendezvous and checkpoint events; --follow for new ones",
        description="Print a job's newest membership (join, replace, leave, fail), rendezvous "
        "(open, close, broken, end) and checkpoint (uploaded, aborted) events in time order; "
        "with --follow, keep printing new ones as they happen (through Redis outages) until "
        "Ctrl-C.",
    )
    events.add_argument("--redis-url", help=redis_help)
    events.add_argument("--job", required=True, help="the job")
    events.add_argument(
        "--count", type=_int_in(1, 10_000), default=20, metavar="N",
        help="the newest N events first (default 20)",
    )  # fmt: skip
    events.add_argument("--follow", action="store_true", help="then print new events")
    events.add_argument("--json", action="store_true", help="one JSON object per line")
    events.set_defaults(func=_events)

    doctor = sub.add_parser(
        "doctor",
        help="check that this Redis is fit for training jobs (one line per check)",
        description="Check the Redis: its version and round trip, cluster mode, persistence "
        "(AOF/RDB), maxmemory-policy, and whether this user has the docs' worker or reader "
        "ACL rights on a job's keys (probes that touch only strata:{JOB}:doctor). One line per "
        "check: ok, warn or fail. Exit 0: nothing failed; 1: a check failed; 2: Redis "
        "unreachable or bad usage.",
    )
    doctor.add_argument("--redis-url", help=redis_help)
    doctor.add_argument(
        "--job", default=None, help="the job whose keys the rights probes use (default "
        "$STRATA_JOB_ID, else 'default'; pass your job's id when its ACL user is limited to "
        "its keys: 'strata jobs' lists them)",
    )  # fmt: skip
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.set_defaults(func=_doctor)

    dash = sub.add_parser(
        "dashboard",
        help="serve the status dashboard (web page, JSON API, Prometheus /metrics)",
        description="Serve the read-only status dashboard with waitress: the page at /, one "
        f"page per job at /job/JOB, GET /api/dashboard and /metrics. It binds 127.0.0.1 "
        f"unless told otherwise; another address needs a token (${TOKEN_ENV} or --token-file; "
        "clients send 'Authorization: Bearer TOKEN' or open /?token=TOKEN once). With --demo "
        "it starts a private Redis and a small cluster of real workers to look at.",
    )
    dash.add_argument("--redis-url", help=redis_help)
    dash.add_argument("--job", help="show only this job (default: every job in this Redis)")
    dash.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    dash.add_argument(
        "--port",
        type=_int_in(0, 65535),
        default=8050,
        help="port to bind; 0 picks a free one (default 8050)",
    )
    dash.add_argument(
        "--token-file", help=f"read the token from this file (default: ${TOKEN_ENV}, if set)"
    )
    dash.add_argument(
        "--no-token",
        action="store_true",
        help="serve a non-loopback address without a token (only behind another guard)",
    )
    dash.add_argument(
        "--heartbeat-timeout",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="heartbeat timeout of a job that has none stored (jobs store their own, and it is "
        "used: live workers silent for longer read stale); default 10",
    )
    dash.add_argument(
        "--threads", type=_int_in(1, 256), default=8, help="request threads (1..256, default 8)"
    )
    dash.add_argument(
        "--demo",
        action="store_true",
        help="start a private Redis and a small cluster of real workers, and show them",
    )
    dash.add_argument(
        "--workers",
        type=int,
        default=4,
        choices=range(3, 33),
        metavar="N",
        help="--demo worker processes (3..32, default 4)",
    )
    dash.set_defaults(func=_dashboard)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    url = getattr(args, "redis_url", None)
    env = os.environ.get("STRATA_REDIS_URL")
    if url:
        where = redact(url)
    elif env:
        where = f"{redact(env)} (from $STRATA_REDIS_URL)"
    else:
        where = "the default Redis (localhost:6379)"
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `strata status --json | head`: the reader is gone, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (redis.AuthenticationError, redis.exceptions.NoPermissionError) as exc:
        return _fail(f"permission denied by {where}: {_text(exc)}", 1)
    except redis.exceptions.MaxConnectionsError as exc:
        return _fail(_text(exc), 1)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        return _fail(f"cannot reach {where}: {_text(exc)}", 2)
    except redis.ResponseError as exc:
        if "NOPERM" in str(exc) or "NOAUTH" in str(exc) or "WRONGPASS" in str(exc):
            return _fail(f"permission denied by {where}: {_text(exc)}", 1)
        return _fail(f"{where} refused a command: {_text(exc)}", 1)
    except redis.RedisError as exc:
        return _fail(f"Redis error from {where}: {_text(exc)}", 1)
    except PortError as exc:  # `strata dashboard` on a busy port: which one, and the way out
        way_out = "; pick another with --port N, or --port 0 for a free one" if exc.in_use else ""
        return _fail(f"cannot serve the dashboard: {exc}{way_out}", 2)
    except RedisClusterException as exc:  # (not a RedisError: e.g. a plain server)
        return _fail(f"cannot use {where} as a Redis Cluster: {_text(exc)}", 2)
    except (ValueError, TypeError, OSError, LookupError) as exc:  # LookupError: unknown job
        return _fail(_text(exc), 2)


def _text(exc: BaseException) -> str:
    """One line of an exception's message, credentials redacted."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return redact(lines[0]) if "@" in lines[0] else lines[0]


def _fail(message: str, code: int) -> int:
    print(f"strata: {message}", file=sys.stderr)
    return code

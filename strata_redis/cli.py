"""The ``strata`` command: ``demo``, ``status``, ``dashboard`` (``python -m strata_redis``)."""

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

from .connection import make_client, redact
from .coordination.registry import list_jobs
from .demo import run_demo
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
    try:  # Ctrl-C is how --watch stops: wherever it lands, a clean exit
        while True:
            text = _frame(state, args)
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

    def ready(url: str) -> None:
        print(f"strata dashboard: serving {url} (reading {where}; Ctrl-C stops)", flush=True)

    serve(app, args.host, args.port, threads=args.threads, ready=ready)
    return 0


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
        type=_seconds,
        nargs="?",
        const=2.0,
        metavar="SECONDS",
        help="refresh in place every SECONDS (default 2) until Ctrl-C",
    )
    status.add_argument(
        "--heartbeat-timeout",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="the job's heartbeat timeout: live workers silent for longer are marked (default 10)",
    )
    status.add_argument(
        "--limit",
        type=_int_in(1, 100_000),
        default=1000,
        metavar="N",
        help="list at most N workers (default 1000)",
    )
    status.set_defaults(func=_status)

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
        help="the jobs' heartbeat timeout: live workers silent for longer are marked (default 10)",
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

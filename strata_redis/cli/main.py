"""The ``strata`` command's arguments and its entry point: parse, run the command, turn
every error into a one-line message and an exit code."""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from importlib import metadata

import redis
from redis.exceptions import RedisClusterException

from strata_redis.connection import redact
from strata_redis.dashboard.serving import PortError

from . import commands
from .commands import TOKEN_ENV, _fail, _text


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
    demo.set_defaults(func=commands.demo_cmd)

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
        help="refresh in place every SECONDS (default 2, at least 0.5) until Ctrl-C, fitted "
        "to the terminal's width and height; keeps watching through Redis outages, and waits "
        "for a job not there yet",
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
    status.set_defaults(func=commands.status_cmd)

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
    jobs.set_defaults(func=commands.jobs_cmd, jobs_command=None)
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
    events.set_defaults(func=commands.events_cmd)

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
    doctor.set_defaults(func=commands.doctor_cmd)

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
    dash.set_defaults(func=commands.dashboard_cmd)
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

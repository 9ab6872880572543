"""The ``strata`` command: ``demo`` and ``status`` (``python -m strata_redis`` is the same)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import redis

from .connection import make_client, redact
from .coordination.registry import list_jobs
from .demo import run_demo
from .job import Job


def _status(args: argparse.Namespace) -> int:
    client = make_client(args.redis_url)
    if args.job is None:
        jobs = list_jobs(client)
        if not jobs:
            print("no strata jobs in this Redis")
        for job_id in jobs:
            print(job_id)
        return 0
    job = Job(client, args.job)
    workers = job.workers()
    live = sum(w.last_seen_s is not None for w in workers)
    print(
        f"job {job.job_id!r}: membership generation {job.membership_generation()}, "
        f"{live} live of {len(workers)} workers"
    )
    if workers:
        print(f"{'WORKER':<24} {'STATUS':<14} {'LAST SEEN':>10}  {'HOST':<16} {'ADDRESS':<22} GPUS")
    for w in workers:
        seen = "-" if w.last_seen_s is None else f"{w.last_seen_s:.1f}s"
        print(
            f"{w.worker_id:<24} {w.status:<14} {seen:>10}  {w.host or '-':<16} "
            f"{w.address or '-':<22} {w.gpu_count}"
        )
    return 0


def _demo(args: argparse.Namespace) -> int:
    return run_demo(args.redis_url, workers=args.workers, checkpoint_path=args.checkpoint_path)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``strata`` command."""
    parser = argparse.ArgumentParser(prog="strata", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run a simulated training cluster (starts its own Redis)")
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
    demo.set_defaults(func=_demo)

    status = sub.add_parser("status", help="print a job's workers (or list the jobs)")
    status.add_argument(
        "--redis-url", help="default: $STRATA_REDIS_URL or redis://localhost:6379/0"
    )
    status.add_argument("--job", help="job id; without it, list the jobs")
    status.set_defaults(func=_status)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    url = getattr(args, "redis_url", None)
    where = redact(url) if url else "the default Redis"
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
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
    except (ValueError, TypeError, FileNotFoundError) as exc:
        return _fail(_text(exc), 2)


def _text(exc: BaseException) -> str:
    """One line of an exception's message, credentials redacted."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return redact(lines[0]) if "@" in lines[0] else lines[0]


def _fail(message: str, code: int) -> int:
    print(f"strata: {message}", file=sys.stderr)
    return code

"""Shared by the pyperf benchmarks: a ``--redis-url`` option, else a private redis-server."""

from __future__ import annotations

import argparse
import atexit
from typing import Any

import pyperf

from strata_redis.server import RedisServer


def _pass_args(cmd: list[str], args: argparse.Namespace) -> None:
    # pyperf re-runs this script in worker processes: hand them the same Redis.
    cmd.extend(["--redis-url", args.redis_url])


def make_runner(**kwargs: Any) -> pyperf.Runner:
    """A pyperf Runner with ``--redis-url``; the master starts a private server if none given."""
    runner = pyperf.Runner(add_cmdline_args=_pass_args, **kwargs)
    runner.argparser.add_argument("--redis-url", help="default: a private redis-server")
    args = runner.parse_args()
    if args.redis_url is None:
        server = RedisServer().start()
        atexit.register(server.close)
        args.redis_url = server.url
    return runner

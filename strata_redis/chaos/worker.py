"""One worker process of the fault run: the raw lease API draining each epoch of a dataset,
every grant, trained span, completion and error written to its history."""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import redis

import strata_redis

from .history import History

#: exit codes the checker reads: 0 finished, 3 stopped with a named error, 4 a bare error
FINISHED, STOPPED, CRASHED = 0, 3, 4
#: the dataset every workload drains (the run registers it)
DATASET = "ds"


def arguments(doc: str) -> argparse.ArgumentParser:
    """The arguments every workload's worker takes (the run passes them all)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--history", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--sample-s", type=float, default=0.02)
    parser.add_argument("--heartbeat-timeout", type=float, default=3.0)
    parser.add_argument("--lease-ttl", type=float, default=3.0)
    parser.add_argument("--redis-retry", type=float, default=15.0)
    return parser


def ended(history: History, work: Callable[[], None]) -> int:
    """Run a worker's ``work``; write how it ended to the history (finished, stopped by a
    named error, or crashed on a bare one) and return the exit code the checker reads."""
    history.add("start")
    try:
        work()
        history.add("finished")
        return FINISHED
    except strata_redis.StrataError as exc:
        history.add("stopped", error=type(exc).__name__, family=family(exc), message=str(exc))
        return STOPPED
    except (redis.RedisError, OSError) as exc:
        history.add(
            "crashed", error=type(exc).__name__, message=str(exc),
            where=traceback.format_exc(limit=-6).splitlines()[-14:],
        )  # fmt: skip
        return CRASHED
    finally:
        history.close()


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__).parse_args(argv)
    history = History(args.history, args.id)
    return ended(history, lambda: _drain(args, history))


def _drain(args: argparse.Namespace, history: History) -> None:
    job = strata_redis.connect(
        args.url, args.job, heartbeat_timeout=args.heartbeat_timeout,
        redis_retry=args.redis_retry,
    )  # fmt: skip
    # a relaunch under the same id takes the dead process's place by default (its pid gone)
    job.register_worker(args.id, heartbeat_interval=args.heartbeat_timeout / 4)
    for epoch in range(args.epochs):
        leases = job.leases(DATASET, epoch, args.id, ttl=args.lease_ttl)
        for lease in leases:
            history.add(
                "grant", epoch=epoch, shard=lease.shard_id, token=lease.token,
                grant=lease.grant, start=lease.start,
            )  # fmt: skip
            span = len(lease.shard) - lease.start
            time.sleep(span * args.sample_s)  # training
            history.add("trained", epoch=epoch, shard=lease.shard_id, grant=lease.grant,
                        samples=span)  # fmt: skip
            try:
                recorded = lease.complete()
            except strata_redis.LeaseLostError:
                history.add("complete", epoch=epoch, shard=lease.shard_id,
                            token=lease.token, grant=lease.grant, outcome="lost")  # fmt: skip
                continue
            history.add(
                "complete", epoch=epoch, shard=lease.shard_id, token=lease.token,
                grant=lease.grant, outcome="recorded" if recorded else "repeat",
            )  # fmt: skip
        history.add("epoch-done", epoch=epoch)


def family(exc: BaseException) -> str:
    """``state-lost`` for the StateLostError family, else ``other``."""
    return "state-lost" if isinstance(exc, strata_redis.StateLostError) else "other"


if __name__ == "__main__":
    sys.exit(main())

"""One worker process of the fault run's loop workload: the README's training loop
(``TrainingOrchestrator``, checkpoints in a local directory), every trained batch, save,
resume and error written to its history."""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import Future
from typing import Any

import strata_redis

from .history import History
from .worker import DATASET, arguments, ended

__all__ = ["main", "resumed"]


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--ckpt", required=True, help="the checkpoints' local directory")
    parser.add_argument("--min-workers", type=int, default=1)
    parser.add_argument("--save-every", type=int, default=10, help="steps between saves")
    args = parser.parse_args(argv)
    history = History(args.history, args.id)
    return ended(history, lambda: _train(args, history))


def _train(args: argparse.Namespace, history: History) -> None:
    saves: list[tuple[str, Future[Any]]] = []
    with strata_redis.TrainingOrchestrator(
        coordinator_url=args.url, worker_id=args.id, job_id=args.job,
        checkpoint_path=args.ckpt, keep_count=1000, min_workers=args.min_workers,
        last_call=1.0, batch_size=4, heartbeat_timeout=args.heartbeat_timeout,
        lease_ttl=args.lease_ttl, redis_retry=args.redis_retry, commit_timeout=60.0,
        epoch_timeout=120.0, state_provider=lambda: b"model",
    ) as orchestrator:  # fmt: skip
        resumed(orchestrator, history)
        shard_info = orchestrator.get_shards(DATASET)
        for epoch in range(orchestrator.epoch, args.epochs):
            for step, batch in enumerate(shard_info):
                time.sleep(args.sample_s * len(batch))  # training
                history.add("batch", epoch=epoch, samples=batch.tolist())
                if step % args.save_every == 0:
                    future = orchestrator.save_checkpoint(step=step, epoch=epoch)
                    if future is not None:
                        label = future.checkpoint.label  # type: ignore[attr-defined]
                        history.add("save", epoch=epoch, step=step, label=label)
                        saves.append((label, future))
            orchestrator.advance_epoch()
            history.add("epoch-done", epoch=epoch)
        orchestrator.wait_for_checkpoints(120)
    for label, future in saves:
        exc = future.exception(120)  # (a save of an earlier round may still be running)
        history.add("saved", label=label, error=None if exc is None else type(exc).__name__)


def resumed(orchestrator: strata_redis.TrainingOrchestrator, history: History) -> None:
    """Write the checkpoint the job resumed from, and its data positions, to the history."""
    info = orchestrator.resumed
    if info is not None:
        history.add(
            "resumed", label=info.label, epoch=info.epoch, step=info.step,
            positions={ds: [e, sorted(done), {str(s): n for s, n in offsets.items()}]
                       for ds, (e, done, offsets) in orchestrator.resumed_positions.items()},
        )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

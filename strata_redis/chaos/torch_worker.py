"""One worker process of the fault run's torch workload: PyTorch's guide loop
(``strata_redis.torch``: a ``LeaseBatchSampler`` under its ``DataLoader``, a model's state
saved and loaded with ``save``/``load``), one process per rank without torchrun, every
consumed batch, save, resume and error written to its history."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

import strata_redis
import strata_redis.torch as strata_torch

from .history import History
from .loop_worker import resumed
from .worker import DATASET, arguments, ended

__all__ = ["main"]


class _Ids(torch.utils.data.Dataset):  # type: ignore[misc]
    """Each sample is its own index (the history records what the model consumed)."""

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(i)


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--ckpt", required=True, help="the checkpoints' storage")
    parser.add_argument("--save-every", type=int, default=10, help="steps between saves")
    args = parser.parse_args(argv)
    history = History(args.history, args.id)
    return ended(history, lambda: _train(args, history))


def _train(args: argparse.Namespace, history: History) -> None:
    torch.set_num_threads(1)
    model = torch.nn.Linear(1, 1)
    pending: list[tuple[str, Any]] = []

    def look(wait: float = 0.0) -> None:
        # each save's outcome, seen through its future (an unseen failure would be raised by
        # the next save)
        for label, future in list(pending):
            if wait or future.done():
                exc = future.exception(wait or None)
                history.add("saved", label=label, error=None if exc is None else
                            type(exc).__name__)  # fmt: skip
                pending.remove((label, future))

    with strata_redis.TrainingOrchestrator(
        coordinator_url=args.url, worker_id=args.id, job_id=args.job,
        checkpoint_path=args.ckpt, keep_count=1000, last_call=1.0, batch_size=4,
        heartbeat_timeout=args.heartbeat_timeout, lease_ttl=args.lease_ttl,
        redis_retry=args.redis_retry, commit_timeout=60.0, epoch_timeout=120.0,
    ) as orchestrator:  # fmt: skip
        strata_torch.load(orchestrator, model=model)
        resumed(orchestrator, history)
        sampler = strata_torch.LeaseBatchSampler(orchestrator, DATASET, batch_size=4)
        loader = strata_torch.DataLoader(_Ids(), batch_sampler=sampler)
        for epoch in range(orchestrator.epoch, args.epochs):
            sampler.set_epoch(epoch)
            for step, batch in enumerate(loader):
                time.sleep(args.sample_s * len(batch))  # training
                history.add("batch", epoch=epoch, samples=batch.tolist())
                look()
                if step % args.save_every == 0:
                    future = strata_torch.save(orchestrator, step=step, epoch=epoch, model=model)
                    if future is not None and future.checkpoint is not None:
                        label = future.checkpoint.label
                        history.add("save", epoch=epoch, step=step, label=label)
                        pending.append((label, future))
            orchestrator.advance_epoch()
            history.add("epoch-done", epoch=epoch)
        look(120.0)
        orchestrator.wait_for_checkpoints(120)


if __name__ == "__main__":
    sys.exit(main())

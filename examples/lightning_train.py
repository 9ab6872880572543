"""Train a small regression model with a stock Lightning ``Trainer`` on strata, elastic under
``torchrun --rdzv-backend strata --nnodes MIN:MAX``.

Batches come from strata's fenced shard leases, checkpoints commit through strata (local or
S3) without stalling the step, and a relaunch after a lost or added node resumes mid-epoch at
the new world size with every sample trained once. Each trainer logs ``START <pid> <agent
pid> <round> <rank> <world> <resumed: run epoch step | - - ->`` to ``<log-dir>/starts.log``
and ``<round> <epoch> <step> <sample ids...>`` per step to ``<log-dir>/samples-<pid>.log``
(and ``FIRST <round> <samples read> <unix time>`` at its first step).

Run it on one machine (two nodes of one trainer; add or kill nodes at will)::

    redis-server --port 6379 &
    for node in 1 2; do
      torchrun --nnodes 1:3 --nproc-per-node 1 --rdzv-backend strata \\
        --rdzv-endpoint redis://localhost:6379/0 --rdzv-id lit --max-restarts 10 \\
        examples/lightning_train.py --redis-url redis://localhost:6379/0 \\
        --storage /tmp/lit-ckpt --log-dir /tmp/lit-logs &
    done; wait
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning
import torch

import strata_redis
import strata_redis.lightning
from strata_redis.preemption import Preempted

DATASET = "points"


class Points(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample ``i``: its id, a feature and a target (the same in every process)."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self.reads = 0  # samples read by this process (a resume re-reads none it skips)

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        self.reads += 1
        return i, torch.tensor([float(i % 10)]), torch.tensor([float(i % 7)])


class Regression(lightning.LightningModule):
    """A linear model; each step logs the sample ids it trains on."""

    def __init__(self, log: Any, round_: int, sleep: float, data: Points) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(1, 1)
        self.log_file, self.round, self.sleep, self.data = log, round_, sleep, data
        self.first = True

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        ids, x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        # the step this batch makes: the checkpoint after it is numbered so (global_step)
        step = self.trainer.global_step + 1
        if self.first:  # what the resume read before its first step (not what it skipped)
            self.log_file.write(f"FIRST {self.round} {self.data.reads} {time.time():.3f}\n")
            self.first = False
        ids_text = " ".join(map(str, ids.tolist()))
        self.log_file.write(f"{self.round} {self.current_epoch} {step} {ids_text}\n")
        time.sleep(self.sleep)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default=os.environ.get("STRATA_REDIS_URL"))
    p.add_argument("--storage", required=True, help="checkpoint storage (path or s3:// URL)")
    p.add_argument("--log-dir", required=True)
    p.add_argument("--samples", type=int, default=960)
    p.add_argument("--samples-per-shard", type=int, default=24)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--save-every", type=int, default=4, help="optimizer steps")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per step (demo, tests)")
    p.add_argument("--max-steps", type=int, default=-1, help="stop after (a relaunch resumes)")
    p.add_argument("--job", help="the job (default: <rdzv-id>-trainers; a relaunch after a "
                   "preemption passes the same with a new --rdzv-id)")  # fmt: skip
    args = p.parse_args(argv)
    if not args.redis_url:
        sys.exit("--redis-url (or STRATA_REDIS_URL) is needed")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine (set yours across hosts)
    out = Path(args.log_dir)
    out.mkdir(parents=True, exist_ok=True)
    job = args.job or os.environ.get("TORCHELASTIC_RUN_ID", "lightning-example") + "-trainers"
    strata_redis.ShardManager(args.redis_url, job_id=job).register_dataset_params(
        DATASET, args.samples, args.samples_per_shard, True, 7
    )  # the same from every trainer: a no-op after the first

    # -- the lines strata adds: the orchestrator (the round: this launch's world) ----------------
    world = int(os.environ.get("WORLD_SIZE", "1"))
    orch = strata_redis.TrainingOrchestrator(
        coordinator_url=args.redis_url, job_id=job, checkpoint_path=args.storage,
        min_workers=world, max_workers=world, last_call=0.5, heartbeat_timeout=3.0,
        elastic=False, keep_count=100, commit_timeout=30.0,
    )  # fmt: skip
    with orch:
        resumed = orch.resumed
        where = "- - -" if resumed is None else f"{resumed.run} {resumed.epoch} {resumed.step}"
        with (out / "starts.log").open("a") as f:
            f.write(f"START {os.getpid()} {os.getppid()} {orch.round.number} {orch.rank} "
                    f"{orch.world_size} {where}\n")  # fmt: skip
        log = (out / f"samples-{os.getpid()}.log").open("a", buffering=1)
        # the loader: strata's (lease-driven, lockstep batches)
        data = Points(args.samples)
        loader = strata_redis.lightning.DataLoader(data, orch, DATASET, batch_size=args.batch_size)
        trainer = lightning.Trainer(
            accelerator="cpu", max_epochs=args.epochs, max_steps=args.max_steps, logger=False,
            enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
            **strata_redis.lightning.trainer_kwargs(orch, every_n_steps=args.save_every),
        )  # fmt: skip
        model = Regression(log, orch.round.number, args.sleep, data)
        # resume where the job's newest checkpoint is (None: from the start); preempted
        # (SIGTERM), the callback saves the round's agreed step and fit raises Preempted
        # (a SystemExit: the process exits 0 once the checkpoint committed)
        try:
            trainer.fit(model, loader, ckpt_path=strata_redis.lightning.resume_path(orch))
        except Preempted as exc:
            log.write(f"PREEMPTED {exc.code} {exc.checkpoint} {exc.seconds:.2f}\n")
            raise
        log.close()
        orch.wait_for_checkpoints(60)
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

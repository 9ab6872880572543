"""Train a small regression model with Hugging Face Accelerate on strata, elastic under
``torchrun --rdzv-backend strata --nnodes MIN:MAX``.

Batches come from strata's fenced shard leases (``prepare()`` does not split them again),
``save_state``/``load_state`` commit through strata (local or S3) without stalling the step,
and a relaunch after a lost or added node resumes mid-epoch with any number of processes,
reading no trained sample again. Each trainer logs ``START <pid> <agent pid> <round> <rank>
<world> <resumed: run epoch step | - - ->`` to ``<log-dir>/starts.log`` and ``<round> <epoch>
<step> <sample ids...>`` per step to ``<log-dir>/samples-<pid>.log`` (and ``FIRST <round>
<samples read> <unix time>`` at its first step).

Run it on one machine (two nodes of one process; add or kill nodes at will)::

    redis-server --port 6379 &
    for node in 1 2; do
      torchrun --nnodes 1:3 --nproc-per-node 1 --rdzv-backend strata \\
        --rdzv-endpoint redis://localhost:6379/0 --rdzv-id acc --max-restarts 10 \\
        examples/accelerate_train.py --redis-url redis://localhost:6379/0 \\
        --storage /tmp/acc-ckpt --log-dir /tmp/acc-logs &
    done; wait
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator

import strata_redis
import strata_redis.accelerate
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
    p.add_argument("--job", help="the job (default: <rdzv-id>-trainers; a relaunch after a "
                   "preemption passes the same with a new --rdzv-id)")  # fmt: skip
    args = p.parse_args(argv)
    if not args.redis_url:
        sys.exit("--redis-url (or STRATA_REDIS_URL) is needed")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine (set yours across hosts)
    out = Path(args.log_dir)
    out.mkdir(parents=True, exist_ok=True)
    job = args.job or os.environ.get("TORCHELASTIC_RUN_ID", "accelerate-example") + "-trainers"
    strata_redis.ShardManager(args.redis_url, job_id=job).register_dataset_params(
        DATASET, args.samples, args.samples_per_shard, True, 7
    )  # the same from every process: a no-op after the first

    # -- strata: the orchestrator (the round: this launch's world), then the process group ----
    world = int(os.environ.get("WORLD_SIZE", "1"))
    orch = strata_redis.TrainingOrchestrator(
        coordinator_url=args.redis_url, job_id=job, checkpoint_path=args.storage,
        min_workers=world, max_workers=world, last_call=0.5, heartbeat_timeout=3.0,
        elastic=False, keep_count=100, commit_timeout=30.0,
    )  # fmt: skip
    with orch:
        strata_redis.accelerate.init_process_group(orch)
        accelerator = Accelerator(cpu=True)
        torch.manual_seed(0)
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        model, optimizer = accelerator.prepare(model, optimizer)  # (the loader is not prepared)
        data = Points(args.samples)
        loader = strata_redis.accelerate.DataLoader(
            data, orch, DATASET, batch_size=args.batch_size, device=accelerator.device
        )
        resumed = strata_redis.accelerate.load_state(accelerator, orch)
        step = resumed.step if resumed is not None else 0

        where = "- - -" if resumed is None else f"{resumed.run} {resumed.epoch} {resumed.step}"
        with (out / "starts.log").open("a") as f:
            f.write(f"START {os.getpid()} {os.getppid()} {orch.round.number} {orch.rank} "
                    f"{orch.world_size} {where}\n")  # fmt: skip
        log = (out / f"samples-{os.getpid()}.log").open("a", buffering=1)
        first = True
        try:
            for epoch in orch.epochs(args.epochs):
                loader.set_epoch(epoch)
                for ids, x, y in loader:
                    if first:  # what the resume read before its first step (not what it skipped)
                        log.write(f"FIRST {orch.round.number} {data.reads} {time.time():.3f}\n")
                        first = False
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                    step += 1
                    ids_text = " ".join(map(str, ids.tolist()))
                    log.write(f"{orch.round.number} {epoch} {step} {ids_text}\n")
                    # preempted (SIGTERM, forwarded by torchrun): at the step the round agrees
                    # on, save it, leave, and exit 0 through Preempted (a SystemExit)
                    if orch.should_stop(step):
                        strata_redis.accelerate.preempt_exit(
                            accelerator, orch, step=step, epoch=epoch
                        )
                    if step % args.save_every == 0:
                        strata_redis.accelerate.save_state(
                            accelerator, orch, step=step, epoch=epoch
                        )
                    time.sleep(args.sleep)
                orch.advance_epoch()
        except Preempted as exc:
            log.write(f"PREEMPTED {exc.code} {exc.checkpoint} {exc.seconds:.2f}\n")
            raise
        log.close()
        orch.wait_for_checkpoints(60)
        accelerator.end_training()  # (destroys the process group)
    return 0


if __name__ == "__main__":
    sys.exit(main())

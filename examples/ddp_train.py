"""Train a small MLP with DistributedDataParallel (gloo, CPU) on data from strata's leases.

Three worker processes rendezvous through Redis (``TrainingOrchestrator``), start
``torch.distributed`` from the round (``strata_redis.torch.init_process_group``: rank and
world size from the round, the store in Redis), draw batches from fenced shard leases
(``LeaseBatchSampler``), and checkpoint the model, the optimizer and their data position
through strata (``strata_redis.torch.save``). A relaunched job resumes from the newest
verified checkpoint, with any number of workers. Every worker logs each sample id it trains
on (``<log-dir>/<worker>.samples``: ``<round> <epoch> <step> <ids...>``) and its loss.

Run it (a private redis-server is started when no --redis-url is given)::

    python examples/ddp_train.py                        # launches 3 workers, 3 epochs
    torchrun --standalone --nproc-per-node 3 examples/ddp_train.py --redis-url redis://localhost:6379/0

Under torchrun each process is one worker (``worker-$RANK``); torchrun is only the process
launcher (its --max-restarts relaunch resumes from the last checkpoint).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel

import strata_redis
import strata_redis.torch as strata_torch

DATASET = "synthetic-regression"
FEATURES = 16


class SyntheticDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """``samples`` points of a noisy linear teacher, the same in every process (seeded)."""

    def __init__(self, samples: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal((samples, FEATURES)).astype(np.float32)
        teacher = rng.standard_normal(FEATURES).astype(np.float32)
        noise = 0.05 * rng.standard_normal(samples).astype(np.float32)
        self.y = (self.x @ teacher + noise).astype(np.float32)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, torch.from_numpy(self.x[i]), torch.tensor(self.y[i])


def model_factory() -> torch.nn.Module:
    torch.manual_seed(0)  # every rank starts from the same weights
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    )


def train(args: argparse.Namespace, worker_id: str | None) -> None:
    """One worker: rendezvous, process group, resume, train, checkpoint.

    ``worker_id`` None (under torchrun): the orchestrator derives ``<host>-rank-<RANK>``, and
    takes it back from its dead self when torchrun restarts the rank.
    """
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    strata_redis.ShardManager(args.redis_url, job_id=args.job).register_dataset_params(
        DATASET, args.samples, args.samples_per_shard, True, 42
    )  # the same parameters from every worker: a no-op after the first
    orch = strata_redis.TrainingOrchestrator(
        coordinator_url=args.redis_url, worker_id=worker_id, job_id=args.job,
        checkpoint_path=args.storage, min_workers=args.workers, last_call=1.0,
        heartbeat_timeout=args.heartbeat_timeout, elastic=False, commit_timeout=60.0,
    )  # fmt: skip
    worker_id = orch.worker_id
    with orch, contextlib.ExitStack() as stack:
        # the returned store need not be kept: strata holds it for the group's life
        strata_torch.init_process_group(orch, "gloo", timeout=args.collective_timeout)
        model = model_factory()
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        resumed = strata_torch.load(orch, model=model, optimizer=optimizer)
        ddp = DistributedDataParallel(model)
        sampler = strata_torch.LeaseBatchSampler(
            orch, DATASET, batch_size=args.batch_size, lockstep=args.lockstep
        )
        loader = strata_torch.DataLoader(
            SyntheticDataset(args.samples), batch_sampler=sampler, num_workers=args.loader_workers
        )
        samples_log = stack.enter_context(open(log_dir / f"{worker_id}.samples", "a"))
        loss_log = stack.enter_context(open(log_dir / f"{worker_id}.loss", "a"))
        print(f"{worker_id}: round {orch.round.number}, rank {orch.rank} of {orch.world_size}, "
              f"epoch {orch.epoch}, resumed from "
              f"{resumed.step if resumed else 'nothing'}", flush=True)  # fmt: skip
        for epoch in orch.epochs(args.epochs):
            sampler.set_epoch(epoch)
            step = 0
            # leases give ranks unequal batch counts (stealing): Join keeps DDP's all-reduces
            # matched for the ranks that run out first; lockstep gives every rank the same
            with Join([ddp], enable=not args.lockstep):
                for ids, x, y in loader:
                    optimizer.zero_grad()
                    loss = torch.nn.functional.mse_loss(ddp(x).squeeze(1), y)
                    loss.backward()
                    optimizer.step()
                    samples_log.write(
                        f"{orch.round.number} {epoch} {step} {' '.join(map(str, ids.tolist()))}\n"
                    )
                    samples_log.flush()
                    loss_log.write(f"{orch.round.number} {epoch} {step} {loss.item():.6f}\n")
                    loss_log.flush()
                    step += 1
                    if step % args.checkpoint_every == 0:
                        strata_torch.save(orch, step=step, epoch=epoch, model=ddp,
                                          optimizer=optimizer)  # fmt: skip
                    if args.step_sleep:
                        time.sleep(args.step_sleep)
            orch.advance_epoch()
        orch.wait_for_checkpoints(60)
        torch.distributed.destroy_process_group()
    print(f"{worker_id}: done", flush=True)


def launch(args: argparse.Namespace) -> int:
    """Start ``--workers`` worker processes (and a private redis-server without --redis-url)."""
    server = None
    if not args.redis_url:
        from strata_redis.server import RedisServer

        server = RedisServer().start()
        args.redis_url = server.url
    work = Path(tempfile.mkdtemp(prefix="strata-ddp-"))
    args.storage = args.storage or str(work / "checkpoints")
    args.log_dir = args.log_dir or str(work / "logs")
    print(f"redis {args.redis_url}, checkpoints in {args.storage}, logs in {args.log_dir}")
    try:
        procs = [
            subprocess.Popen([sys.executable, __file__, *worker_argv(args, f"worker-{i}")])
            for i in range(args.workers)
        ]
        codes = [p.wait() for p in procs]
    finally:
        if server is not None:
            server.close()
    print(f"exit codes {codes}")
    return 0 if all(c == 0 for c in codes) else 1


def worker_argv(args: argparse.Namespace, worker_id: str) -> list[str]:
    """The command-line arguments of one worker process of ``args``' job."""
    out = ["--worker-id", worker_id]
    for name, value in vars(args).items():
        if name == "worker_id" or value is None or value is False:
            continue
        flag = f"--{name.replace('_', '-')}"
        out += [flag] if value is True else [flag, str(value)]
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default=os.environ.get("STRATA_REDIS_URL"))
    p.add_argument("--job", default="ddp-example")
    p.add_argument("--storage", help="checkpoint storage (path or URL)")
    p.add_argument("--log-dir", help="where the sample and loss logs go")
    p.add_argument("--worker-id", help="run one worker (under torchrun: <host>-rank-$RANK)")
    p.add_argument("--workers", type=int, default=3, help="workers per round")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=3000)
    p.add_argument("--samples-per-shard", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps")
    p.add_argument("--loader-workers", type=int, default=0, help="DataLoader num_workers")
    p.add_argument(
        "--lockstep",
        action="store_true",
        help="every rank the same batch count (no Join; < ranks x batch dropped)",
    )
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (demo)")
    p.add_argument("--heartbeat-timeout", type=float, default=5.0)
    p.add_argument("--collective-timeout", type=float, default=60.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # one machine: gloo on loopback (set GLOO_SOCKET_IFNAME yourself across machines)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    under_torchrun = "RANK" in os.environ
    if args.worker_id is None and not under_torchrun:
        return launch(args)
    if not args.redis_url:
        sys.exit("a worker needs --redis-url (or STRATA_REDIS_URL)")
    if not args.storage or not args.log_dir:
        args.storage = args.storage or os.path.join(tempfile.gettempdir(), f"{args.job}-ckpt")
        args.log_dir = args.log_dir or os.path.join(tempfile.gettempdir(), f"{args.job}-logs")
    train(args, args.worker_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())

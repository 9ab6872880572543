"""Preemption on the raw torch path: ``torchrun --rdzv-backend strata`` gets SIGTERM (a spot
notice); its agent forwards it to both DDP trainers, which agree on a stop step, save it
through ``strata_redis.torch.save`` within the budget and exit 0; a relaunch resumes from that
checkpoint and trains each sample once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import torch  # noqa: F401  (the module needs it; skip cleanly without)

from strata_redis.checkpoint.manager import CheckpointManager

from .procs import wait_for

pytestmark = pytest.mark.torch

TORCHRUN = Path(sys.executable).parent / "torchrun"
TOTAL, PER_SHARD, BATCH = 640, 20, 4  # lockstep at world 2: 80 steps, none dropped

#: a DDP trainer (argv: out, url, job, launch): logs ``<step> <ids...>`` per step to
#: ``steps-<launch>-<rank>.log``, ``PREEMPTED <code> <checkpoint> <seconds>`` when preempted
TRAIN = (
    textwrap.dedent(
        """
    import os, sys, time
    import torch
    from torch.nn.parallel import DistributedDataParallel
    import strata_redis, strata_redis.torch as strata_torch
    from strata_redis.preemption import Preempted

    out, url, job, launch = sys.argv[1:5]
    strata_redis.ShardManager(url, job_id=job).register_dataset_params(
        "points", TOTAL, PER_SHARD, True, 7)

    class Points(torch.utils.data.Dataset):
        def __len__(self):
            return TOTAL
        def __getitem__(self, i):
            return i, torch.tensor([float(i % 10)]), torch.tensor([float(i % 7)])

    world = int(os.environ["WORLD_SIZE"])
    orch = strata_redis.TrainingOrchestrator(
        coordinator_url=url, job_id=job, checkpoint_path=os.path.join(out, "ckpt"),
        min_workers=world, max_workers=world, last_call=0.5, heartbeat_timeout=3.0,
        commit_timeout=30.0, batch_size=BATCH, preempt_budget=20.0)
    strata_torch.init_process_group(orch, "gloo", timeout=60)
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    strata_torch.load(orch, model=model, optimizer=opt)
    ddp = DistributedDataParallel(model)
    sampler = strata_torch.LeaseBatchSampler(orch, "points", lockstep=True)
    loader = strata_torch.DataLoader(Points(), batch_sampler=sampler)
    log = open(os.path.join(out, f"steps-{launch}-{orch.rank}.log"), "a", buffering=1)
    try:
        for epoch in orch.epochs(1):
            sampler.set_epoch(epoch)
            for step, (ids, x, y) in enumerate(loader):
                opt.zero_grad()
                torch.nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
                log.write(f"{step} {' '.join(map(str, ids.tolist()))}\\n")
                time.sleep(0.05)
                if orch.should_stop(step):
                    orch.preempt_exit(step, epoch, save=lambda: strata_torch.save(
                        orch, step=step, epoch=epoch, model=model, optimizer=opt))
            orch.advance_epoch()
        orch.wait_for_checkpoints(60)
        orch.close()
    except Preempted as exc:
        log.write(f"PREEMPTED {exc.code} {exc.checkpoint} {exc.seconds:.2f}\\n")
        raise
    """
    )
    .replace("TOTAL", str(TOTAL))
    .replace("PER_SHARD", str(PER_SHARD))
    .replace("BATCH", str(BATCH))
)


def _torchrun(url: str, tmp: Path, launch: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    env.pop("STRATA_JOB_ID", None)
    cmd = [
        str(TORCHRUN), "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "strata",
        "--rdzv-endpoint", url, "--rdzv-id", f"preempt-{launch}", "--rdzv-conf",
        "last_call_timeout=1,join_timeout=60", "--local-addr", "127.0.0.1",
        "--monitor-interval", "0.2", str(tmp / "train.py"), str(tmp), url, "preempt-trainers",
        str(launch),
    ]  # fmt: skip
    with (tmp / f"agent-{launch}.log").open("ab") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


def _lines(tmp: Path, launch: int) -> dict[int, list[list[str]]]:
    return {int(p.stem.rsplit("-", 1)[1]): [line.split() for line in p.read_text().splitlines()]
            for p in tmp.glob(f"steps-{launch}-*.log")}  # fmt: skip


@pytest.mark.timeout(240)
def test_sigterm_to_the_agent_saves_the_agreed_step_and_the_relaunch_trains_each_sample_once(
    redis_url: str, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    agent = _torchrun(redis_url, tmp_path, 1)

    def tail() -> str:
        return "\n".join(p.read_text()[-3000:] for p in tmp_path.glob("agent-*.log"))

    try:
        wait_for(lambda: all(len(v) >= 10 for v in _lines(tmp_path, 1).values())
                 and len(_lines(tmp_path, 1)) == 2, 120, why=tail)  # fmt: skip
        os.kill(agent.pid, signal.SIGTERM)  # the agent forwards it to every trainer
        agent.wait(60)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    first = _lines(tmp_path, 1)
    ends = {rank: lines[-1] for rank, lines in first.items()}
    # both trainers left through Preempted with code 0: the checkpoint committed in budget
    assert all(end[:2] == ["PREEMPTED", "0"] for end in ends.values()), (ends, tail())
    with CheckpointManager(tmp_path / "ckpt", job_id="preempt-trainers", redis=redis_url) as m:
        (saved,) = m.list()
    # every rank stopped at the agreed step and saved it: none trained a step after it
    assert {rank: int(lines[-2][0]) for rank, lines in first.items()} == {
        0: saved.step,
        1: saved.step,
    }
    seconds = [float(end[3]) for end in ends.values()]
    print(
        f"preemption: checkpoint step {saved.step} committed {max(seconds):.2f}s after "
        "the signal (budget 20 s)"
    )

    relaunch = _torchrun(redis_url, tmp_path, 2)
    try:
        assert relaunch.wait(180) == 0, tail()
    finally:
        if relaunch.poll() is None:
            os.killpg(relaunch.pid, signal.SIGKILL)
            relaunch.wait()
    trained: Counter[int] = Counter()
    for launch in (1, 2):
        for lines in _lines(tmp_path, launch).values():
            for line in lines:
                if line[0] != "PREEMPTED":
                    trained.update(int(i) for i in line[1:])
    assert trained == Counter(range(TOTAL))  # none lost, none twice

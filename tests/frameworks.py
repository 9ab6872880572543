"""The elastic run the Lightning and Accelerate tests share: ``torchrun --rdzv-backend strata
--nnodes 1:3`` nodes of one trainer running an example script; a node SIGKILLed mid-epoch,
then a node joining; every sample checked along the checkpoints each launch resumed from.

The scripts log ``START <pid> <agent pid> <round> <rank> <world> <run epoch step | - - ->``
to ``starts.log``, ``<round> <epoch> <step> <ids...>`` per step and ``FIRST <round> <samples
read> <unix time>`` at a launch's first step to ``samples-<pid>.log``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from strata_redis.checkpoint.manager import CheckpointManager
from strata_redis.data.position import POSITION_PART, decode_positions

from .procs import wait_for

TORCHRUN = Path(sys.executable).parent / "torchrun"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
#: ``STRATA_FRAMEWORKS_LONG=1``: the long form (more samples and epochs; minutes)
LONG = os.environ.get("STRATA_FRAMEWORKS_LONG") == "1"


@dataclass
class Shape:
    """A run's size: the default suite's, or the long form's."""

    samples: int = 480
    per_shard: int = 24
    batch: int = 4
    epochs: int = 2
    save_every: int = 3
    sleep: float = 0.03

    def args(self) -> list[str]:
        return [
            "--samples", str(self.samples), "--samples-per-shard", str(self.per_shard),
            "--batch-size", str(self.batch), "--epochs", str(self.epochs),
            "--save-every", str(self.save_every), "--sleep", str(self.sleep),
        ]  # fmt: skip


#: (the long form checkpoints every 40 steps: the examples keep 100, and the check reads
#: back every checkpoint a launch resumed from)
SHAPE = Shape(samples=4800, epochs=3, save_every=40, sleep=0.01) if LONG else Shape()


@dataclass
class Run:
    """What an elastic run left: launches, the resume chain, per-epoch sample counts."""

    worlds: dict[int, int] = field(default_factory=dict)  # round -> world size
    chain: list[tuple[int, tuple[int, int, int], int]] = field(default_factory=list)
    trained: dict[int, Counter[int]] = field(default_factory=dict)
    by_round: dict[tuple[int, int], Counter[int]] = field(default_factory=dict)  # (round, epoch)
    first_reads: dict[int, list[int]] = field(default_factory=dict)  # round -> reads
    resumed: dict[int, tuple[int, int, int] | None] = field(default_factory=dict)


def _agent(
    url: str, tmp: Path, script: Path, rdzv_id: str, log: Path, storage: str, nproc: int = 1,
    args: list[str] | None = None, env_extra: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:  # fmt: skip
    """One node: a torchrun agent of ``nproc`` trainers, in a session of its own."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore", **(env_extra or {})}  # fmt: skip
    env.pop("STRATA_JOB_ID", None)
    conf = "last_call_timeout=1,join_timeout=60,keep_alive_interval=1,keep_alive_max_attempt=3"
    cmd = [
        str(TORCHRUN), "--nnodes", "1:3", "--nproc-per-node", str(nproc), "--rdzv-backend",
        "strata", "--rdzv-endpoint", url, "--rdzv-id", rdzv_id, "--rdzv-conf", conf,
        "--local-addr", "127.0.0.1", "--max-restarts", "5", "--monitor-interval", "0.2",
        str(script), "--redis-url", url, "--storage", storage, "--log-dir", str(tmp),
        *(SHAPE.args() if args is None else args),
    ]  # fmt: skip
    with log.open("ab") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


def _starts(tmp: Path) -> list[list[str]]:
    path = tmp / "starts.log"
    return [line.split()[1:] for line in path.read_text().splitlines()] if path.exists() else []


def _lose_node(agent: subprocess.Popen[bytes], tmp: Path) -> None:
    """SIGKILL a node: its agent's process group and its trainers', at once."""
    groups = [agent.pid] + [int(s[0]) for s in _starts(tmp) if int(s[1]) == agent.pid]
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    agent.wait(10)


def elastic_run(url: str, tmp: Path, script: str, rdzv_id: str, storage: str = "") -> Run:
    """Two nodes; the second SIGKILLed after a 2-rank checkpoint; a third joining after the
    survivor's 1-rank checkpoint; both finish. Checkpoints in ``storage`` (a URL; default
    a directory of ``tmp``; for S3, ``AWS_ENDPOINT_URL`` set in this process' environment).
    Returns what the logs and checkpoints say."""
    path = EXAMPLES / script
    storage = storage or str(tmp / "ckpt")
    logs = [tmp / f"agent-{n}.log" for n in "ABC"]
    agents = [_agent(url, tmp, path, rdzv_id, logs[0], storage)]
    agents.append(_agent(url, tmp, path, rdzv_id, logs[1], storage))
    ckpt = CheckpointManager(storage, job_id=f"{rdzv_id}-trainers", redis=url)

    def tails() -> str:
        return "\n=====\n".join(p.read_text()[-3000:] for p in logs if p.exists())

    def committed(world: int) -> bool:
        if any(a.poll() is not None for a in agents):
            raise AssertionError(f"an agent exited: {tails()}")
        return any(i.world_size == world and i.epoch == 0 for i in ckpt.list())

    try:
        # bounds: framework imports and rendezvous on a loaded 2-core machine (tens of
        # seconds), far below a job that never trains or never recovers
        wait_for(lambda: committed(2), 90, step=0.05, why=tails)
        _lose_node(agents.pop(), tmp)  # after the 2-rank checkpoint, mid-epoch 0
        wait_for(lambda: committed(1), 90, step=0.05, why=tails)
        agents.append(_agent(url, tmp, path, rdzv_id, logs[2], storage))  # a node joins
        codes = [a.wait(150) for a in agents]  # 150 s: a finish vs. a hang after the growth
        assert codes == [0, 0], tails()
    finally:
        for agent in agents:
            if agent.poll() is None:
                _lose_node(agent, tmp)

    run = Run()
    for _, _, r, _, world, *where in _starts(tmp):
        run.worlds[int(r)] = int(world)
        run.resumed[int(r)] = None if where[0] == "-" else (int(where[0]), int(where[1]),
                                                            int(where[2]))  # fmt: skip
    lines = []
    for f in tmp.glob("samples-*.log"):
        for line in f.read_text().splitlines():
            parts = line.split()
            if parts[0] == "FIRST":
                run.first_reads.setdefault(int(parts[1]), []).append(int(parts[2]))
            elif parts[0] != "PREEMPTED":  # (an agent's restart stops its trainers by SIGTERM)
                lines.append(parts)
    final = max(run.resumed)
    # walk back from the last launch: what each checkpoint in the chain holds of each epoch
    run.trained = {e: Counter() for e in range(SHAPE.epochs)}
    r, upto = final, (SHAPE.epochs, 0)
    while True:
        for rr, e, s, *ids in lines:
            if int(rr) == r and (int(e), int(s)) <= upto:
                run.trained[int(e)].update(int(i) for i in ids)
                run.by_round.setdefault((r, int(e)), Counter()).update(int(i) for i in ids)
        where = run.resumed[r]
        if where is None:
            break
        rrun, epoch, step = where
        meta = decode_positions(ckpt.load(step, POSITION_PART, 0, epoch=epoch, run=rrun))[1]
        run.chain.append((r, where, int(meta["round"])))
        r, upto = int(meta["round"]), (epoch, step)
    ckpt.close()
    return run


def check(run: Run) -> None:
    """0 samples twice and none missing but the lockstep remainder; the chain went through a
    2-rank, a 1-rank and a 2-rank launch; no launch read more than two batches before its
    first step, however far into the epoch it resumed."""
    worlds = [run.worlds[c[2]] for c in run.chain]
    assert len(run.chain) >= 2 and 1 in worlds and worlds[-1] == 2, (run.chain, run.worlds)
    assert run.worlds[max(run.worlds)] == 2, run.worlds
    for epoch, counts in run.trained.items():
        twice = sorted(s for s, n in counts.items() if n > 1)
        assert not twice, f"epoch {epoch}: {len(twice)} samples trained twice ({run.chain})"
        assert set(counts) <= set(range(SHAPE.samples))
        # lockstep: the round that ends the epoch drops what is left of its share of full
        # batches, ``remaining % (world x batch)``: exactly that is missing, no more (a
        # sample counted in a checkpoint but never trained would be missing beside it)
        last = max(r for r, e in run.by_round if e == epoch)
        before = sum(len(c) for (r, e), c in run.by_round.items() if e == epoch and r != last)
        remaining = SHAPE.samples - before
        missing = SHAPE.samples - len(counts)
        dropped = remaining % (run.worlds[last] * SHAPE.batch)
        assert missing == dropped, (epoch, missing, dropped, run.chain, run.worlds)
    # a resume reads the batch it trains first and the one fetched ahead: never what it skips
    resumed_rounds = [r for r, w in run.resumed.items() if w is not None]
    assert resumed_rounds, run.resumed
    for r, reads in run.first_reads.items():
        assert all(n <= 2 * SHAPE.batch for n in reads), (r, reads)


#: what tells a script it runs under torchrun (a relaunch without it drops them)
_TORCHRUN_VARS = ("STRATA_JOB_ID", "TORCHELASTIC_RUN_ID", "WORLD_SIZE", "RANK", "LOCAL_RANK",
                  "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")  # fmt: skip


def _sample_lines(tmp: Path) -> dict[int, list[list[str]]]:
    """Each trainer's ``samples-<pid>.log`` lines, by pid."""
    return {int(f.stem.split("-")[1]): [line.split() for line in f.read_text().splitlines()]
            for f in tmp.glob("samples-*.log")}  # fmt: skip


@dataclass
class Preemption:
    """What a preempted run and its relaunch left."""

    ends: dict[int, list[str]]  # pid -> its PREEMPTED line (code, checkpoint, seconds)
    last_steps: dict[int, int]  # pid -> the last step it trained before it left
    saved: tuple[int, int]  # (epoch, step) of the newest committed checkpoint
    trained: Counter[int]  # every sample trained along the kept checkpoint, by id
    lost: int  # steps trained after the checkpoint the relaunch resumed from


def preempt_run(
    url: str, tmp: Path, script: str, job: str, env: dict[str, str] | None = None
) -> Preemption:
    """One node of two trainers trains one epoch; after a 2-rank checkpoint and a few steps
    more (mid-epoch), its torchrun agent gets SIGTERM (a spot notice: the agent forwards it
    to both trainers); then a relaunch of one trainer (the same job) finishes the epoch.
    ``env`` adds to the trainers' environment (``STRATA_PREEMPT_SIGNALS``)."""
    path, storage = EXAMPLES / script, str(tmp / "ckpt")
    shape = ["--samples", "480", "--samples-per-shard", "24", "--batch-size", "4",
             "--epochs", "1", "--save-every", "5", "--sleep", "0.05", "--job", job]  # fmt: skip
    logs = [tmp / "agent-1.log", tmp / "agent-2.log"]

    def tails() -> str:
        return "\n=====\n".join(p.read_text()[-3000:] for p in logs if p.exists())

    ckpt = CheckpointManager(storage, job_id=job, redis=url)

    def mid_epoch() -> bool:
        lines = _sample_lines(tmp)
        steps = [int(ln[2]) for lines_ in lines.values() for ln in lines_ if ln[0] != "FIRST"]
        return (
            any(i.world_size == 2 for i in ckpt.list())
            and len(lines) == 2
            and (
                max(steps, default=0) % 5 == 2  # between two checkpoints: the stop step saves
            )
        )

    agent = _agent(url, tmp, path, f"{job}-1", logs[0], storage, 2, shape, env)
    try:
        # bounds: framework imports and rendezvous on a loaded 2-core machine (tens of
        # seconds), far below a job that never trains
        wait_for(mid_epoch, 90, step=0.02, why=tails)
        os.kill(agent.pid, signal.SIGTERM)
        agent.wait(60)  # 60 s: the 25 s budget and the agent's 30 s grace before SIGKILL
    finally:
        if agent.poll() is None:
            _lose_node(agent, tmp)
    first = _sample_lines(tmp)
    ends = {pid: next((ln for ln in lines if ln[0] == "PREEMPTED"), []) for pid, lines in
            first.items()}  # fmt: skip
    last_steps = {pid: max(int(ln[2]) for ln in lines if ln[0] not in ("FIRST", "PREEMPTED"))
                  for pid, lines in first.items()}  # fmt: skip
    infos = ckpt.list()
    newest = max(infos, key=lambda i: (i.epoch, i.step))
    saved = (newest.epoch, newest.step)

    # the relaunch: one trainer without torchrun (a smaller world: a spot pool shrank;
    # and one framework import instead of three processes' on a loaded machine)
    solo = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_VARS}
    solo.update({"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
                 **(env or {})})  # fmt: skip
    cmd = [sys.executable, str(path), "--redis-url", url, "--storage", storage, "--log-dir",
           str(tmp), *shape]  # fmt: skip
    with logs[1].open("ab") as out:  # 90 s: the import and the rest of the epoch vs. a hang
        relaunch = subprocess.run(cmd, env=solo, stdout=out, stderr=subprocess.STDOUT, timeout=90)
    assert relaunch.returncode == 0, tails()
    second = {pid: lines for pid, lines in _sample_lines(tmp).items() if pid not in first}
    starts = [s for s in _starts(tmp) if int(s[0]) in second]
    assert starts and all(s[-2:] == [str(saved[0]), str(saved[1])] for s in starts), (
        starts, saved, tails())  # fmt: skip
    trained: Counter[int] = Counter()
    for lines in first.values():
        for ln in lines:
            if ln[0] not in ("FIRST", "PREEMPTED") and int(ln[2]) <= saved[1]:
                trained.update(int(i) for i in ln[3:])
    for lines in second.values():
        for ln in lines:
            if ln[0] not in ("FIRST", "PREEMPTED"):
                trained.update(int(i) for i in ln[3:])
    ckpt.close()
    return Preemption(ends, last_steps, saved, trained, max(last_steps.values()) - saved[1])

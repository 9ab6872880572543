"""``torchrun --rdzv-backend strata``: the rendezvous handler over strata's Redis rendezvous,
with real torchrun agents and gloo trainers on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
import torch  # noqa: F401  (the module needs it; skip cleanly without)
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

from strata_redis import identity
from strata_redis.checkpoint.manager import CheckpointManager
from strata_redis.coordination.rendezvous import ENDED
from strata_redis.data.position import POSITION_PART, decode_positions
from strata_redis.keys import Keys
from strata_redis.torch import rdzv

from .procs import wait_for

pytestmark = pytest.mark.torch

TORCHRUN = Path(sys.executable).parent / "torchrun"

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    out = os.path.join(sys.argv[1], f"rank{rank}.json")
    with open(out, "w") as f:
        json.dump({"RANK": os.environ["RANK"], "WORLD_SIZE": os.environ["WORLD_SIZE"],
                   "MASTER_ADDR": os.environ["MASTER_ADDR"], "rank": rank, "world": world,
                   "sum": t.item()}, f)
    dist.destroy_process_group()
    """
)


def _torchrun(
    url: str,
    job: str,
    tmp: Path,
    nnodes: int | str,
    nproc: int,
    *,
    script_text: str = SCRIPT,
    backend: str = "strata",
    conf: str = "last_call_timeout=1,join_timeout=40",
    max_restarts: int = 0,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    env = {**(os.environ if env is None else env), "GLOO_SOCKET_IFNAME": "lo",
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    script = tmp / "script.py"
    script.write_text(script_text)
    args = [
        str(TORCHRUN), "--nnodes", str(nnodes), "--nproc-per-node", str(nproc),
        "--rdzv-backend", backend, "--rdzv-endpoint", url, "--rdzv-id", job,
        "--rdzv-conf", conf, "--local-addr", "127.0.0.1", "--max-restarts", str(max_restarts),
        "--monitor-interval", "0.2", str(script), str(tmp),
    ]  # fmt: skip
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _finish(procs: list[subprocess.Popen[str]], timeout: float = 50.0) -> list[str]:
    outs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            outs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for proc, out in zip(procs, outs, strict=True):
        assert proc.returncode == 0, out[-4000:]
    return outs


def _results(tmp: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted(tmp.glob("rank*.json"))]


@pytest.mark.timeout(60)
def test_torchrun_one_node_two_procs(redis_url: str, tmp_path: Path) -> None:
    _finish([_torchrun(redis_url, "job1", tmp_path, nnodes=1, nproc=2)])
    results = _results(tmp_path)
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert {r["RANK"] for r in results} == {"0", "1"}
    assert all(r["world"] == 2 and r["WORLD_SIZE"] == "2" for r in results)
    assert all(r["sum"] == 3.0 for r in results)  # 1 + 2
    assert all(r["MASTER_ADDR"] == "127.0.0.1" for r in results)
    k = Keys("job1.agents")  # the agents' own job (identity.agents_job)
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        state = client.hgetall(k.rendezvous)
        assert state["round"] == "1" and state["state"] == "closed"
        assert state["world_size"] == "1"
        assert client.hlen(k.round_ranks(1)) == 1
        (member,) = client.hkeys(k.round_ranks(1))
        assert client.hget(k.status, member) == "left"  # the agent left at shutdown
        assert client.hget(k.rendezvous, ENDED) == "1"  # shutdown ended the rendezvous


@pytest.mark.timeout(60)
def test_torchrun_two_agents_one_round(redis_url: str, tmp_path: Path) -> None:
    procs = [_torchrun(redis_url, "job2", tmp_path, nnodes=2, nproc=1) for _ in range(2)]
    _finish(procs)
    results = _results(tmp_path)
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert all(r["world"] == 2 and r["sum"] == 3.0 for r in results)
    k = Keys("job2.agents")
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        state = client.hgetall(k.rendezvous)
        assert state["round"] == "1" and state["world_size"] == "2"
        assert client.hlen(k.round_ranks(1)) == 2


def _params(endpoint: str, **config: object) -> RendezvousParameters:
    return RendezvousParameters(
        backend="strata", endpoint=endpoint, run_id="unit", min_nodes=1, max_nodes=1, **config
    )


def test_entry_point_registers_the_creator() -> None:
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="torchrun.handlers") if e.name == "strata"]
    assert ep.load()() is rdzv.create_handler


@pytest.mark.parametrize(
    ("endpoint", "error", "match"),
    [
        ("", ValueError, "needs --rdzv-endpoint"),
        ("http://127.0.0.1:6379", ValueError, "bad --rdzv-endpoint"),
        ("127.0.0.1:99999", ValueError, "bad --rdzv-endpoint"),
        ("127.0.0.1:1", RendezvousConnectionError, "cannot reach Redis"),
    ],
)
def test_bad_endpoint_is_rejected(endpoint: str, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        rdzv.handler_creator()(_params(endpoint))


def test_torchruns_default_run_id_is_no_job(redis_url: str) -> None:
    """``--rdzv-id`` omitted: torchrun says ``none``, which every such launch would share."""
    params = RendezvousParameters(
        backend="strata", endpoint=redis_url, run_id="none", min_nodes=1, max_nodes=1
    )
    with pytest.raises(ValueError, match=r"needs --rdzv-id .*'none'"):
        rdzv.create_handler(params)


def test_handler_unit(redis_url: str) -> None:
    handler = rdzv.create_handler(_params(redis_url.removeprefix("redis://").removesuffix("/0")))
    assert handler.get_backend() == "strata" and handler.get_run_id() == "unit"
    assert re.fullmatch(rf"{re.escape(identity.host_name())}-pid-{os.getpid()}", handler.worker_id)
    assert handler.use_agent_store is False
    try:
        info = handler.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
        assert info.bootstrap_store_info.master_port > 0
        assert handler.num_nodes_waiting() == 0
        assert not handler.is_closed()
        handler.set_closed()
        assert handler.is_closed()
    finally:
        assert handler.shutdown()


def test_waiting_agent_is_seen_and_admitted(redis_url: str) -> None:
    """An agent arriving while a round runs is counted by num_nodes_waiting; when the
    running agent re-rendezvouses (leaving its round), both meet in the next round."""

    def make(worker: str) -> rdzv.StrataRendezvousHandler:
        params = RendezvousParameters(
            backend="strata", endpoint=redis_url, run_id="grow", min_nodes=1, max_nodes=2,
            last_call_timeout="0.2", join_timeout="20", worker_id=worker,
        )  # fmt: skip
        return rdzv.create_handler(params)

    a, b = make("a"), make("b")
    try:
        first = a.next_rendezvous()
        assert (first.rank, first.world_size) == (0, 1)
        got: dict[str, object] = {}
        thread = threading.Thread(target=lambda: got.update(b=b.next_rendezvous()), daemon=True)
        thread.start()
        wait_for(lambda: a.num_nodes_waiting() == 1, 10, why=a.num_nodes_waiting)
        second = a.next_rendezvous()
        thread.join(20)
        other = got["b"]
        assert isinstance(other, type(second))
        assert (second.rank, second.world_size) == (0, 2)
        assert (other.rank, other.world_size) == (1, 2)
        assert a.round is not None and a.round.number == 2
        assert second.bootstrap_store_info.master_port == other.bootstrap_store_info.master_port
        assert a.num_nodes_waiting() == 0
    finally:
        a.shutdown()
        b.shutdown()


#: a few seconds of training: every start of a trainer is a line of starts.log, so restarts
#: of the members' workers (torchrun's membership restarts do not move the restart count)
#: show as extra lines
TRAIN = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import torch.distributed as dist

    out = sys.argv[1]
    with open(os.path.join(out, "starts.log"), "a") as f:
        f.write(f"{os.environ['RANK']} {os.environ['TORCHELASTIC_RESTART_COUNT']}\\n")
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    for step in range(30):
        t += 1
        dist.all_reduce(t)
        time.sleep(0.1)
    with open(os.path.join(out, f"done{dist.get_rank()}"), "w") as f:
        f.write(str(t.item()))
    dist.destroy_process_group()
    """
)


#: how torch 2.13's torchrun ends after a spare's ``RendezvousGracefulExitError``
GRACEFUL_EXIT = "'NoneType' object has no attribute 'is_failed'"


def _spare_job(endpoint: str, backend: str, tmp: Path) -> tuple[list[str], list[int], str]:
    """``--nnodes 1:2`` with three agents started together: the trainers' starts, the
    members' exit codes and the spare's output (it is the agent still running when the
    job is done, or the one whose output never trained)."""
    conf = "last_call_timeout=10,join_timeout=60"
    procs = [
        _torchrun(endpoint, "spare", tmp, "1:2", 1, script_text=TRAIN, backend=backend,
                  conf=conf, max_restarts=3)
        for _ in range(3)
    ]  # fmt: skip
    try:
        wait_for(lambda: len(list(tmp.glob("done*"))) == 2, 80, step=0.2,
                 why=lambda: (tmp / "starts.log").read_text() if (tmp / "starts.log").exists()
                 else "no start")  # fmt: skip
        outs, codes = [], []
        deadline = time.monotonic() + 30
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
                out += "\n<killed: still waiting 30 s after the job finished>"
            outs.append(out)
            codes.append(proc.returncode)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    starts = (tmp / "starts.log").read_text().splitlines()
    return starts, codes, "\n=====\n".join(outs)


@pytest.mark.timeout(150)
def test_torchrun_spare_agent_causes_no_restart(redis_url: str, tmp_path: Path) -> None:
    """Issue 25, 1 and 6: a third agent beyond ``--nnodes 1:2`` is a spare: the members
    train once (no membership restart for an agent that cannot be admitted), finish, and
    the spare stops when the run ends (``shutdown`` ended the rendezvous; torch calls it a
    graceful exit) without ever training; as under torch's own c10d handler."""
    starts, codes, out = _spare_job(redis_url, "strata", tmp_path)
    assert sorted(starts) == ["0 0", "1 0"], out[-6000:]
    assert sorted(codes)[:2] == [0, 0], out[-6000:]
    assert "killed: still waiting" not in out, out[-6000:]
    # the spare's graceful exit (RendezvousGracefulExitError): torch 2.13's agent returns
    # None from run() then, and launch_agent fails on it: the same exit as under c10d
    assert GRACEFUL_EXIT in out, out[-6000:]
    assert "did not close" not in out  # issue 25, 6: no misleading join timeout


@pytest.mark.timeout(150)
def test_torchrun_spare_agent_under_c10d(tmp_path: Path) -> None:
    """The control: the same job under torch's c10d handler trains once (no restart), and
    its spare exits when the job is done."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    starts, codes, out = _spare_job(f"127.0.0.1:{port}", "c10d", tmp_path)
    assert sorted(starts) == ["0 0", "1 0"], out[-6000:]
    assert sorted(codes)[:2] == [0, 0], out[-6000:]
    # its spare exits too, but how depends on which agent hosted the TCPStore: here it
    # is usually a member, and the spare ends with RendezvousConnectionError when it exits
    assert "killed: still waiting" not in out, out[-6000:]


@pytest.mark.timeout(120)
def test_torchrun_agent_after_the_job_ended_does_not_train(redis_url: str, tmp_path: Path) -> None:
    """Issue 25, 3: torchrun's ``shutdown`` at the end of a run ends the rendezvous: an
    agent started later with the same ``--rdzv-id`` stops with ``RendezvousClosedError``
    and never runs the script (on main it formed round 2 and trained again)."""
    _finish([_torchrun(redis_url, "ended", tmp_path, nnodes=1, nproc=1)])
    assert [r["rank"] for r in _results(tmp_path)] == [0]
    (tmp_path / "rank0.json").unlink()
    late = _torchrun(redis_url, "ended", tmp_path, nnodes=1, nproc=1)
    out, _ = late.communicate(timeout=60)
    assert late.returncode != 0, out[-4000:]
    assert "RendezvousClosedError" in out, out[-4000:]
    assert "rendezvous of job 'ended.agents' is closed" in out, out[-4000:]
    assert _results(tmp_path) == []  # the script never ran
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        assert client.hget(Keys("ended.agents").rendezvous, "round") == "1"


# -- the trainers' default job is not the agents' (issue 36, 1) --------------------------------
#: a trainer on the default job (torchrun's run id) and the default worker id: it logs
#: ``START <rank> <restart count> <job>`` once, then ``<restart count> <ids...>`` per batch;
#: rank 1 raises once, mid-epoch, in the launch's first attempt (torchrun restarts the group)
DEFAULT_JOB_TRAIN = textwrap.dedent(
    """
    import os, sys, time
    import strata_redis

    out, world = sys.argv[1], int(os.environ["WORLD_SIZE"])
    rank, restart = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
    url = os.environ["STRATA_TEST_REDIS"]
    strata_redis.ShardManager(url).register_dataset_params("ds", 240, 20, True, 3)
    with strata_redis.TrainingOrchestrator(
        url, min_workers=world, max_workers=world, last_call=0.5, heartbeat_timeout=3.0,
        checkpoint_path=os.path.join(out, "ckpt"), batch_size=10,
    ) as orch:
        with open(os.path.join(out, "starts.log"), "a") as f:
            f.write(f"START {rank} {restart} {orch.job_id}\\n")
        log = open(os.path.join(out, f"samples-{os.getpid()}.log"), "a", buffering=1)
        shards = orch.get_shards("ds")
        for epoch in orch.epochs(1):
            for step, batch in enumerate(shards):
                if rank == "1" and restart == "0" and step == 2:
                    raise RuntimeError("rank 1 fails once")
                log.write(f"{restart} {' '.join(map(str, batch.tolist()))}\\n")
                time.sleep(0.05)
            orch.advance_epoch()
    """
)


@pytest.mark.timeout(150)
def test_trainers_on_the_default_job_finish_once_under_the_strata_backend(
    redis_url: str, tmp_path: Path
) -> None:
    """``torchrun --rdzv-backend strata`` with trainers that name no job: they take the run
    id as their job, the agents rendezvous in ``<run id>.agents``, and the run finishes once:
    rank 1 raises once, torchrun restarts the group (``--max-restarts 1``), the restarted
    trainers train the epoch through and the agent exits 0.

    Before the fix the trainers' orchestrators joined the agents' own rendezvous (both the
    job ``--rdzv-id``) and timed out there at every restart."""
    env = {**os.environ, "STRATA_TEST_REDIS": redis_url}
    env.pop("STRATA_JOB_ID", None)
    proc = _torchrun(redis_url, "trainers-default", tmp_path, 1, 2,
                     script_text=DEFAULT_JOB_TRAIN, max_restarts=1, env=env,
                     conf="last_call_timeout=1,join_timeout=40")  # fmt: skip
    (out,) = _finish([proc], timeout=120)
    starts = sorted(line.split()[1:] for line in (tmp_path / "starts.log").read_text().splitlines())
    # two trainers per attempt, both in the job --rdzv-id names, and one restart
    assert starts == [
        ["0", "0", "trainers-default"],
        ["0", "1", "trainers-default"],
        ["1", "0", "trainers-default"],
        ["1", "1", "trainers-default"],
    ], out[-4000:]
    batches = [line.split() for f in tmp_path.glob("samples-*.log")
               for line in f.read_text().splitlines()]  # fmt: skip
    # the restart trained the epoch through: each sample once (no checkpoint: from the start)
    again = Counter(int(i) for restart, *ids in batches if restart == "1" for i in ids)
    assert again == Counter(range(240)), out[-4000:]
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        agents = Keys("trainers-default.agents")
        assert client.hget(agents.rendezvous, ENDED) == "1"  # torchrun's shutdown ended it
        # the trainers' own rendezvous: a round per attempt at least
        assert int(client.hget(Keys("trainers-default").rendezvous, "round") or 0) >= 2


# -- shrink, then grow: a data position is never dropped (issue 33, 5) -------------------------
#: a DDP trainer under torchrun on strata's rendezvous: lockstep batches, DCP checkpoints
#: every ``save_every`` steps (argv: out, total, per_shard, epochs, save_every, sleep s per
#: step), in a job it names (``<--rdzv-id>-trainers``). Each trainer logs ``START <pid>
#: <agent pid> <round> <rank> <world> <resumed run epoch step>`` once, then ``<round>
#: <epoch> <step> <ids...>`` per step (``step``: the loop's, from 1, as the checkpoint after
#: it is numbered)
ELASTIC_TRAIN = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.nn.parallel import DistributedDataParallel
    import strata_redis, strata_redis.torch as strata_torch

    out, total, per_shard, epochs, save_every, sleep = sys.argv[1], *map(float, sys.argv[2:7])
    job = os.environ["TORCHELASTIC_RUN_ID"] + "-trainers"  # (a chosen id works too)
    url = os.environ["STRATA_TEST_REDIS"]
    strata_redis.ShardManager(url, job_id=job).register_dataset_params(
        "points", int(total), int(per_shard), True, 7)

    class Points(torch.utils.data.Dataset):
        def __len__(self):
            return int(total)
        def __getitem__(self, i):
            return i, torch.tensor([float(i % 10)]), torch.tensor([float(i % 7)])

    world = int(os.environ["WORLD_SIZE"])
    orch = strata_redis.TrainingOrchestrator(
        coordinator_url=url, job_id=job, checkpoint_path=os.path.join(out, "ckpt"),
        min_workers=world, max_workers=world, last_call=0.5, heartbeat_timeout=3.0,
        elastic=False, keep_count=100, commit_timeout=30.0, batch_size=4)
    with orch:
        strata_torch.init_process_group(orch, "gloo", timeout=30)
        torch.manual_seed(0)
        model = torch.nn.Linear(1, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        resumed = orch.resumed
        if resumed is not None:
            state = {"model": model.state_dict(), "optim": opt.state_dict()}
            dcp.load(state, storage_reader=strata_torch.StrataStorageReader(orch))
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
        ddp = DistributedDataParallel(model)
        sampler = strata_torch.LeaseBatchSampler(orch, "points", lockstep=True)
        loader = strata_torch.DataLoader(Points(), batch_sampler=sampler)
        r = orch.round.number
        where = "- - -" if resumed is None else f"{resumed.run} {resumed.epoch} {resumed.step}"
        log = open(os.path.join(out, f"samples-{os.getpid()}.log"), "a", buffering=1)
        with open(os.path.join(out, "starts.log"), "a") as f:
            f.write(f"START {os.getpid()} {os.getppid()} {r} {orch.rank} {world} {where}\\n")
        for epoch in range(orch.epoch, int(epochs)):
            sampler.set_epoch(epoch)
            for step, (ids, x, y) in enumerate(loader, 1):
                opt.zero_grad()
                torch.nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
                log.write(f"{r} {epoch} {step} {' '.join(map(str, ids.tolist()))}\\n")
                if step % int(save_every) == 0:
                    state = {"model": model.state_dict(), "optim": opt.state_dict()}
                    writer = strata_torch.StrataStorageWriter(orch, step=step, epoch=epoch)
                    dcp.save(state, storage_writer=writer)
                time.sleep(sleep)
            orch.advance_epoch()
        orch.wait_for_checkpoints(60)
        torch.distributed.destroy_process_group()
    """
)


def _elastic_agent(url: str, tmp: Path, log: Path, args: list[str]) -> subprocess.Popen[bytes]:
    """One node: a torchrun agent, ``--nnodes 1:2``, 2 trainers, in a session of its own."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
           "STRATA_TEST_REDIS": url}  # fmt: skip
    env.pop("STRATA_JOB_ID", None)
    conf = "last_call_timeout=1,join_timeout=60,keep_alive_interval=1,keep_alive_max_attempt=3"
    cmd = [
        str(TORCHRUN), "--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "strata",
        "--rdzv-endpoint", url, "--rdzv-id", "shrink", "--rdzv-conf", conf,
        "--local-addr", "127.0.0.1", "--max-restarts", "3", "--monitor-interval", "0.2",
        str(tmp / "train.py"), str(tmp), *args,
    ]  # fmt: skip
    with log.open("ab") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


def _starts(tmp: Path) -> list[list[str]]:
    path = tmp / "starts.log"
    return [line.split()[1:] for line in path.read_text().splitlines()] if path.exists() else []


def _lose_node(agent: subprocess.Popen[bytes], tmp: Path) -> None:
    """SIGKILL a node: its agent's process group and its trainers' (torchrun starts each in a
    session of its own), at once."""
    groups = [agent.pid] + [int(s[0]) for s in _starts(tmp) if int(s[1]) == agent.pid]
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    agent.wait(10)


@pytest.mark.slow
@pytest.mark.timeout(450)  # above the waits below (120 + 120 + 180 s): they fail first
def test_torchrun_shrink_then_grow_trains_every_sample_once(redis_url: str, tmp_path: Path) -> None:
    """Issue 33, 5: two nodes of two DDP trainers (lockstep sampler, DCP checkpoints); one
    node is SIGKILLed after a checkpoint; the survivors' trainers resume from it at world
    size 2 and checkpoint; the node is relaunched and admitted, and the 4 trainers resume
    from the survivors' checkpoint and finish. Following the checkpoints each launch resumed
    from, every sample of each epoch is trained once (lockstep: fewer than world size x
    batch dropped by the round that finishes the epoch), and every agent exits 0.

    Before the fix the survivors' checkpoints dropped the dead ranks' half-read shards,
    which the grown job then trained again from their start: 32 samples twice in epoch 0
    here (48 in the report)."""
    total, batch, epochs = 1536, 4, 2  # 64 shards of 24
    (tmp_path / "train.py").write_text(ELASTIC_TRAIN)
    args = [str(total), "24", str(epochs), "4", "0.1"]
    logs = [tmp_path / f"agent-{n}.log" for n in "ABC"]
    agents = [_elastic_agent(redis_url, tmp_path, logs[0], args)]
    time.sleep(0.5)  # (A first; the kill below takes B, whichever agent is round rank 0)
    agents.append(_elastic_agent(redis_url, tmp_path, logs[1], args))
    ckpt = CheckpointManager(tmp_path / "ckpt", job_id="shrink-trainers", redis=redis_url)

    def tails() -> str:
        return "\n=====\n".join(p.read_text()[-3000:] for p in logs if p.exists())

    def committed(world: int) -> bool:
        if any(a.poll() is not None for a in agents):
            raise AssertionError(f"an agent exited: {tails()}")
        return any(i.world_size == world and i.epoch == 0 for i in ckpt.list())

    try:
        # bounds: torch imports and two rendezvous on a loaded 2-core machine (tens of
        # seconds), far below a job that never trains or never recovers
        wait_for(lambda: committed(4), 120, step=0.05, why=tails)
        _lose_node(agents.pop(), tmp_path)  # after the 4-rank checkpoint, mid-epoch 0
        wait_for(lambda: committed(2), 120, step=0.05, why=tails)
        agents.append(_elastic_agent(redis_url, tmp_path, logs[2], args))  # relaunched
        # (the grown job's two epochs: about a minute here; 180 s separates a finish from
        # a job that hangs after the growth)
        codes = [a.wait(180) for a in agents]
        assert codes == [0, 0], tails()
    finally:
        for agent in agents:
            if agent.poll() is None:
                _lose_node(agent, tmp_path)

    # each launch (a trainer round) and the checkpoint it resumed from
    resumed: dict[int, tuple[int, int, int] | None] = {}
    for _, _, r, _, _, *where in _starts(tmp_path):
        resumed[int(r)] = None if where[0] == "-" else (int(where[0]), int(where[1]),
                                                        int(where[2]))  # fmt: skip
    lines = [
        line.split() for f in tmp_path.glob("samples-*.log") for line in f.read_text().splitlines()
    ]
    final = max(resumed)
    assert {int(s[4]) for s in _starts(tmp_path) if int(s[2]) == final} == {4}
    # walk back from the last launch: what each checkpoint in the chain holds of each epoch
    trained = {e: Counter[int]() for e in range(epochs)}
    r, upto = final, (epochs, 0)
    chain = []
    while True:
        for rr, e, s, *ids in lines:
            if int(rr) == r and (int(e), int(s)) <= upto:
                trained[int(e)].update(int(i) for i in ids)
        where = resumed[r]
        if where is None:
            break
        run, epoch, step = where
        meta = decode_positions(ckpt.load(step, POSITION_PART, 0, epoch=epoch, run=run))[1]
        chain.append((r, where, meta["round"]))
        r, upto = int(meta["round"]), (epoch, step)
    ckpt.close()
    # the grown round resumed from the survivors' checkpoint of epoch 0, and theirs from the
    # 4 ranks' (the relaunch came long before the survivors' epoch could end: about 150 steps)
    worlds = {int(s[2]): int(s[4]) for s in _starts(tmp_path)}
    assert len(chain) >= 2 and chain[0][1][1] == 0, chain
    assert [worlds[c[2]] for c in chain[:2]] == [2, 4], (chain, worlds)
    for epoch, counts in trained.items():
        twice = sorted(s for s, n in counts.items() if n > 1)
        assert not twice, f"epoch {epoch}: {len(twice)} samples trained twice ({chain})"
        assert set(counts) <= set(range(total))
        assert total - len(counts) < 4 * batch, (epoch, total - len(counts), chain)

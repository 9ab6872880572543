"""``torchrun --rdzv-backend strata``: the rendezvous handler over strata's Redis rendezvous,
with real torchrun agents and gloo trainers on loopback."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import redis
import torch  # noqa: F401  (the module needs it; skip cleanly without)
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

from strata_redis import identity
from strata_redis.coordination.rendezvous import ENDED
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
) -> subprocess.Popen[str]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
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
    k = Keys("job1")
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
    k = Keys("job2")
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
    assert "rendezvous of job 'ended' is closed" in out, out[-4000:]
    assert _results(tmp_path) == []  # the script never ran
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        assert client.hget(Keys("ended").rendezvous, "round") == "1"

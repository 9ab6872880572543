"""Node loss with Lightning and Accelerate under torchrun: the strata rendezvous handler beside
torch's c10d handler, the same training script (``examples/lightning_train.py``,
``examples/accelerate_train.py``: data and checkpoints on strata in both).

    python perf/frameworks_recovery.py [--frameworks lightning accelerate] [--repeat 1]
        [--victim second|first] [--bound 90]

``--nnodes 1:2``, one trainer per agent on CPU (gloo). Agent A starts (under c10d it hosts
the rendezvous' TCPStore), then B; once a checkpoint of both ranks committed, one node is
lost (its agent's process group and its trainer's SIGKILLed at once): B (``--victim
second``, default: c10d's store survives) or A. Measured: the seconds from the kill to the
first training step of a trainer the survivor started after it (the example's ``FIRST``
line), within ``--bound``. Both handlers with the rendezvous settings of perf/node_loss.py
(a lost agent declared dead after 3 s; c10d on torch's unshared-store path). Prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from node_loss import CONF, TORCHRUN, UNSHARED, _free_port, _listener

from strata_redis.checkpoint.manager import CheckpointManager
from strata_redis.server import RedisServer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _agent(backend: str, endpoint: str, job: str, script: Path, url: str, tmp: Path,
           log: Path) -> subprocess.Popen[bytes]:  # fmt: skip
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore"}  # fmt: skip
    if backend == "c10d" and UNSHARED:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    args = [
        str(TORCHRUN), "--nnodes", "1:2", "--nproc-per-node", "1",
        "--rdzv-backend", backend, "--rdzv-endpoint", endpoint, "--rdzv-id", job,
        "--rdzv-conf", CONF, "--local-addr", "127.0.0.1", "--max-restarts", "3",
        "--monitor-interval", "0.2", str(script), "--redis-url", url,
        "--storage", str(tmp / "ckpt"), "--log-dir", str(tmp), "--samples", "20000",
        "--save-every", "5", "--sleep", "0.05",
    ]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


def _starts(tmp: Path) -> list[list[str]]:
    path = tmp / "starts.log"
    return [line.split()[1:] for line in path.read_text().splitlines()] if path.exists() else []


def _firsts(tmp: Path) -> list[tuple[int, float]]:
    """(round, unix time) of every trainer's first step."""
    out = []
    for f in tmp.glob("samples-*.log"):
        for line in f.read_text().splitlines():
            if line.startswith("FIRST "):
                _, r, _, at = line.split()
                out.append((int(r), float(at)))
    return out


def _kill(agent: subprocess.Popen[bytes], tmp: Path) -> None:
    groups = [agent.pid] + [int(s[0]) for s in _starts(tmp) if int(s[1]) == agent.pid]
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    agent.wait(10)


def one_run(backend: str, framework: str, url: str, victim: str, bound: float) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix=f"recovery-{backend}-{framework}-"))
    job = f"{framework[:3]}-{uuid.uuid4().hex[:8]}"
    port = _free_port()
    endpoint = url if backend == "strata" else f"127.0.0.1:{port}"
    script = EXAMPLES / f"{framework}_train.py"
    logs = [tmp / f"agent-{n}.log" for n in "AB"]
    agents: list[subprocess.Popen[bytes]] = []
    result: dict[str, object] = {"backend": backend, "framework": framework, "recovered": False}
    ckpt = CheckpointManager(tmp / "ckpt", job_id=f"{job}-trainers", redis=url)
    try:
        agents.append(_agent(backend, endpoint, job, script, url, tmp, logs[0]))
        end = time.monotonic() + 120
        while backend == "c10d" and _listener(port) != agents[0].pid:  # A hosts the store
            if time.monotonic() > end:
                result["error"] = "agent A did not start the c10d store"
                return result
            time.sleep(0.2)
        agents.append(_agent(backend, endpoint, job, script, url, tmp, logs[1]))
        end = time.monotonic() + 120
        while not any(i.world_size == 2 for i in ckpt.list()):
            if time.monotonic() > end or any(a.poll() is not None for a in agents):
                result["error"] = "no 2-rank checkpoint"
                return result
            time.sleep(0.1)
        before = max((r for r, _ in _firsts(tmp)), default=0)
        lost = 1 if victim == "second" else 0
        killed = time.time()
        _kill(agents[lost], tmp)
        end = time.monotonic() + bound
        while time.monotonic() < end:
            later = [at for r, at in _firsts(tmp) if r > before and at > killed]
            if later:
                result.update(recovered=True, seconds=round(min(later) - killed, 2))
                return result
            if agents[1 - lost].poll() is not None:
                result["error"] = "the surviving agent exited"
                return result
            time.sleep(0.05)
        result["error"] = f"did not recover in {bound:g} s"
        return result
    finally:
        for agent in agents:
            if agent.poll() is None:
                _kill(agent, tmp)
        ckpt.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frameworks", nargs="+", default=["lightning", "accelerate"])
    p.add_argument("--backends", nargs="+", default=["strata", "c10d"])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--victim", choices=["first", "second"], default="second")
    p.add_argument("--bound", type=float, default=90.0)
    args = p.parse_args(argv)
    runs = []
    with RedisServer() as server:
        for _ in range(args.repeat):
            for framework in args.frameworks:
                for backend in args.backends:
                    run = one_run(backend, framework, server.url, args.victim, args.bound)
                    print(run, flush=True)
                    runs.append(run)
    print(f"\nnode loss (victim {args.victim}): seconds from the SIGKILL to the first step "
          "after the resume")  # fmt: skip
    for framework in args.frameworks:
        for backend in args.backends:
            mine = [r for r in runs if r["framework"] == framework and r["backend"] == backend]
            ok = [float(r["seconds"]) for r in mine if r["recovered"]]  # type: ignore[arg-type]
            cell = f"median {statistics.median(ok):.1f} s" if ok else "-"
            print(f"{framework:>10} {backend:>6}: {len(ok)}/{len(mine)} recovered, {cell}"
                  + (f" ({min(ok):.1f}-{max(ok):.1f})" if len(ok) > 1 else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

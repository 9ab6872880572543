"""Node loss under torchrun: the strata rendezvous handler beside torch's default c10d handler.

    python perf/node_loss.py --repeat 3 [--victim first|second|both] [--bound 60] [--results DIR]
    python perf/run.py --node-loss      # the same, --repeat 1, after the default run

The scenario of ``tests/test_torch_rdzv_upstream.py::test_a_spare_takes_a_lost_members_place``
with real torchrun agents: ``--nnodes 1:2``, one gloo trainer per agent on CPU (a tiny loop: an
``all_reduce`` and a line with a timestamp per step, 0.1 s apart). Agents A and B form the
round and train; agent C starts next and waits as a spare (the round is at max nodes). Then
one member's node is lost: its agent's process group and its trainer's (torchrun starts each
trainer in a session of its own) are SIGKILLed at once: A (``--victim
first``, the default: started first, B only once A listens, so under c10d A hosts the
rendezvous' TCPStore; ``store_host`` in the JSON says which agent did) or B
(``--victim second``). Measured per handler: whether training resumes (a step printed by a
trainer started after the kill, on a surviving agent: the survivor with the spare, or the
survivor alone, ``--nnodes`` min being 1) within ``--bound`` seconds, and the time from the
kill to that first step. Both handlers run with the same ``--rdzv-conf``
(``last_call_timeout=2,join_timeout=60,keep_alive_interval=1,keep_alive_max_attempt=3``: a
lost agent is declared dead after 3 s under c10d, 3.5 s under strata) and
``--max-restarts 3 --monitor-interval 0.2``, in the same run, alternating; c10d with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (see ``UNSHARED``: on torch's default shared-store
path its job rarely starts in this setup). Prints the table
(recovered runs, median/min/max seconds, the world size training resumed with) and writes
``<results>/node_loss.json`` (perf/results/, ignored by git); the run the docs quote is
committed as perf/baseline/node_loss.json. A run whose two members never trained counts as
not started, apart from the recoveries.

Bounded: a run waits at most 120 s for the job to start and ``--bound`` s for recovery, then
kills every agent. Needs ``strata-redis[torch]`` installed (torchrun finds the ``strata``
handler through its entry point).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

from strata_redis.server import RedisServer

HERE = Path(__file__).resolve().parent
TORCHRUN = Path(sys.executable).parent / "torchrun"
CONF = "last_call_timeout=2,join_timeout=60,keep_alive_interval=1,keep_alive_max_attempt=3"
#: c10d runs with torch's unshared-store path (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``): on the
#: default shared path, torch 2.13 publishes rank 0's bootstrap address only in a handler's
#: first round, and with agent A up before B the job often never starts (B waits for
#: ``MASTER_ADDR``, A for the role infos, 60 s, both exit): 5 of 6 runs here
UNSHARED = True
#: seconds a run waits for its two members to train before the kill
START_BOUND = 120.0

TRAIN = textwrap.dedent(
    """
    import datetime, os, sys, time
    import torch
    import torch.distributed as dist

    pid = os.getpid()
    print(f"START {time.time():.3f} {pid}", flush=True)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    world = dist.get_world_size()
    t = torch.zeros(1)
    for step in range(100_000):
        t += 1
        dist.all_reduce(t)
        print(f"STEP {step} {time.time():.3f} {world} {pid}", flush=True)
        time.sleep(0.1)
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _agent(
    backend: str, endpoint: str, job: str, script: Path, log: Path
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    if backend == "c10d" and UNSHARED:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    args = [
        str(TORCHRUN), "--nnodes", "1:2", "--nproc-per-node", "1",
        "--rdzv-backend", backend, "--rdzv-endpoint", endpoint, "--rdzv-id", job,
        "--rdzv-conf", CONF, "--local-addr", "127.0.0.1", "--max-restarts", "3",
        "--monitor-interval", "0.2", str(script),
    ]  # fmt: skip
    with log.open("wb") as out:  # a process group of its own: the kill takes its trainer too
        return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


def _lines(log: Path, kind: str) -> list[list[str]]:
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [line.split()[1:] for line in text.splitlines() if line.startswith(kind + " ")]


def _steps(log: Path) -> int:
    return len(_lines(log, "STEP"))


def _listener(port: int) -> int | None:
    """The pid listening on ``port`` on this host (``ss``), if any."""
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True)
    found = re.search(r"pid=(\d+)", out.stdout)
    return int(found.group(1)) if found else None


def _errors(log: Path) -> list[str]:
    text = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return [line for line in text if "Error" in line][-3:]


def _is_trainer(pid: int, log: Path) -> bool:
    """Whether ``pid`` is still one of this run's trainers (not a pid reused since)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(log.parent / "train.py").encode() in cmdline


def _kill(proc: subprocess.Popen[bytes], log: Path) -> None:
    """SIGKILL an agent's process group and its trainers' (torchrun starts each trainer in
    a session of its own: killing the agent's group alone leaves them running), all at once:
    the node is lost."""
    groups = [proc.pid] + [
        pid for pid in (int(start[1]) for start in _lines(log, "START")) if _is_trainer(pid, log)
    ]
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    proc.wait(10)


def one_run(backend: str, redis_url: str, victim: str, bound: float, tmp: Path) -> dict[str, Any]:
    """One job on ``backend``: two members, a spare, a member killed; the recovery seen."""
    port = _free_port()
    endpoint = redis_url if backend == "strata" else f"127.0.0.1:{port}"
    job = f"nodeloss-{uuid.uuid4().hex[:8]}"
    script = tmp / "train.py"
    script.write_text(TRAIN)
    logs = [tmp / f"{backend}-{job}-{name}.log" for name in "ABC"]
    procs: list[subprocess.Popen[bytes]] = []
    result: dict[str, Any] = {"backend": backend, "victim": victim, "recovered": False}
    try:
        procs.append(_agent(backend, endpoint, job, script, logs[0]))
        time.sleep(1.0)
        end = time.monotonic() + START_BOUND
        while backend == "c10d" and _listener(port) != procs[0].pid:  # A hosts the TCPStore
            if time.monotonic() > end or procs[0].poll() is not None:
                result.update(started=False, error="agent A did not start the c10d store")
                return result
            time.sleep(0.2)
        procs.append(_agent(backend, endpoint, job, script, logs[1]))
        end = time.monotonic() + START_BOUND
        while min(_steps(logs[0]), _steps(logs[1])) < 5:
            if time.monotonic() > end or any(p.poll() is not None for p in procs):
                result.update(started=False, error="the two members did not train")
                result["last_errors"] = {"AB"[i]: _errors(logs[i]) for i in (0, 1)}
                return result
            time.sleep(0.2)
        procs.append(_agent(backend, endpoint, job, script, logs[2]))
        time.sleep(6.0)  # the spare starts (imports torch) and waits, uncounted
        if _steps(logs[2]):
            result.update(started=False, error="the spare trained before the loss")
            return result
        lost, kept = (0, [1, 2]) if victim == "first" else (1, [0, 2])
        if backend == "c10d":  # which agent hosts the rendezvous' TCPStore (it binds first)
            host = _listener(port)
            pids = [p.pid for p in procs]
            result["store_host"] = "ABC"[pids.index(host)] if host in pids else None
        killed = time.time()
        _kill(procs[lost], logs[lost])
        end = time.monotonic() + bound
        while time.monotonic() < end:
            fresh = {  # trainers started after the kill, on a surviving agent
                start[1] for i in kept for start in _lines(logs[i], "START")
                if float(start[0]) > killed
            }  # fmt: skip
            steps = [
                (float(s[1]), int(s[2])) for i in kept for s in _lines(logs[i], "STEP")
                if s[3] in fresh
            ]  # fmt: skip
            if steps:
                at, world = min(steps)
                result.update(recovered=True, seconds=round(at - killed, 3), world=world)
                return result
            if all(procs[i].poll() is not None for i in kept):
                result["error"] = f"every surviving agent exited within {bound:g} s"
                break
            time.sleep(0.1)
        result.setdefault("error", f"did not recover in {bound:g} s")
        tails = {"ABC"[i]: _errors(logs[i]) for i in kept}
        result["last_errors"] = tails
        causes = sorted({lines[-1].split(": ")[0].rsplit(".", 1)[-1]
                         for lines in tails.values() if lines})  # fmt: skip
        if causes:  # the exception class the surviving agents ended with
            result["error"] += f" ({', '.join(causes)})"
        return result
    finally:
        for proc, log in zip(procs, logs, strict=False):
            _kill(proc, log)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs of one handler and one victim: how many started (the two members trained),
    recovered, and the recovery times."""
    started = [r for r in runs if r.get("started", True)]
    times = [r["seconds"] for r in started if r["recovered"]]
    row: dict[str, Any] = {"runs": len(runs), "started": len(started), "recovered": len(times)}
    if times:
        row.update(median=statistics.median(times), min=min(times), max=max(times))
        row["world"] = sorted({r["world"] for r in started if r["recovered"]})
    row["failures"] = sorted({r.get("error", "") for r in runs if not r["recovered"]})
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per handler (default 3)")
    parser.add_argument("--victim", choices=["first", "second", "both"], default="both")
    parser.add_argument("--bound", type=float, default=60.0, help="s to wait for recovery")
    parser.add_argument("--backends", default="strata,c10d")
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--redis-url", help="default: a private redis-server")
    args = parser.parse_args(argv)
    if not 1 <= args.repeat <= 50:
        parser.error(f"--repeat must be in 1..50, got {args.repeat}")
    if not 10 <= args.bound <= 600:
        parser.error(f"--bound must be in 10..600 s, got {args.bound}")
    backends = [b for b in args.backends.split(",") if b]
    victims = ["first", "second"] if args.victim == "both" else [args.victim]
    args.results.mkdir(parents=True, exist_ok=True)
    server = None if args.redis_url else RedisServer().start()
    url = args.redis_url or server.url  # type: ignore[union-attr]
    runs: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="node-loss-") as tmp:
            for n in range(args.repeat):
                for victim in victims:
                    for backend in backends:
                        run = one_run(backend, url, victim, args.bound, Path(tmp))
                        runs.append(run)
                        print(f"run {n + 1} {backend}: {json.dumps(run)}", flush=True)
    finally:
        if server is not None:
            server.close()
    table = {
        f"{backend} {victim}": summary(
            [r for r in runs if r["backend"] == backend and r["victim"] == victim]
        )
        for victim in victims
        for backend in backends
    }
    print(f"\nnode loss, --nnodes 1:2 + a spare, {args.repeat} runs each:")
    print(
        f"{'handler, lost':<14} {'recovered':>12} {'median s':>9} {'min s':>7} {'max s':>7}  world"
    )
    for name, row in table.items():
        line = f"{name:<14} {row['recovered']:>3} of {row['started']} started"
        if row["recovered"]:
            line += f" {row['median']:>7.2f} {row['min']:>7.2f} {row['max']:>7.2f}  {row['world']}"
        if row["failures"]:
            line += f"  not recovered: {'; '.join(row['failures'])}"
        print(line)
    doc = {"conf": CONF, "c10d_unshared_store": UNSHARED, "bound": args.bound, "runs": runs,
           "summary": table}  # fmt: skip
    (args.results / "node_loss.json").write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

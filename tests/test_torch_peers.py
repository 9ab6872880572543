"""A dead peer never hangs the survivors: 3 torchrun agents (one trainer each, gloo) in an
all_reduce loop; one agent is SIGKILLed and its trainer SIGSTOPped (a trainer killed on the same
host closes its sockets and gloo fails at once: a frozen process or a vanished machine is what
hangs a collective); the survivors' peer watch ends their
blocked collective within the heartbeat timeout + 5 s (gloo's timeout is set to 300 s), and
torchrun restarts them without the dead member."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch  # noqa: F401  (the module needs it; skip cleanly without)

from .procs import Output, wait_for

pytestmark = pytest.mark.torch

TORCHRUN = Path(sys.executable).parent / "torchrun"
HEARTBEAT_TIMEOUT = 2.0

SCRIPT = textwrap.dedent(
    """
    import os, sys, time, logging
    import torch, torch.distributed as dist
    import strata_redis, strata_redis.torch

    out, url = sys.argv[1], sys.argv[2]
    # the first group (3) or the restarted one (2): not TORCHELASTIC_RESTART_COUNT, which an
    # agent that restarts for the others' new round (not its trainer's failure) leaves at 0
    phase = "0" if os.environ["WORLD_SIZE"] == "3" else "1"
    logging.basicConfig(
        filename=os.path.join(out, f"log-{phase}-{os.environ['RANK']}"), level=logging.INFO,
        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    orch = strata_redis.TrainingOrchestrator(
        url, job_id="trainers", min_workers=int(os.environ["WORLD_SIZE"]), last_call=1.0,
        heartbeat_timeout=HEARTBEAT, checkpoint_path=os.path.join(out, "ckpt"),
    )
    strata_redis.torch.init_process_group(orch, "gloo", timeout=300)
    with open(os.path.join(out, f"started-{phase}-{os.environ['GROUP_RANK']}"), "w") as f:
        f.write(f"{os.getpid()} {os.getppid()}")
    if phase != "0":
        orch.close(end=False)
        sys.exit(0)
    t = torch.ones(1)
    while True:  # the survivors block here once a peer is gone
        dist.all_reduce(t)
        time.sleep(0.05)
    """
)


def _agent(url: str, job: str, tmp: Path, index: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    script = tmp / "script.py"
    script.write_text(SCRIPT.replace("HEARTBEAT", repr(HEARTBEAT_TIMEOUT)))
    args = [
        str(TORCHRUN), "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "strata",
        "--rdzv-endpoint", url, "--rdzv-id", job, "--rdzv-conf",
        f"last_call_timeout=1,join_timeout=60,keep_alive_interval=0.5,"
        f"keep_alive_max_attempt=4,worker_id=agent{index}",
        "--local-addr", "127.0.0.1", "--max-restarts", "1", "--monitor-interval", "0.2",
        str(script), str(tmp), url,
    ]  # fmt: skip
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )


def _gone(pid: int) -> bool:
    """Whether process ``pid`` (another's child) has exited: no such process, or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _story(tmp: Path, outs: list[Output]) -> str:
    """What the agents printed and the trainers logged, for a failure's message."""
    agents = [f"agent {i}: {out.text()[-1500:]}" for i, out in enumerate(outs)]
    logs = [f"{p.name}: {p.read_text()[-1500:]}" for p in sorted(tmp.glob("log-*"))]
    return "\n".join([*agents, *logs, str(sorted(p.name for p in tmp.iterdir()))])


@pytest.mark.timeout(150)
def test_a_killed_peer_never_hangs_the_survivors(redis_url: str, tmp_path: Path) -> None:
    procs = [_agent(redis_url, "peers", tmp_path, i) for i in range(3)]
    outs = [Output(p.stdout.read1) for p in procs]  # type: ignore[union-attr]
    try:
        wait_for(lambda: len(list(tmp_path.glob("started-0-*"))) == 3, 90,
                 why=lambda: outs[0].text()[-3000:])  # fmt: skip
        time.sleep(1.0)  # the ranks are in their all_reduce loop
        # A node lost, as a machine that vanishes: its agent killed, its trainer frozen
        # (SIGSTOP: its sockets stay open, so gloo sees no reset and waits; a SIGKILLed
        # trainer's sockets close and gloo fails at once by itself). torchrun starts trainers
        # in sessions of their own: the agent's process group is the agent alone.
        started = [p.read_text().split() for p in tmp_path.glob("started-0-*")]
        (trainer,) = [int(pid) for pid, agent in started if int(agent) == procs[2].pid]
        os.kill(trainer, signal.SIGSTOP)
        os.killpg(procs[2].pid, signal.SIGKILL)
        killed = time.monotonic()

        survivors = [int(pid) for pid, agent in started if int(agent) != procs[2].pid]

        def ended() -> int:
            return sum(_gone(pid) for pid in survivors)

        # The bound separates the peer watch (the heartbeat timeout, then an exit) from
        # gloo's own timeout (300 s here, 30 min by default): without the watch the survivors
        # stay in all_reduce until then. A survivor whose watch fires first aborts its group
        # and exits; the other's all_reduce may then fail on the closed sockets before its
        # own watch fires (under load): either way it ends, which is what is asserted, and
        # at least one watch said it ended the group.
        took = wait_for(lambda: ended() == 2, HEARTBEAT_TIMEOUT + 5.0,
                        why=lambda: sorted(p.name for p in tmp_path.iterdir()))  # fmt: skip
        marker = "ending this rank's process group"
        assert any(marker in p.read_text() for p in tmp_path.glob("log-0-*"))
        # then torchrun restarts them without the dead member (a new round of 2)
        wait_for(lambda: len(list(tmp_path.glob("started-1-*"))) == 2, 90,
                 why=lambda: _story(tmp_path, outs))  # fmt: skip
        for proc in procs[:2]:
            assert proc.wait(60) == 0, outs[0].text()[-3000:]
        print(
            f"survivors interrupted {took:.1f}s after the kill "
            f"(restarted by {time.monotonic() - killed:.1f}s)"
        )
    finally:
        with contextlib.suppress(NameError, ProcessLookupError):
            os.kill(trainer, signal.SIGKILL)
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for proc, out in zip(procs, outs, strict=True):
            out.join(10)
            assert proc.stdout is not None
            proc.stdout.close()

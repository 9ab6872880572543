"""``strata_redis.lightning``: a stock Lightning ``Trainer`` under ``torchrun --rdzv-backend
strata``, a node lost and a node joining, every sample trained once along the checkpoints
(``examples/lightning_train.py``, the script docs/guides/lightning.md shows).

The long form (more samples, three epochs, and a stop at ``max_steps`` resumed from S3):
``STRATA_FRAMEWORKS_LONG=1 pytest tests/test_lightning.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import boto3
import pytest

pytest.importorskip("lightning")

from .frameworks import EXAMPLES, LONG, check, elastic_run, preempt_run

pytestmark = pytest.mark.torch


@pytest.mark.timeout(400)  # above elastic_run's waits (90 + 90 + 150 s): they fail first
def test_lightning_node_lost_and_joined_trains_every_sample_once(
    redis_url: str, s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints on S3 (the Accelerate test keeps them in a directory). Two nodes train
    from leases; one is SIGKILLed mid-epoch after a checkpoint; the
    survivor's Trainer resumes from it at world size 1 (model, optimizer, loops through the
    ``StrataCheckpointIO``; the data position through the orchestrator) and checkpoints; a
    node joins, and both resume at world size 2 and finish. Following the checkpoints each
    launch resumed from, no sample is trained twice, none is missing beyond the lockstep
    remainder, and no launch read more than two batches before its first step."""
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="ckpt")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # (the agents inherit it)
    check(elastic_run(redis_url, tmp_path, "lightning_train.py", "lit", "s3://ckpt/lit"))


@pytest.mark.timeout(240)  # above preempt_run's waits (90 + 60 + 90 s): they fail first
def test_lightning_sigterm_saves_the_agreed_step_and_the_relaunch_trains_each_sample_once(
    redis_url: str, tmp_path: Path, job_id: str
) -> None:
    """SIGTERM to the torchrun agent of two trainers mid-epoch (between two periodic
    checkpoints): Lightning's own SIGTERM handling is set aside, the ``StrataCallback``
    saves the round's agreed stop step; both trainers leave ``trainer.fit`` through
    ``Preempted`` with code 0 (committed within the budget) after the same step, the one
    the checkpoint holds (no step lost); a relaunch of one trainer (world 1) resumes from
    it and every sample of the epoch is trained exactly once. It fails with
    ``STRATA_PREEMPT_SIGNALS=""`` (Lightning's handling alone), and with Lightning's handler
    left in place: no PREEMPTED line, the run ends two steps past the last checkpoint."""
    run = preempt_run(redis_url, tmp_path, "lightning_train.py", job_id)
    assert len(run.ends) == 2 and all(e[:2] == ["PREEMPTED", "0"] for e in run.ends.values()), (
        run.ends)  # fmt: skip
    assert set(run.last_steps.values()) == {run.saved[1]}, (run.last_steps, run.saved)
    assert run.lost == 0  # the agreed step is the one saved: not even one step lost
    assert run.trained == Counter(range(480))
    print(
        "lightning preemption: checkpoint",
        run.saved,
        "committed",
        max(float(e[3]) for e in run.ends.values()),
        "s after SIGTERM (budget 25 s)",
    )


@pytest.mark.skipif(not LONG, reason="the long form: STRATA_FRAMEWORKS_LONG=1")
@pytest.mark.timeout(240)  # above the two runs' 90 s each: they fail first
def test_lightning_checkpoints_on_s3_and_resumes_mid_epoch(
    redis_url: str, s3_endpoint: str, tmp_path: Path
) -> None:
    """One trainer (no torchrun) stops mid-epoch 0 (``--max-steps 10``, checkpoints every
    4 steps on S3); relaunched, it resumes from the S3 checkpoint of step 8 (Lightning's
    ``global_step`` 8, the data position after the 8th batch) and finishes the two epochs:
    every sample once per epoch from the kept checkpoint on (batch 4 divides 480: none
    dropped)."""
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="ckpt")
    env = {**os.environ, "AWS_ENDPOINT_URL": s3_endpoint, "GLOO_SOCKET_IFNAME": "lo",
           "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}  # fmt: skip
    for var in ("STRATA_JOB_ID", "TORCHELASTIC_RUN_ID", "WORLD_SIZE", "RANK", "LOCAL_RANK"):
        env.pop(var, None)
    cmd = [sys.executable, str(EXAMPLES / "lightning_train.py"), "--redis-url", redis_url,
           "--storage", "s3://ckpt/lit", "--log-dir", str(tmp_path), "--samples", "480",
           "--save-every", "4"]  # fmt: skip
    for extra in (["--max-steps", "10"], []):
        run = subprocess.run(cmd + extra, env=env, capture_output=True, text=True, timeout=90)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    starts = [line.split()[3:] for line in (tmp_path / "starts.log").read_text().splitlines()]
    assert [s[-3:] for s in starts] == [["-", "-", "-"], ["0", "0", "8"]], starts
    first, second = (int(s[0]) for s in starts)  # the two launches' rounds
    trained: dict[int, Counter[int]] = {0: Counter(), 1: Counter()}
    for f in tmp_path.glob("samples-*.log"):
        for r, e, s, *ids in (line.split() for line in f.read_text().splitlines()):
            if r != "FIRST" and (int(r) == second or (int(r) == first and int(s) <= 8)):
                trained[int(e)].update(int(i) for i in ids)
    for epoch, counts in trained.items():
        assert sorted(counts) == list(range(480)), epoch
        assert set(counts.values()) == {1}, epoch

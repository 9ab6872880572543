"""``strata_redis.accelerate``: an Accelerate loop under ``torchrun --rdzv-backend strata``,
a node lost and a node joining, every sample trained once along the checkpoints
(``examples/accelerate_train.py``, the script docs/guides/accelerate.md shows).

The long form (more samples, three epochs): ``STRATA_FRAMEWORKS_LONG=1 pytest
tests/test_accelerate.py``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("accelerate")

from .frameworks import check, elastic_run, preempt_run

pytestmark = pytest.mark.torch


@pytest.mark.timeout(400)  # above elastic_run's waits (90 + 90 + 150 s): they fail first
def test_accelerate_node_lost_and_joined_trains_every_sample_once(
    redis_url: str, tmp_path: Path
) -> None:
    """Two nodes train from leases (the loader passed through ``prepare()``: no second
    split); one is SIGKILLed mid-epoch after a checkpoint; the survivor resumes from it with
    one process (``load_state`` through strata) and checkpoints; a node joins, and both
    resume with two processes and finish. Following the checkpoints each launch resumed
    from, no sample is trained twice, none is missing beyond the lockstep remainder, and no
    launch read more than two batches before its first step (it skips nothing by reading)."""
    check(elastic_run(redis_url, tmp_path, "accelerate_train.py", "acc"))


@pytest.mark.timeout(240)  # above preempt_run's waits (90 + 60 + 90 s): they fail first
def test_accelerate_sigterm_saves_the_agreed_step_and_the_relaunch_trains_each_sample_once(
    redis_url: str, tmp_path: Path, job_id: str
) -> None:
    """SIGTERM to the torchrun agent of two processes mid-epoch (between two periodic
    checkpoints): the loop's ``orch.should_stop(step)`` turns True at the round's agreed step
    and ``strata_redis.accelerate.preempt_exit`` saves it; both processes leave through
    ``Preempted`` with code 0 after the same step, the one the checkpoint holds; a relaunch of
    one process (world 1) resumes from it and every sample of the epoch is trained exactly
    once. With ``STRATA_PREEMPT_SIGNALS=""`` it fails (SIGTERM kills the processes: no
    PREEMPTED line, the steps after the last checkpoint lost)."""
    run = preempt_run(redis_url, tmp_path, "accelerate_train.py", job_id)
    assert len(run.ends) == 2 and all(e[:2] == ["PREEMPTED", "0"] for e in run.ends.values()), (
        run.ends
    )
    assert set(run.last_steps.values()) == {run.saved[1]}, (run.last_steps, run.saved)
    assert run.lost == 0  # the agreed step is the one saved: not even one step lost
    assert run.trained == Counter(range(480))
    print("accelerate preemption: checkpoint", run.saved, "committed",
          max(float(e[3]) for e in run.ends.values()), "s after SIGTERM (budget 25 s)")  # fmt: skip

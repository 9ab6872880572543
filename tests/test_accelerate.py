"""``strata_redis.accelerate``: an Accelerate loop under ``torchrun --rdzv-backend strata``,
a node lost and a node joining, every sample trained once along the checkpoints
(``examples/accelerate_train.py``, the script docs/guides/accelerate.md shows).

The long form (more samples, three epochs): ``STRATA_FRAMEWORKS_LONG=1 pytest
tests/test_accelerate.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("accelerate")

from .frameworks import check, elastic_run

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

"""``strata_redis.lightning``: a stock Lightning ``Trainer`` under ``torchrun --rdzv-backend
strata``, a node lost and a node joining, every sample trained once along the checkpoints
(``examples/lightning_train.py``, the script docs/guides/lightning.md shows).

The long form (more samples, three epochs): ``STRATA_FRAMEWORKS_LONG=1 pytest
tests/test_lightning.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lightning")

from .frameworks import check, elastic_run

pytestmark = pytest.mark.torch


@pytest.mark.timeout(400)  # above elastic_run's waits (90 + 90 + 150 s): they fail first
def test_lightning_node_lost_and_joined_trains_every_sample_once(
    redis_url: str, tmp_path: Path
) -> None:
    """Two nodes train from leases; one is SIGKILLed mid-epoch after a checkpoint; the
    survivor's Trainer resumes from it at world size 1 (model, optimizer, loops through the
    ``StrataCheckpointIO``; the data position through the orchestrator) and checkpoints; a
    node joins, and both resume at world size 2 and finish. Following the checkpoints each
    launch resumed from, no sample is trained twice, none is missing beyond the lockstep
    remainder, and no launch read more than two batches before its first step."""
    check(elastic_run(redis_url, tmp_path, "lightning_train.py", "lit"))

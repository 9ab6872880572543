"""Lockstep walks: every member of a round gets the same number of full batches per epoch,
with uneven shards and a slow member, fewer than world_size x batch_size samples dropped and
none twice — in real worker processes."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest

import strata_redis

from .procs import join_all, spawn

JOB = "lockstep"
TOTAL, PER_SHARD, BATCH, WORKERS = 1003, 70, 16, 3  # 15 shards, the last one of 23


def _worker(url: str, worker_id: str, out: str, delay: float, drop_last: bool) -> None:
    with strata_redis.TrainingOrchestrator(
        url, worker_id, job_id=JOB, checkpoint_path=str(Path(out).parent / "ckpt"),
        min_workers=WORKERS, last_call=0.3, heartbeat_timeout=5.0, epoch_timeout=60.0,
    ) as orch:  # fmt: skip
        stream = orch.get_shards("d", BATCH, lockstep=True, drop_last=drop_last)
        epochs = []
        for _ in range(orch.epoch, 2):
            batches = []
            for batch in stream:
                batches.append(batch.tolist())
                time.sleep(delay)  # a slow member: the others take more of the pool
            epochs.append({"batches": batches, "quota": stream.quota})
            orch.advance_epoch()
        Path(out).write_text(json.dumps(epochs))


@pytest.mark.slow
@pytest.mark.parametrize("drop_last", [True, False])
def test_every_member_gets_the_same_batches(
    redis_url: str, tmp_path: Path, drop_last: bool
) -> None:
    strata_redis.ShardManager(redis_url, job_id=JOB).register_dataset_params(
        "d", TOTAL, PER_SHARD, True, 5
    )
    outs = [tmp_path / f"w{i}.json" for i in range(WORKERS)]
    procs = [spawn(_worker, redis_url, f"w{i}", str(outs[i]), 0.05 if i == 0 else 0.0,
                   drop_last) for i in range(WORKERS)]  # fmt: skip
    assert join_all(procs, timeout=120) == [0] * WORKERS  # nobody waits forever
    runs = [json.loads(p.read_text()) for p in outs]
    per_round = WORKERS * BATCH
    quota = TOTAL // per_round if drop_last else -(-TOTAL // per_round)
    for epoch in (0, 1):
        seen: Counter[int] = Counter()
        for run in runs:
            batches = run[epoch]["batches"]
            assert run[epoch]["quota"] == quota
            assert len(batches) == quota and {len(b) for b in batches} == {BATCH}
            seen.update(i for b in batches for i in b)
        assert set(seen) <= set(range(TOTAL))
        if drop_last:  # none twice, fewer than a round's batch dropped
            assert max(seen.values()) == 1
            assert TOTAL - len(seen) == TOTAL - quota * per_round < per_round
        else:  # every sample, and fewer than a round's batch of repeats
            assert len(seen) == TOTAL
            assert sum(seen.values()) - TOTAL == quota * per_round - TOTAL < per_round


def test_lockstep_needs_leases(redis_url: str, tmp_path: Path) -> None:
    strata_redis.ShardManager(redis_url, job_id=JOB).register_dataset_params("d", 100, 10)
    with strata_redis.TrainingOrchestrator(
        redis_url, "w0", job_id=JOB, checkpoint_path=tmp_path, last_call=0.1
    ) as orch:
        with pytest.raises(ValueError, match="lockstep=True needs mode='leases'"):
            orch.get_shards("d", 8, mode="static", lockstep=True)
        with pytest.raises(TypeError, match="lockstep must be a bool"):
            orch.get_shards("d", 8, lockstep="yes")  # type: ignore[arg-type]

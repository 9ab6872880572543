"""A checkpoint is the loop's (epoch, step): names, metadata, index order, lookups, runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from strata_redis import CheckpointManager
from strata_redis.checkpoint.ids import MAX_NUMBER, CheckpointId
from strata_redis.errors import CheckpointNotFoundError, StepNotForwardError

JOB = "ids-job"

Factory = Callable[..., CheckpointManager]


@pytest.fixture
def manager(redis_url: str, job_id: str, tmp_path: Path) -> Iterator[Factory]:
    made: list[CheckpointManager] = []

    def make(**kwargs: Any) -> CheckpointManager:
        kwargs.setdefault("redis", redis_url)
        kwargs.setdefault("job_id", job_id)
        ckpt = CheckpointManager(tmp_path / "store", **kwargs)
        made.append(ckpt)
        return ckpt

    yield make
    for ckpt in made:
        ckpt.close()


def test_labels_members_and_order() -> None:
    cases = [
        (CheckpointId(5000), "step_5000", "0000000000000000:-:0000000000005000"),
        (CheckpointId(200, 1), "epoch_1_step_200",
         "0000000000000000:0000000000000001:0000000000000200"),
        (CheckpointId(0, 1, 1), "run_1_epoch_1_step_0",
         "0000000000000001:0000000000000001:0000000000000000"),
        (CheckpointId(7, None, 3), "run_3_step_7", "0000000000000003:-:0000000000000007"),
        (CheckpointId(MAX_NUMBER, MAX_NUMBER, MAX_NUMBER),
         f"run_{MAX_NUMBER}_epoch_{MAX_NUMBER}_step_{MAX_NUMBER}",
         f"{MAX_NUMBER}:{MAX_NUMBER}:{MAX_NUMBER}"),
    ]  # fmt: skip
    for cid, label, member in cases:
        assert (cid.label, cid.member) == (label, member)
        assert CheckpointId.from_label(label) == cid
        assert CheckpointId.from_member(member) == cid
    ordered = [
        CheckpointId(9), CheckpointId(10), CheckpointId(0, 0), CheckpointId(10**15, 0),
        CheckpointId(0, 1), CheckpointId(200, 1), CheckpointId(2**25, 10_000),
        CheckpointId(0, None, 1), CheckpointId(0, 0, 1), CheckpointId(5, 0, 2),
    ]  # fmt: skip
    assert sorted(reversed(ordered)) == ordered
    # the index's byte order (what Redis sorts by) is the same order
    assert sorted(c.member for c in reversed(ordered)) == [c.member for c in ordered]
    for bad in ("step_01", "run_0_step_1", "epoch_x_step_1", "step_", f"step_{2**53 + 1}", "x"):
        assert CheckpointId.from_label(bad) is None, bad
    with pytest.raises(ValueError, match="not a checkpoint index member"):
        CheckpointId.from_member("12")
    with pytest.raises(ValueError, match="epoch must be between 0 and"):
        CheckpointId(1, 2**53 + 1)
    with pytest.raises(ValueError, match="run must be between 0 and"):
        CheckpointId(1, 0, -1)


def test_big_step_and_epoch_name_the_directory_and_metadata(
    manager: Factory, job_id: str, tmp_path: Path
) -> None:
    ckpt = manager()
    info = ckpt.save(b"state", step=2**25, epoch=10_000).result(timeout=30)
    assert (info.step, info.epoch, info.run, info.label) == (
        2**25,
        10_000,
        0,
        "epoch_10000_step_33554432",
    )
    where = tmp_path / "store" / job_id / "checkpoints" / "epoch_10000_step_33554432"
    assert info.location.endswith(f"/{job_id}/checkpoints/epoch_10000_step_33554432")
    doc = orjson.loads((where / "metadata.json").read_bytes())
    assert (doc["step"], doc["epoch"], doc["run"]) == (2**25, 10_000, 0)
    big = ckpt.save(b"later", step=2**53, epoch=2**53).result(timeout=30)
    assert (big.step, big.epoch) == (2**53, 2**53)
    assert [(i.epoch, i.step) for i in ckpt.list()] == [(2**53, 2**53), (10_000, 2**25)]
    assert ckpt.load(step=2**25, epoch=10_000) == b"state"
    assert ckpt.load(step=2**25) == b"state"  # any epoch
    assert ckpt.verify(2**25, epoch=10_000).label == "epoch_10000_step_33554432"
    records = ckpt.records()
    assert [(r.epoch, r.step, r.run) for r in records] == [(10_000, 2**25, 0), (2**53, 2**53, 0)]


def test_lookup_by_the_loops_numbers(manager: Factory) -> None:
    ckpt = manager(keep_count=10)
    for epoch in (0, 1):
        for step in (0, 100, 200):  # the seeds' loop: step restarts every epoch
            ckpt.save(f"{epoch}/{step}".encode(), step=step, epoch=epoch).result(timeout=30)
    assert ckpt.load(step=100, epoch=0) == b"0/100"
    assert ckpt.load(step=100, epoch=1) == b"1/100"
    assert ckpt.load(step=100) == b"1/100", "the newest with that step"
    assert ckpt.load(epoch=0) == b"0/200", "the newest of that epoch"
    assert ckpt.load_checkpoint(step=0, epoch=1).info.label == "epoch_1_step_0"
    with pytest.raises(StepNotForwardError, match=r"got \(epoch 0, step 300\), but this manager"):
        ckpt.save(b"x", step=300, epoch=0)
    with pytest.raises(CheckpointNotFoundError, match=r"checkpoint \(epoch 3\) of job"):
        ckpt.load(epoch=3)


def test_a_relaunch_run_orders_after_the_old_run_and_retention_follows(
    manager: Factory, job_id: str, tmp_path: Path, raw: Any
) -> None:
    first = manager(keep_count=3)
    for step in (0, 100, 200):
        first.save(f"r0/{step}".encode(), step=step, epoch=1).result(timeout=30)
    first.close()
    # the job is relaunched: its loop counts from step 0 again, in run 1
    second = manager(keep_count=3)
    with pytest.raises(StepNotForwardError, match=r"already committed \(epoch 1, step 200\)"):
        second.save(b"x", step=0, epoch=1)  # run 0 again: behind the newest
    info = second.save(b"r1/0", step=0, epoch=1, run=1).result(timeout=30)
    assert (info.run, info.epoch, info.step, info.label) == (1, 1, 0, "run_1_epoch_1_step_0")
    second.save(b"r1/100", step=100, epoch=1, run=1).result(timeout=30)
    second.wait(30)
    latest = second.latest()
    assert latest is not None and latest.label == "run_1_epoch_1_step_100"
    assert [i.label for i in second.list()] == [
        "run_1_epoch_1_step_100", "run_1_epoch_1_step_0", "epoch_1_step_200",
    ]  # fmt: skip
    dirs = sorted(p.name for p in (tmp_path / "store" / job_id / "checkpoints").iterdir())
    assert dirs == ["epoch_1_step_200", "run_1_epoch_1_step_0", "run_1_epoch_1_step_100"]
    assert second.load(step=200, epoch=1) == b"r0/200"  # only run 0 has it
    assert second.load(step=100, epoch=1) == b"r1/100"  # both runs did: the newest run's
    with pytest.raises(CheckpointNotFoundError, match=r"\(run 0, epoch 1, step 100\)"):
        second.load(step=100, epoch=1, run=0)  # the oldest by (run, epoch, step): deleted
    # the index orders the same way for redis-cli readers: newest first with ZRANGE ... REV
    members = raw.zrange(f"strata:{{{job_id}}}:checkpoints", 0, -1, desc=True)
    assert [CheckpointId.from_member(m).label for m in members] == [
        "run_1_epoch_1_step_100", "run_1_epoch_1_step_0", "epoch_1_step_200",
    ]  # fmt: skip
    # and a rebuild from storage alone gives the same order
    raw.flushall()
    fresh = manager(keep_count=3)
    assert [c.label for c in fresh.rebuild_index()] == [
        "run_1_epoch_1_step_100", "run_1_epoch_1_step_0", "epoch_1_step_200",
    ]  # fmt: skip

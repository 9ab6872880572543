"""A fresh round's resume puts each dataset back once, before its first walk: a dataset
registered after the round closed is restored by whoever walks it first, and a member that
resumes later never rebuilds the pool under a member that is already leasing from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import strata_redis
from strata_redis.coordination.epochs import restore_epoch
from strata_redis.coordination.rendezvous import Round
from strata_redis.data.position import restore_position
from strata_redis.errors import LeaseLostError
from strata_redis.resume import Resume


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def _resume(job: strata_redis.Job, tmp_path: Path, worker: str) -> Resume:
    round_ = Round(1, 0, 2, ("a", "b"), True, 0, 0, 0)
    with strata_redis.CheckpointManager(
        str(tmp_path), job_id=job.job_id, redis=job, worker_id=worker
    ) as ckpt:
        return Resume(job.context, ckpt, round_, set(), worker, _call)


@pytest.mark.parametrize("first_walk_restores", [True, False])
def test_a_late_registered_dataset_is_restored_before_its_first_walk(
    job: strata_redis.Job, tmp_path: Path, first_walk_restores: bool
) -> None:
    for worker in ("a", "b"):
        job.register_worker(worker, heartbeat_interval=None)
    early = _resume(job, tmp_path, "a")
    early.restore_all()  # nothing registered yet: only the epoch is set
    sm = strata_redis.ShardManager(job)
    sm.register_dataset_params("late", 200, 10, True, 7)
    params = sm.get_dataset("late")
    if first_walk_restores:
        early.restore(params)  # what get_shards does in the resumed round
    leases = job.leases("late", epoch=0, worker_id="a")
    lease = leases.acquire()
    assert lease is not None

    _resume(job, tmp_path, "b").restore_all()  # the other member, resuming later

    if first_walk_restores:  # the pool was put back once: a's lease stands
        assert lease.complete()
        assert leases.progress().done == 1
    else:  # the hazard the restore-before-walk removes: the pool is rebuilt under a
        with pytest.raises(LeaseLostError):
            lease.complete()


def test_the_epoch_is_put_back_once_per_restoring_round(
    job: strata_redis.Job, tmp_path: Path
) -> None:
    """The job's epoch is coordination's (``restore_epoch``): the first member of a round
    puts it back, and a member resuming late never moves back an epoch the round has moved
    on since; the next resuming round puts it back again."""
    for worker in ("a", "b"):
        job.register_worker(worker, heartbeat_interval=None)
    job.client.set(job.keys.epoch, 5)  # the job's epoch before the relaunch
    assert _resume(job, tmp_path, "a").restore_all() == 0  # no checkpoint: from the start
    assert job.current_epoch() == 0
    job.client.incr(job.keys.epoch)  # the round's epoch barrier released meanwhile
    late = _resume(job, tmp_path, "b")  # the other member, resuming later
    late.restore_all()
    assert job.current_epoch() == 1
    # it drops the same later epochs' pools as the first (1..5: the epoch the restore
    # replaced), not those past the epoch it would read now (it read 0, then 1: none)
    assert late._later == 6
    assert restore_epoch(job.context, 3, mark=2) == 1  # the next fresh round: it replaced 1
    assert restore_epoch(job.context, 4, mark=2) == 1  # a late member: told, nothing set
    assert job.current_epoch() == 3


def test_a_pool_restore_leaves_the_epoch_to_coordination(
    job: strata_redis.Job, tmp_path: Path
) -> None:
    job.register_worker("a", heartbeat_interval=None)
    params = strata_redis.ShardManager(job).register_dataset_params("ds", 40, 10, True, 7)
    job.client.set(job.keys.epoch, 2)
    assert restore_position(job.context, params, 0, {0}, {}, workers=["a"], mark=1, later_epochs=3)
    assert job.current_epoch() == 2  # the data script wrote no epoch
    resume = _resume(job, tmp_path, "a")
    resume.restore(params)  # the composition: the epoch first, then the pool (mark 1: done)
    assert job.current_epoch() == 0

"""A fresh round's resume puts each dataset back once, before its first walk: a dataset
registered after the round closed is restored by whoever walks it first, and a member that
resumes later never rebuilds the pool under a member that is already leasing from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import strata_redis
from strata_redis.coordination.rendezvous import Round
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

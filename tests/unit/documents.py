"""A dashboard snapshot built by hand, and the document (``dashboard/schema.json``) it
shapes into: for the views of one (the JSON, ``/metrics``, ``strata status``'s text).
``test_documents.py`` checks that ``document.document`` of the snapshot is this document
and that it holds to the schema, so the views are tested on what ``state.py`` promises."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.checkpoint.records import CheckpointTotals
from strata_redis.coordination.registry import MembershipEvent
from strata_redis.dashboard.snapshot import (
    BarrierFigures,
    CheckpointFigures,
    CheckpointRow,
    CommittedCheckpoint,
    DatasetTraining,
    DatasetView,
    HeldShard,
    JobSnapshot,
    Listing,
    Page,
    ReadCost,
    Recent,
    RedisRate,
    ShardCounts,
    Snapshot,
    Training,
    WorkerRate,
    WorkerRow,
    WorkerShards,
)
from strata_redis.data.sharding import DatasetParams

JOB = "job-a"

_WORKER = {
    "job_id": JOB, "worker_id": "w0", "status": "training", "stale": False,
    "last_seen_s": 0.4, "host": "node-1", "address": "10.0.0.1:29500", "gpu_count": 8,
    "labels": {}, "incarnation": 1,
    "shards": [{"dataset": "tokens", "epoch": 2, "shard_id": 17, "token": 5,
                "expires_in_s": 9.5}],
}  # fmt: skip

_DOC: dict[str, Any] = {
    "schema": "strata-dashboard/1",
    "redis": "redis://127.0.0.1:6379/0",
    "time_ms": 1_700_000_000_000,
    "job": None,
    "jobs": [{
        "job_id": JOB, "state": "running", "heartbeat_timeout_s": 10.0, "epoch": 2,
        "membership_generation": 7, "live_workers": 2, "registered_workers": 3,
        "silent_workers": 1, "gone_workers": 1, "datasets": 1,
        "latest_checkpoint": {"run": 0, "epoch": 2, "step": 400, "label": "epoch_2_step_400"},
        "progress": {
            "samples_trained": 12_000, "samples_per_s": 250.5, "rate_window_s": 20.0,
            "epoch_remaining_samples": 3000, "eta_s": 12.0, "slowest_worker": "w1",
            "workers": [
                {"worker_id": "w0", "samples_trained": 7000, "samples_per_s": 150.0,
                 "slowest": False},
                {"worker_id": "w1", "samples_trained": 5000, "samples_per_s": 100.5,
                 "slowest": True},
            ],
            "datasets": [{"name": "tokens", "epoch": 2, "samples_trained": 12_000,
                          "steals_total": 4, "remaining_samples": 3000, "ratio": 0.7}],
            "checkpoints": [{"run": 0, "epoch": 2, "step": 400, "label": "epoch_2_step_400",
                             "location": "file:///ckpt/job-a/checkpoints/epoch_2_step_400"}],
        },
    }],
    "jobs_listing": {"known": 1, "shown": 1, "complete": True},
    "page": {"offset": 0, "limit": 50, "total": 2},
    "workers": [
        _WORKER,
        {**_WORKER, "worker_id": "w1", "status": "idle", "stale": True, "last_seen_s": 31.0,
         "host": None, "address": None, "gpu_count": 0, "shards": []},
    ],
    "events": [{"job_id": JOB, "id": "1700000000000-0", "type": "fail", "worker_id": "w2",
                "generation": 7, "ms": 1_700_000_000_000, "last_seen_ms": 1_699_999_990_000}],
    "datasets": [{
        "job_id": JOB, "name": "tokens", "total_samples": 10_000, "samples_per_shard": 100,
        "num_shards": 100, "shuffle": True, "seed": 0, "epoch": 2,
        "progress": {"initialized": True, "total": 100, "done": 70, "leased": 2, "todo": 28,
                     "steals": 4},
        "distribution": [{"worker_id": "w0", "done": 40, "leased": 1}],
    }],
    "checkpoints": [
        {"job_id": JOB, "step": 400, "label": "epoch_2_step_400", "run": 0, "state": "committed",
         "epoch": 2, "world_size": 2, "ranks_saved": 2, "bytes": 2_500_000, "files": 4,
         "workers": {"0": "w0", "1": "w1"}, "seconds": 1.25, "mb_s": 2.0,
         "at_ms": 1_700_000_000_000,
         "culprit": None, "reason": None},
        {"job_id": JOB, "step": 500, "label": "epoch_2_step_500", "run": 0, "state": "aborted",
         "epoch": 2, "world_size": None, "ranks_saved": 1, "bytes": 0, "files": None,
         "workers": {"0": "w0"}, "seconds": None, "mb_s": None, "at_ms": None,
         "culprit": "w1", "reason": "rank 1 could not save its parts"},
    ],
    "metrics": {
        "redis": {"commands_per_s": 1234.0, "ops_per_s": 1200, "series": [[1.0, 1200.0]]},
        "jobs": [{
            "job_id": JOB,
            "workers": {"idle": 0, "training": 1, "checkpointing": 0, "failed": 1, "left": 0,
                        "stale": 1},
            "membership_generation": 7, "lease_grants_total": 321, "worker_failures_total": 1,
            "recent": {"window_s": 600.0, "failed": 1, "left": 0, "complete": True},
            "checkpoint_totals": {"saves": 3, "saved_bytes": 2_500_000, "save_seconds": 2.5,
                                  "aborted_steps": 1, "aborted_saves": 1},
            "last_commit_ms": 1_700_000_000_000,
            "shards": {"done": 70, "leased": 2, "todo": 28},
            "barrier": {"releases": 10, "p50_ms": 1.5, "p99_ms": 4.25, "max_ms": 5.0,
                        "series": [[1.0, 1.5, 4.25]]},
            "checkpoint": {"saves": 2, "aborted_saves": 1, "aborted_steps": 1,
                           "bytes": 2_500_000, "seconds": 2.5, "last_run": 0, "last_step": 400,
                           "last_epoch": 2, "last_bytes": 2_500_000, "last_seconds": 1.25,
                           "last_mb_s": 2.0, "series": [[1.0, 2.0]]},
            "membership": {"series": [[1.0, 2, 0, 1]]},
        }],
    },
    "read": {"commands": 40, "round_trips": 3, "ms": 2.5},
}  # fmt: skip


def document() -> dict[str, Any]:
    """A fresh copy of the document: one running job, two workers (one stale), one dataset,
    a committed and an aborted checkpoint."""
    return copy.deepcopy(_DOC)


_ROW = WorkerRow(
    job_id=JOB, worker_id="w0", status="training", stale=False, last_seen_s=0.4,
    host="node-1", address="10.0.0.1:29500", gpu_count=8, labels={}, incarnation=1,
    shards=(HeldShard("tokens", 2, 17, 5, 9.5),),
)  # fmt: skip
_E2S400 = CheckpointId(400, 2)

_JOB = JobSnapshot(
    job_id=JOB, state="running", heartbeat_timeout_s=10.0, epoch=2, generation=7,
    live_workers=2, silent_workers=1, registered_workers=3, latest_checkpoint=_E2S400,
    training=Training(
        samples_trained=12_000, samples_per_s=250.5, rate_window_s=20.0,
        epoch_remaining_samples=3000, eta_s=12.0, slowest_worker="w1",
        workers=(WorkerRate("w0", 7000, 150.0, False), WorkerRate("w1", 5000, 100.5, True)),
        datasets=(DatasetTraining("tokens", 2, 12_000, 4, 3000, 0.7),),
        checkpoints=(
            CommittedCheckpoint(_E2S400, "file:///ckpt/job-a/checkpoints/epoch_2_step_400"),
        ),
    ),
    workers=(
        _ROW,
        dataclasses.replace(
            _ROW, worker_id="w1", status="idle", stale=True, last_seen_s=31.0, host=None,
            address=None, gpu_count=0, shards=(),
        ),
    ),
    events=(MembershipEvent("1700000000000-0", "fail", "w2", 7, 1_700_000_000_000,
                            1_699_999_990_000),),
    datasets=(DatasetView(
        DatasetParams("tokens", 10_000, 100, True, 0), 2,
        ShardCounts(initialized=True, total=100, done=70, leased=2, todo=28, steals=4),
        (WorkerShards("w0", 40, 1),),
    ),),
    checkpoints=(
        CheckpointRow(
            id=_E2S400, state="committed", world_size=2, ranks_saved=2, nbytes=2_500_000,
            files=4, workers={"0": "w0", "1": "w1"}, seconds=1.25, mb_s=2.0,
            at_ms=1_700_000_000_000, culprit=None, reason=None,
        ),
        CheckpointRow(
            id=CheckpointId(500, 2), state="aborted", world_size=None, ranks_saved=1, nbytes=0,
            files=None, workers={"0": "w0"}, seconds=None, mb_s=None, at_ms=None,
            culprit="w1", reason="rank 1 could not save its parts",
        ),
    ),
    counts={"idle": 0, "training": 1, "checkpointing": 0, "failed": 1, "left": 0, "stale": 1},
    lease_grants_total=321, worker_failures_total=1,
    recent=Recent(window_s=600.0, failed=1, left=0, complete=True),
    checkpoint_totals=CheckpointTotals(saves=3, saved_bytes=2_500_000, save_seconds=2.5,
                                       aborted_steps=1, aborted_saves=1),
    last_commit_ms=1_700_000_000_000,
    barrier=BarrierFigures(releases=10, p50_ms=1.5, p99_ms=4.25, max_ms=5.0,
                           series=((1.0, 1.5, 4.25),)),
    checkpoint=CheckpointFigures(
        saves=2, aborted_saves=1, aborted_steps=1, nbytes=2_500_000, seconds=2.5,
        last=_E2S400, last_bytes=2_500_000, last_seconds=1.25, last_mb_s=2.0,
        series=((1.0, 2.0),),
    ),
    membership_series=((1.0, 2, 0, 1),),
)  # fmt: skip

_SNAP = Snapshot(
    redis="redis://127.0.0.1:6379/0", time_ms=1_700_000_000_000, job=None, jobs=(_JOB,),
    listing=Listing(1, 1, True), page=Page(0, 50, 2),
    redis_rate=RedisRate(1234.0, 1200, ((1.0, 1200.0),)),
    read=ReadCost(commands=40, round_trips=3, ms=2.5),
)  # fmt: skip


def snapshot(**job: Any) -> Snapshot:
    """The snapshot ``document()`` is made from; ``job`` replaces fields of its one job."""
    return dataclasses.replace(_SNAP, jobs=(dataclasses.replace(_JOB, **job),))

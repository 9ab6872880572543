"""The snapshot as the JSON document of ``GET /api/dashboard`` and ``strata status --json``.

``schema.json`` (in this package) is the document's contract with the page and with users:
this module is the one place that writes it, from a ``snapshot.Snapshot``; a field added
here is added there too. Pure shaping: no Redis.
"""

from __future__ import annotations

import dataclasses
from importlib import resources
from typing import Any, Final

from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.coordination.registry import MembershipEvent

from .snapshot import (
    BarrierFigures,
    CheckpointFigures,
    CheckpointRow,
    DatasetView,
    JobSnapshot,
    Series,
    Snapshot,
    Training,
    WorkerRow,
)

SCHEMA: Final = "strata-dashboard/1"

__all__ = ["SCHEMA", "document", "schema_text"]


def schema_text() -> str:
    """The JSON Schema of the document (``schema.json`` in this package)."""
    return resources.files(__package__).joinpath("schema.json").read_text(encoding="utf-8")


def document(snap: Snapshot) -> dict[str, Any]:
    """The dashboard document (``schema.json``) of ``snap``: each job's parts in lists
    of their own (``workers``, ``events``, ``datasets``, ``checkpoints``), each row with
    its ``job_id``."""
    jobs = snap.jobs
    listing = snap.listing
    return {
        "schema": SCHEMA,
        "redis": snap.redis,
        "time_ms": snap.time_ms,
        "job": snap.job,
        "jobs": [_summary(j) for j in jobs],
        "jobs_listing": None if listing is None else dataclasses.asdict(listing),
        "page": dataclasses.asdict(snap.page),
        "workers": [_worker(w) for j in jobs for w in j.workers],
        "events": [_event(j.job_id, e) for j in jobs for e in j.events],
        "datasets": [_dataset(j.job_id, d) for j in jobs for d in j.datasets],
        "checkpoints": [_checkpoint(j.job_id, c) for j in jobs for c in j.checkpoints],
        "metrics": {
            "redis": {
                "commands_per_s": snap.redis_rate.commands_per_s,
                "ops_per_s": snap.redis_rate.ops_per_s,
                "series": _series(snap.redis_rate.series),
            },
            "jobs": [_metrics(j) for j in jobs],
        },
        "read": dataclasses.asdict(snap.read),
    }


def _series(points: Series) -> list[list[float]]:
    return [list(p) for p in points]


def _id(cid: CheckpointId | None) -> dict[str, Any] | None:
    return None if cid is None else cid.as_dict()


def _summary(j: JobSnapshot) -> dict[str, Any]:
    return {
        "job_id": j.job_id,
        "state": j.state,
        "heartbeat_timeout_s": j.heartbeat_timeout_s,
        "epoch": j.epoch,
        "membership_generation": j.generation,
        "live_workers": j.live_workers,
        "silent_workers": j.silent_workers,
        "registered_workers": j.registered_workers,
        "gone_workers": max(0, j.registered_workers - j.live_workers),
        "datasets": len(j.datasets),
        "latest_checkpoint": _id(j.latest_checkpoint),
        "progress": _training(j.training),
    }


def _training(t: Training) -> dict[str, Any]:
    return {
        "samples_trained": t.samples_trained,
        "samples_per_s": t.samples_per_s,
        "rate_window_s": t.rate_window_s,
        "epoch_remaining_samples": t.epoch_remaining_samples,
        "eta_s": t.eta_s,
        "slowest_worker": t.slowest_worker,
        "workers": [dataclasses.asdict(w) for w in t.workers],
        "datasets": [dataclasses.asdict(d) for d in t.datasets],
        "checkpoints": [{**c.id.as_dict(), "location": c.location} for c in t.checkpoints],
    }


def _worker(w: WorkerRow) -> dict[str, Any]:
    return {
        "job_id": w.job_id,
        "worker_id": w.worker_id,
        "status": w.status,
        "stale": w.stale,
        "last_seen_s": w.last_seen_s,
        "host": w.host,
        "address": w.address,
        "gpu_count": w.gpu_count,
        "labels": dict(w.labels),
        "incarnation": w.incarnation,
        "shards": [dataclasses.asdict(s) for s in w.shards],
    }


def _event(job_id: str, e: MembershipEvent) -> dict[str, Any]:
    event: dict[str, Any] = {
        "job_id": job_id,
        "id": e.id,
        "type": e.type,
        "worker_id": e.worker_id,
        "generation": e.generation,
        "ms": e.ms,
    }
    if e.last_seen_ms is not None:
        event["last_seen_ms"] = e.last_seen_ms
    return event


def _dataset(job_id: str, d: DatasetView) -> dict[str, Any]:
    p = d.params
    return {
        "job_id": job_id,
        "name": p.name,
        "total_samples": p.total_samples,
        "samples_per_shard": p.samples_per_shard,
        "num_shards": p.num_shards,
        "shuffle": p.shuffle,
        "seed": p.seed,
        "epoch": d.epoch,
        "progress": dataclasses.asdict(d.progress),
        "distribution": (
            None if d.distribution is None else [dataclasses.asdict(w) for w in d.distribution]
        ),
    }


def _checkpoint(job_id: str, c: CheckpointRow) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "step": c.id.step,
        "state": c.state,
        "epoch": c.id.epoch,
        "run": c.id.run,
        "label": c.id.label,
        "world_size": c.world_size,
        "ranks_saved": c.ranks_saved,
        "bytes": c.nbytes,
        "files": c.files,
        "workers": dict(c.workers),
        "seconds": c.seconds,
        "mb_s": c.mb_s,
        "at_ms": c.at_ms,
        "culprit": c.culprit,
        "reason": c.reason,
    }


def _barrier(b: BarrierFigures) -> dict[str, Any]:
    return {
        "releases": b.releases,
        "p50_ms": b.p50_ms,
        "p99_ms": b.p99_ms,
        "max_ms": b.max_ms,
        "series": _series(b.series),
    }


def _checkpoint_figures(c: CheckpointFigures) -> dict[str, Any]:
    last = c.last
    return {
        "saves": c.saves,
        "aborted_saves": c.aborted_saves,
        "aborted_steps": c.aborted_steps,
        "bytes": c.nbytes,
        "seconds": c.seconds,
        "last_run": None if last is None else last.run,
        "last_step": None if last is None else last.step,
        "last_epoch": None if last is None else last.epoch,
        "last_bytes": c.last_bytes,
        "last_seconds": c.last_seconds,
        "last_mb_s": c.last_mb_s,
        "series": _series(c.series),
    }


def _metrics(j: JobSnapshot) -> dict[str, Any]:
    return {
        "job_id": j.job_id,
        "workers": dict(j.counts),
        "membership_generation": j.generation,
        "lease_grants_total": j.lease_grants_total,
        "worker_failures_total": j.worker_failures_total,
        "recent": dataclasses.asdict(j.recent),
        "checkpoint_totals": dataclasses.asdict(j.checkpoint_totals),
        "last_commit_ms": j.last_commit_ms,
        "shards": {
            key: sum(getattr(d.progress, key) for d in j.datasets)
            for key in ("done", "leased", "todo")
        },
        "barrier": _barrier(j.barrier),
        "checkpoint": _checkpoint_figures(j.checkpoint),
        "membership": {"series": _series(j.membership_series)},
    }

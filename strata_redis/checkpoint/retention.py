"""Retention: keep a job's newest committed checkpoints, delete older ones and crash leftovers.

"Newest" is (run, epoch, step) order (``ids.py``): after a relaunch, run 1's (epoch 1,
step 0) is newer than run 0's (epoch 1, step 200). Storage is the truth: a checkpoint is
committed when its metadata.json exists. A pass lists the job's ``{job_id}/checkpoints/``
prefix once and then

- deletes committed checkpoints beyond the ``keep_count`` newest (never the newest): first
  from the Redis index, then ``metadata.json``, then the other files, so a half-deleted one
  can never look committed (one whose leader is still marking it committed in Redis waits
  for the next pass);
- deletes leftovers: checkpoints without metadata.json older than the newest committed one
  (they can never commit: acks behind the newest committed checkpoint are refused), unless
  Redis says a leader is committing one right now, or has committed it since the listing
  (it is in the index: a half-deleted one left the index first);
- asks the storage to remove what killed writers left (``Storage.remove_abandoned``: a local
  writer's hidden temporary files, an S3 multipart upload) in the checkpoints it deleted,
  and anywhere under the prefix once it is older than ``tmp_age`` (S3 judges the age by its
  own clock) — but never in a checkpoint still in flight (open or committing in Redis):
  a save may upload for longer than ``tmp_age``, and S3-compatible stores may date an upload
  wrongly (moto dates every one 2010).

Only paths of the form ``{job_id}/checkpoints/{label}/...`` (a checkpoint label:
``step_{S}``, ``epoch_{E}_step_{S}``, ``run_{R}_...``) are ever touched: another job's files,
or anything else under the prefix, are left alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..context import JobContext
from ..storage import Storage
from ..storage.base import InUse
from .commit import IN_FLIGHT, step_states
from .ids import CheckpointId
from .index import CheckpointIndex
from .manifest import METADATA, checkpoint_dir, checkpoints_prefix, id_of, scan

__all__ = ["PruneReport", "prune"]

log = logging.getLogger("strata_redis.checkpoint")


@dataclass
class PruneReport:
    """What one retention pass did.

    Attributes:
        kept: the committed checkpoints kept, newest first.
        deleted: committed checkpoints deleted (beyond ``keep_count``).
        leftovers: uncommitted checkpoints deleted (crash leftovers).
        tmp_files: debris of killed writers deleted (``Storage.remove_abandoned``).
    """

    kept: list[CheckpointId] = field(default_factory=list)
    deleted: list[CheckpointId] = field(default_factory=list)
    leftovers: list[CheckpointId] = field(default_factory=list)
    tmp_files: int = 0


def prune(
    storage: Storage, ctx: JobContext, keep_count: int, *, tmp_age: float = 600.0
) -> PruneReport:
    """Run one retention pass over a job's checkpoints (see the module docstring).

    Args:
        storage: the checkpoints' storage.
        ctx: the job (its id names the prefix; its Redis holds the index).
        keep_count: how many of the newest committed checkpoints to keep (at least 1).
        tmp_age: seconds after which a killed writer's debris counts as abandoned anywhere.

    Returns:
        What was kept and deleted.

    Raises:
        StorageError: the storage failed (the pass stops; the next one carries on).
    """
    report = PruneReport()
    job_id = ctx.job_id
    steps = scan(storage, job_id)
    committed = sorted((s for s, files in steps.items() if METADATA in files), reverse=True)
    report.kept = committed[:keep_count]
    newest = committed[0] if committed else None
    index = CheckpointIndex(ctx)
    # One whose leader wrote metadata.json but has not yet marked it committed in Redis (a
    # newer one committed first) waits for the next pass: deleting it now, its commit would
    # put it back in the index after its files were gone.
    beyond = committed[keep_count:]
    for step in sorted(set(beyond) - _committing(ctx, beyond)):
        index.drop(step)
        _delete_step(storage, job_id, step, steps[step])
        report.deleted.append(step)
    if newest is not None:
        candidates = [s for s in steps if s < newest and METADATA not in steps[s]]
        for step in sorted(set(candidates) - _committing(ctx, candidates)):
            if index.metadata(step) is not None:
                # committed since the listing (its leader wrote metadata.json after it): not
                # a leftover (a half-deleted one left the index before its files went)
                continue
            _delete_step(storage, job_id, step, steps[step])
            report.leftovers.append(step)
    # Nothing writes to a deleted step any more: its debris goes at once; elsewhere, once old.
    for step in report.deleted + report.leftovers:
        report.tmp_files += storage.remove_abandoned(checkpoint_dir(job_id, step) + "/")
    report.tmp_files += storage.remove_abandoned(
        checkpoints_prefix(job_id), older_than=tmp_age, in_use=_in_flight(ctx)
    )
    if report.deleted or report.leftovers or report.tmp_files:
        log.info(
            "checkpoint retention of job %r: kept %s, deleted %s, leftovers %s, "
            "%d temporary files", job_id, _labels(report.kept), _labels(report.deleted),
            _labels(report.leftovers), report.tmp_files,
        )  # fmt: skip
    return report


def _labels(ids: list[CheckpointId]) -> list[str]:
    return [c.label for c in ids]


def _committing(ctx: JobContext, steps: list[CheckpointId]) -> set[CheckpointId]:
    """The checkpoints among ``steps`` whose leader may be writing metadata.json right now."""
    return {s for s, state in step_states(ctx, steps).items() if state == "committing"}


def _in_flight(ctx: JobContext) -> InUse:
    """``remove_abandoned``'s ``in_use``: the debris in checkpoints still in flight in Redis
    (their ranks may still be uploading)."""
    prefix = checkpoints_prefix(ctx.job_id)

    def in_use(paths: list[str]) -> set[str]:
        ids = {p: id_of(p[len(prefix) :]) for p in paths if p.startswith(prefix)}
        states = step_states(ctx, (parsed[0] for parsed in ids.values() if parsed is not None))
        return {
            p for p, parsed in ids.items()
            if parsed is not None and states[parsed[0]] in IN_FLIGHT
        }  # fmt: skip

    return in_use


def _delete_step(storage: Storage, job_id: str, step: CheckpointId, files: list[str]) -> None:
    base = checkpoint_dir(job_id, step)
    if METADATA in files:
        storage.delete(f"{base}/{METADATA}")  # first: the step stops being valid at once
    for rest in files:
        if rest != METADATA:
            storage.delete(f"{base}/{rest}")

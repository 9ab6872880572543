"""A training worker leaving: its saves settled or failed, deregistered, and the job ended when
it was the last live worker after the loop."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis as redis_py

from ..context import JobContext
from ..coordination.lifecycle import end_job
from ..coordination.registry import reap
from ..errors import StrataError

if TYPE_CHECKING:
    from .loop import TrainingOrchestrator

# the loop's logger, for every module of the loop (``docs/reference/environment.md``)
log = logging.getLogger("strata_redis.orchestrator")


def leave(o: TrainingOrchestrator, end: bool | None) -> None:
    """``close`` once the signal handlers are back: the round's saves settled (failed at once
    if the worker is out), the status thread stopped, the worker deregistered, the job ended
    if ``end`` (None: the loop's last call was ``advance_epoch``) and no worker is live, and
    what the orchestrator opened closed."""
    worker = getattr(o, "worker", None)
    # no other rank can complete this one's open saves once it is out: fail them at once
    lost = worker.lost if worker is not None else None
    o._rounds.close(abort=f"worker {o.worker_id!r} is out: {lost}" if lost else "")
    o._status.close()
    if worker is not None:
        worker.on_generation = None
        worker.leave()
        if end is None:
            end = o._between_epochs
        if end and lost is None and worker.lost is None:
            _end_if_last(o.context)
    if o._owns_storage:
        o.storage.close()
    if o._owns_client:
        o.context.close()


def _end_if_last(context: JobContext) -> None:
    """End the job if no worker is live now (this one has left; silent ones are reaped
    first, as any live worker's heartbeat thread would)."""
    try:
        reap(context)
        expires = end_job(context, only_if_idle=True)
    except (StrataError, redis_py.RedisError) as exc:
        log.warning("job %r: not ended on close: %s", context.job_id, exc)
        return
    if expires is not None:
        log.info(
            "job %r ended: its last worker closed after the loop; its keys expire in %gs",
            context.job_id, context.retention,
        )  # fmt: skip

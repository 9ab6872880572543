"""Epochs: ``advance_epoch`` is a barrier over every live worker plus an atomic counter; a
resume puts the counter back to a checkpoint's epoch (``restore_epoch``). The job's epoch is
this module's: only the epoch barrier's release and ``restore_epoch.lua`` write it."""

from __future__ import annotations

from typing import Any, Final

from ..connection import Replies, run_read, take_reply
from ..context import JobContext
from ..keys import Keys
from ..validate import check_int
from .barrier import LIVE, RESERVED_PREFIX, Barrier

#: the barrier behind ``advance_epoch`` (a reserved name: user barriers cannot take it).
EPOCH_BARRIER: Final = RESERVED_PREFIX + "epoch"


def epoch_barrier(ctx: JobContext, timeout: float = 60.0) -> Barrier:
    """The barrier behind ``advance_epoch`` (every live worker), e.g. to ``reset`` it."""
    return Barrier.reserved(ctx, EPOCH_BARRIER, LIVE, timeout, ctx.keys.epoch)


def round_epoch_barrier(ctx: JobContext, round_: int, world_size: int, timeout: float) -> Barrier:
    """The epoch barrier of rendezvous round ``round_``: its ``world_size`` members, never a
    lone early worker; its release moves the job's epoch like ``advance_epoch``'s."""
    name = f"{RESERVED_PREFIX}epoch:round:{round_}"
    return Barrier.reserved(ctx, name, world_size, timeout, ctx.keys.epoch)


def advance_epoch(ctx: JobContext, worker_id: str, timeout: float = 60.0) -> int:
    """Meet every live worker, then move to the next epoch: the same number for all.

    The release increments the job's epoch counter in the same atomic step, so it moves by
    exactly one per epoch, also when a call is retried after a connection error.

    Args:
        ctx: the job.
        worker_id: the calling worker (registered and live).
        timeout: seconds to wait for the others.

    Returns:
        The new epoch.

    Raises:
        BarrierTimeoutError, BarrierBrokenError: as for ``Barrier.wait``; the survivors
            call ``epoch_barrier(ctx).reset(err.generation)`` and advance again.
    """
    epoch = epoch_barrier(ctx, timeout).wait(worker_id).epoch
    if epoch is None:  # pragma: no cover - the epoch barrier's releases carry the counter
        raise RuntimeError("the epoch barrier released without an epoch")
    return epoch


def current_epoch(ctx: JobContext) -> int:
    """The job's epoch: 0 until the first ``advance_epoch``."""
    return run_read(ctx.client, lambda pipe: queue_epoch(pipe, ctx.job_id), take_epoch)


def queue_epoch(pipe: Any, job_id: str) -> None:
    """Queue a read of the job's epoch (a batched read; connection.py: queue/take)."""
    pipe.get(Keys(job_id).epoch)


def take_epoch(replies: Replies) -> int:
    """The epoch ``queue_epoch`` read: 0 until the first ``advance_epoch``."""
    return int(take_reply(replies) or 0)


def restore_epoch(ctx: JobContext, epoch: int, mark: int) -> int:
    """Put the job's epoch back to a checkpoint's ``epoch``, once per ``mark``; return the
    epoch it replaced.

    Every member of a resuming round calls it with the round's number as ``mark`` before it
    puts any dataset's lease pool back (``data/position.py``): the first call sets the epoch,
    the others change nothing, so a member that resumes late never moves back an epoch the
    round has moved on since. Every call returns the epoch the first one replaced, so every
    member drops the same later epochs' pools (reading the epoch itself, a member could read
    the one already put back).

    Args:
        ctx: the job.
        epoch: the checkpoint's epoch (0 to start over).
        mark: the restoring round.

    Returns:
        The job's epoch before the round's restore (0 when it had none).
    """
    check_int("epoch", epoch, low=0, high=2**31)
    check_int("mark", mark, low=0, high=2**63 - 1)
    _applied, replaced = ctx.scripts.run(
        "restore_epoch", [ctx.keys.epoch, ctx.keys.epoch_restored], [epoch, mark],
        {"job_id": ctx.job_id},
    )  # fmt: skip
    return int(replaced)

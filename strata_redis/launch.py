"""What the training loop says about itself at start: who it is, and a job that spans hosts.

``TrainingOrchestrator`` logs one INFO line once its first round closed (``start_line``): the
job id, the worker id, its rank of the world size, where checkpoints go, and whether the
job resumed (from which checkpoint) or starts fresh. So a job split in two (two one-worker
jobs, each training the whole dataset) shows as ``rank 0 of 1`` with two job ids, in the
first line each process writes.

A job id derived from the launch (``identity.job_id``: the script's content and its
arguments) is the same on every host that runs the same script with the same arguments,
which is what joins them; but it cannot tell a second host's process meant as part of the
job from an unrelated run of the same command, and hosts whose copies of the script differ
get a job each. So when a derived job has live workers on another host, ``hosts_warning``
says so at WARNING and names the fix: give every process the same ``STRATA_JOB_ID`` (or
torchrun's ``--rdzv-id``).
"""

from __future__ import annotations

from .checkpoint.manifest import CheckpointInfo, checkpoints_prefix
from .context import JobContext
from .coordination.registry import workers
from .identity import JOB_ENV
from .storage import Storage

__all__ = ["hosts_warning", "start_line"]


def start_line(
    ctx: JobContext,
    worker_id: str,
    rank: int,
    world_size: int,
    storage: Storage,
    *,
    epoch: int,
    resumed: CheckpointInfo | None,
    fresh: bool,
) -> str:
    """The loop's line at start.

    Args:
        ctx: the job.
        worker_id: this worker.
        rank, world_size: its place in its first round.
        storage: where checkpoints go.
        epoch: the job's epoch the loop starts at.
        resumed: the checkpoint the round resumed from (None: none).
        fresh: the round is a whole-job (re)start; False: this worker joined a running job.
    """
    where = f"{storage.describe().rstrip('/')}/{checkpoints_prefix(ctx.job_id)}"
    if resumed is not None:
        how = f"resumed from checkpoint {resumed.label} (run {resumed.run}) at epoch {epoch}"
    elif fresh:
        how = f"fresh: no checkpoint to resume from, epoch {epoch}"
    else:
        how = f"joined the running job at epoch {epoch}"
    return (
        f"job {ctx.job_id!r}, worker {worker_id!r}: rank {rank} of {world_size}; "
        f"checkpoints go to {where}; {how}"
    )


def hosts_warning(ctx: JobContext, host: str) -> str | None:
    """A warning when the job (whose id was derived, not chosen) has live workers on a host
    other than ``host``; None when every live worker runs on ``host``."""
    others = sorted(
        {
            w.host
            for w in workers(ctx)
            if w.status not in ("failed", "left") and w.host and w.host != host
        }
    )
    if not others:
        return None
    return (
        f"job {ctx.job_id!r} was derived from the script's content and arguments (not "
        f"chosen), and it has live workers on other hosts too ({', '.join(others)}): "
        f"processes on several hosts meet in one job only when every host runs a "
        f"byte-identical script with the same arguments, and an unrelated run of the same "
        f"command joins it too. Set {JOB_ENV} (or torchrun's --rdzv-id) to one value for "
        f"every process of the job, and to another for each separate run"
    )

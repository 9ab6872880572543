"""Resume: a fresh round puts the job's data position back to its newest verified checkpoint.

In a rendezvous round where every member is new (the whole job launched or relaunched),
each member reads the newest committed checkpoint whose parts verify; the job's epoch is put
back to the checkpoint's (``restore_epoch``, coordination's), then every dataset's epoch
record is rebuilt from the data positions the ranks saved in it (``restore_position``,
data's). Each is once per round, whoever sends it first; the others' calls are no-ops. The
epoch goes first: a member that dies between the two leaves the pools to the others'
restores, never a rebuilt pool under an epoch that was not put back. A dataset is restored
before its first walk in the round — also one registered after the round closed, so a member
that begins to lease can never have its pool rebuilt under it by a later member. Without a
checkpoint, the job starts from epoch 0 with every shard to do.

A storage outage while the checkpoint is read is ridden out (``storage.outage``: the reads are
sent again for up to the loop's ``redis_retry``), never a reason to resume from an older
checkpoint or to stop the worker at once.

Resuming from storage alone (Redis held no committed state for the checkpoint: a new or
flushed Redis, or a reused job id) is never silent: one WARNING names the checkpoint's
(epoch, step), its age and its location.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from .checkpoint.ids import CheckpointId
from .checkpoint.manager import CheckpointManager
from .checkpoint.manifest import CheckpointInfo
from .context import JobContext
from .coordination.epochs import restore_epoch
from .coordination.rendezvous import Round
from .data.datasets import list_datasets
from .data.position import POSITION_PART, Position, decode_positions, merge_positions
from .data.position import restore_position as put_back
from .data.sharding import DatasetParams
from .errors import CheckpointError
from .storage import retrying

__all__ = ["Resume"]

log = logging.getLogger("strata_redis.resume")


def _age(seconds: float) -> str:
    """A duration as a person reads it: ``42 seconds``, ``17 minutes``, ``3.2 hours``."""
    if seconds < 120:
        return f"{seconds:.0f} seconds"
    if seconds < 7200:
        return f"{seconds / 60:.0f} minutes"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 86400:.1f} days"


class Resume:
    """One member's resume in a fresh round: the checkpoint it resumes from, and the data
    position of each dataset it puts back.

    Args:
        ctx: the job.
        ckpt: the round's checkpoint manager (its index was rebuilt from storage).
        round_: the fresh round (its number marks the restores; a restored epoch's shards
            are spread over its members).
        held: the committed checkpoints Redis held before the index was rebuilt.
        worker_id: this member (for messages).
        retry: calls a function, retrying while Redis is unreachable.

    Attributes:
        info: the checkpoint resumed from (None: none verified; the job starts over).
        meta: the metadata its rank 0 saved with its position.
        epoch: the job's epoch it resumes at.
        positions: dataset -> (epoch, shards done, shard -> offset) restored from ``info``.

    Raises:
        CheckpointError: the checkpoint records positions of different epochs.
    """

    def __init__(
        self,
        ctx: JobContext,
        ckpt: CheckpointManager,
        round_: Round,
        held: Collection[CheckpointId],
        worker_id: str,
        retry: Callable[..., Any],
        storage_wait: float = 0.0,
    ) -> None:
        self.context, self.round, self.members = ctx, round_.number, list(round_.members)
        self._retry, self._worker_id = retry, worker_id
        self.info: CheckpointInfo | None = None
        self.meta: dict[str, Any] = {}
        self.positions: dict[str, tuple[int, set[int], dict[int, int]]] = {}
        self._saved: list[Position] = []
        what = f"worker {worker_id!r} resuming job {ctx.job_id!r}"
        for info in retrying(what, storage_wait, ckpt.list):
            try:
                parts = [
                    retrying(what, storage_wait, ckpt.load, info.step, name=POSITION_PART,
                             rank=r, epoch=info.epoch, run=info.run)
                    for r in range(info.world_size)
                ]  # fmt: skip
            except (CheckpointError, ValueError) as exc:
                log.warning("checkpoint %s cannot be resumed from: %s", info.label, exc)
                continue
            decoded = [decode_positions(raw) for raw in parts]
            self._saved = [p for ps, _ in decoded for p in ps]
            self.info, self.meta = info, decoded[0][1]
            break
        if self.info is not None and self.info.clock and self.info.era == ctx.era.value():
            # the checkpoint saw the job's clock at info.clock: Redis holding less means it
            # went back since (a failover or an older snapshot that no live process saw)
            ctx.era.seen(self.info.clock)
            retry(ctx.scripts.check)
        if self.info is not None and self.info.id not in held:
            age_s = max(0.0, time.time() - self.info.acked_ms / 1000)
            log.warning(
                "worker %r: job %r resumes from checkpoint (epoch %s, step %d) found in "
                "storage only (Redis held no checkpoint state for the job): saved %s ago, at "
                "%s; use another job_id or checkpoint_path to start over", worker_id,
                ctx.job_id, self.info.epoch, self.info.step, _age(age_s), self.info.location,
            )  # fmt: skip
        epoch = int(self.meta.get("job_epoch", 0))
        self.epoch = self._saved[0].epoch if self._saved else epoch
        if any(p.epoch != self.epoch for p in self._saved):
            raise CheckpointError(
                f"checkpoint {self.info and self.info.label} of job {ctx.job_id!r} records "
                "positions of different epochs",
                job_id=ctx.job_id, step=self.info.step if self.info else None,
            )  # fmt: skip
        # the epochs the job went past this one, their pools dropped: known once the epoch
        # is put back (``_restore_epoch``: the epoch the round's restore replaced)
        self._later = 1
        self._restored: set[str] = set()
        self._epoch_restored = False

    def restore_all(self) -> int:
        """Put back the job's epoch, then every registered dataset's position. Returns the
        job's epoch."""
        self._restore_epoch()
        for params in self._retry(list_datasets, self.context):
            self.restore(params)
        log.info("worker %r: resumed at epoch %d from %s", self._worker_id, self.epoch,
                 f"checkpoint {self.info.id}" if self.info else "the start")  # fmt: skip
        return self.epoch

    def restore(self, params: DatasetParams) -> None:
        """Put back ``params``' position from the checkpoint, once (a no-op after the first
        call of any member of the round)."""
        if params.name in self._restored:
            return
        self._restore_epoch()
        done, offsets = merge_positions(p for p in self._saved if p.dataset == params.name)
        if self.info is not None:
            self.positions[params.name] = (self.epoch, done, offsets)
        self._retry(
            put_back, self.context, params, self.epoch, done, offsets, workers=self.members,
            mark=self.round, later_epochs=self._later,
        )  # fmt: skip
        self._restored.add(params.name)

    def _restore_epoch(self) -> None:
        """Put the job's epoch back to the checkpoint's, once per round (before any pool)."""
        if not self._epoch_restored:
            replaced = self._retry(restore_epoch, self.context, self.epoch, self.round)
            self._later = max(0, replaced - self.epoch) + 1
            self._epoch_restored = True

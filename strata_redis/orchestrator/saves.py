"""A training worker's checkpoints: its saves (state and data position) handed to the round's
checkpoints, and the parts of the checkpoint it resumed from."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..checkpoint.ids import MAX_NUMBER, CheckpointId
from ..checkpoint.manifest import CheckpointInfo
from ..checkpoint.rounds import loop_parts
from ..data.position import POSITION_PART, encode_positions
from ..storage import retrying
from ..validate import check_int

if TYPE_CHECKING:
    from .loop import TrainingOrchestrator

# the loop's logger, for every module of the loop (``docs/reference/environment.md``)
log = logging.getLogger("strata_redis.orchestrator")


class Saves:
    """The orchestrator's saves: each checkpoint's part of this rank (the loop's state, its
    streams' data position) handed to the round's checkpoints (``o._rounds``), the status
    shown while they are in flight (``o._status``), and loads from the resumed checkpoint.
    """

    def __init__(self, o: TrainingOrchestrator) -> None:
        self._o = o
        self._epoch_warned = False

    def save(
        self, step: int, epoch: int, state: Any, metadata: Mapping[str, Any] | None
    ) -> Future[CheckpointInfo] | None:
        """``save_checkpoint``: this rank's part of checkpoint (epoch, step), in the
        background (None when it is not after the previous one, or a joiner's step 0)."""
        o = self._o
        check_int("step", step, low=0, high=MAX_NUMBER)
        check_int("epoch", epoch, low=0, high=MAX_NUMBER)
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a mapping or None, got {type(metadata).__name__}")
        o._member.guard()
        job_epoch = o._job_epoch
        if epoch != job_epoch and not self._epoch_warned:
            # e.g. the seeds' `for epoch in range(2)` relaunched after a resume at epoch 1
            self._epoch_warned = True
            log.warning(
                "worker %r: the loop's epoch %d is not the job's epoch %d (start the loop at "
                "orchestrator.epoch after a resume); checkpoints record the loop's epoch",
                o.worker_id, epoch, job_epoch,
            )  # fmt: skip
        cid = o._rounds.checkpoint(step, epoch)
        base = o._rounds.base
        if cid is None and step == 0 and base is not None and base.epoch == epoch:
            log.info(
                "worker %r: its loop's step 0 of epoch %d is checkpoint %s, which the others "
                "saved before it joined; not saved", o.worker_id, epoch, base,
            )  # fmt: skip
            return None
        if cid is None:
            log.warning(
                "worker %r: checkpoint (epoch=%d, step=%d) is not after its previous one %s; "
                "not saved", o.worker_id, epoch, step, o._rounds.last,
            )  # fmt: skip
            return None
        if state is None and o.state_provider is not None:
            state = o.state_provider()
        parts = loop_parts(state, self.position(cid, job_epoch, metadata=dict(metadata or {})))
        # the loop does not wait on status writes: "checkpointing" is shown from here until
        # the save settles (committed or failed), written by the status thread
        o._status.saves_changed(+1)
        try:
            future = o._rounds.save(o.round.number, cid, job_epoch, parts)
        except BaseException:
            o._status.saves_changed(-1)
            raise
        future.add_done_callback(lambda _: o._status.saves_changed(-1))
        return future

    def position(self, cid: CheckpointId, job_epoch: int, **meta: Any) -> tuple[str, bytes]:
        """The data-position part of this rank's share of ``cid``: where each of its
        streams stands, with what the position was saved in."""
        o = self._o
        for stream in o._streams.values():
            stream.settle()  # (completions sent from a lease thread land first)
        positions = [s.position for s in o._streams.values() if s.position is not None]
        meta.update(epoch=cid.epoch, step=cid.step, run=cid.run, round=o.round.number,
                    rank=o.rank, worker=o.worker_id, job_epoch=job_epoch)  # fmt: skip
        return POSITION_PART, encode_positions(positions, meta)

    def wait(self, timeout: float | None) -> None:
        """``wait_for_checkpoints``: until the saves in flight are committed or failed."""
        manager = self._o._rounds.manager
        if manager is not None:
            manager.wait(timeout)

    def load(self, name: str, rank: int | None) -> bytes | None:
        """``load_state``: a part of the resumed checkpoint, a storage outage ridden out."""
        o = self._o
        info = o.resumed
        if info is None:
            return None
        if rank is None:
            rank = o.rank if o.rank < info.world_size else 0
        return retrying(
            f"worker {o.worker_id!r} loading {name!r}", o.redis_retry,
            o.checkpoints.load, info.step, name=name, rank=rank, epoch=info.epoch,
            run=info.run,
        )  # fmt: skip

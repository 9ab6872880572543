"""The training loop as the host of its streams' walks (``data.stream.StreamHost``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..coordination.epochs import current_epoch
from ..coordination.rendezvous import Round

if TYPE_CHECKING:
    from .loop import TrainingOrchestrator


class LoopHost:
    """A ``TrainingOrchestrator`` as the host of its streams' walks (``data.stream.StreamHost``):
    the narrow view a walk gets of it."""

    def __init__(self, o: TrainingOrchestrator) -> None:
        self.context, self.worker_id, self.lease_ttl, self._o = (
            o.context,
            o.worker_id,
            o.lease_ttl,
            o,
        )
        self.retry, self.set_status = o._retry, o._status.set
        self.guard = o._stopping.step_guard

    @property
    def round(self) -> Round:
        return self._o.round

    def interrupted(self) -> bool:
        o = self._o
        return o.round_broken is not None or o.worker.lost is not None or o.preempted

    def begin_epoch(self) -> int:
        self._o._between_epochs = False
        epoch = self._o._job_epoch = self._o._retry(current_epoch, self._o.context)
        return epoch

    def resumed(self, dataset: str) -> tuple[int, set[int], dict[int, int]] | None:
        return self._o.resumed_positions.get(dataset)

"""What a walk sees: the epoch it walks (``WalkSpec``), where it reports the batches it hands
out (``Ledger``: the stream's data position) and the process running it (``WalkHost``).

These three are the whole of a walk's view: a walk never reads the stream that runs it, and
nothing here imports the stream (``data/stream.py`` implements ``Ledger`` and extends
``WalkHost``; the imports point one way). A walk's own state between iterations (the
lockstep walk's quota and what it took) lives in the walk (``lockstep.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ...context import JobContext
from ..sharding import DatasetParams, I64Array

if TYPE_CHECKING:
    from ...coordination.rendezvous import Round
    from ..leases import ShardLeases

__all__ = ["Batch", "Ledger", "Walk", "WalkHost", "WalkSpec"]

T = TypeVar("T")

#: one batch: sample indices in the epoch's order
Batch = I64Array


class WalkHost(Protocol):
    """What a walk needs of the process running it."""

    @property
    def context(self) -> JobContext:
        """The job."""

    @property
    def worker_id(self) -> str:
        """This worker."""

    @property
    def round(self) -> Round:
        """The rendezvous round this worker is in now."""

    @property
    def lease_ttl(self) -> float:
        """Seconds a shard lease lasts without renewal."""

    def interrupted(self) -> bool:
        """The per-batch check, a flag read with no round trip: the round broke or the
        worker is out (then ``guard`` acts on it)."""

    def guard(self) -> None:
        """Leave a broken round (rendezvous again) or raise why the worker cannot go on."""

    def retry(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call ``fn``, retrying while Redis is unreachable."""


@dataclass(frozen=True)
class WalkSpec:
    """The epoch a walk walks, as the epoch's record stood when it began.

    Attributes:
        params: the dataset.
        epoch: the job's epoch.
        batch_size: samples per batch.
        base: shards done when the walk began (in every member's model).
        starts: shard -> samples already trained when the walk began (restored offsets,
            a finished walk's hand-backs): a shard's first batch starts there.
        wait_for_others: at the epoch's end, wait while others hold the last shards
            (``leases``).
        drop_last: drop the samples left under a round's worth instead of padding
            (``lockstep``).
        ahead: shards held leased ahead by a thread of the walk's leases, which also sends
            the completions (``leases``; ``ShardLeases``'s ``ahead``); 0: on the loop's thread.
    """

    params: DatasetParams
    epoch: int
    batch_size: int
    base: frozenset[int] = frozenset()
    starts: Mapping[int, int] = field(default_factory=dict)
    wait_for_others: bool = True
    drop_last: bool = True
    ahead: int = 0


class Ledger(Protocol):
    """Where a walk reports what it hands out: the stream's data position (and the
    completions that wait until the training step consumed a shard's last batch)."""

    def trained_before(self, shard: int) -> None:
        """``shard``'s first batch is about to be cut: its offset at the walk's start is in
        the model already."""

    def handed(self, pieces: list[tuple[int, int]]) -> None:
        """A batch made of ``pieces`` [(shard, samples of it after the piece)] is handed out."""

    def dropped(self, shard: int) -> None:
        """This walk's lease of ``shard`` was taken back: whoever holds it now trains it."""

    def shard_end(self, shard: int, finish: Callable[[], None]) -> None:
        """Every batch of ``shard`` is handed out: ``finish`` (its completion) runs once they
        are consumed."""

    def finish_now(self) -> bool:
        """Run every pending completion now (the epoch's tail). Returns whether any ran."""

    def drains(self, leases: ShardLeases) -> None:
        """The walk leases from ``leases``: a host that leaves mid-walk (preemption) gives
        what they hold back at the data position."""


class Walk(Protocol):
    """A walk: yields the batches of one epoch (numpy arrays of sample indices) and reports
    each to the ledger."""

    def __call__(self, spec: WalkSpec, ledger: Ledger, host: WalkHost) -> Iterator[Batch]: ...

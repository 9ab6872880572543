"""``LeaseBatchSampler``: a ``DataLoader`` batch sampler over the orchestrator's fenced shard
leases, whose data position counts what the training step consumed, not what the loader
prefetched."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch.utils.data

from ..data.stream import ShardStream
from ..orchestrator import TrainingOrchestrator
from ..validate import check_int

__all__ = ["DataLoader", "LeaseBatchSampler"]

#: the shape version of ``LeaseBatchSampler.state_dict()``
STATE_VERSION = 1


class LeaseBatchSampler(torch.utils.data.Sampler[list[int]]):  # type: ignore[misc]
    """Batches of sample indices from this worker's leases: own shards first, then stealing.

    It lives in the training process (``DataLoader`` asks it for indices in the main process,
    so ``num_workers > 0`` works) and walks the job's current epoch each time it is iterated,
    one Redis round trip per shard and none per batch. Iterate it through
    ``strata_redis.torch.DataLoader``, which reports each batch the training loop takes: the
    data position saved in checkpoints is then what the model consumed, and a shard's lease
    is completed once its last batch was consumed (at the very end of an epoch, when nothing
    more can be leased, the last leases are completed as they are handed out: the loader
    cannot consume while its sampler waits). An iteration ends once nothing can be leased
    now, never waiting for shards other ranks still hold: under DDP they wait for this rank
    in every all-reduce (use ``torch.distributed.algorithms.Join`` for the unequal batch
    counts this gives).

    Args:
        orchestrator: this worker's ``TrainingOrchestrator``.
        dataset: a registered dataset's name.
        batch_size: samples per batch (default: the orchestrator's); a batch never spans
            two shards.
        mode: ``"leases"`` (default) or ``"static"`` (see ``ShardStream``).
        lockstep: every rank of the round gets the same number of full batches each epoch
            (DDP without ``Join``): ``remaining // (world_size * batch_size)``, fixed once
            per round and epoch; batches may span shards; fewer than ``world_size *
            batch_size`` samples are dropped per epoch, every other sample comes once.
        drop_last: with ``lockstep``, False pads the last batches with repeats instead of
            dropping (as ``DistributedSampler(drop_last=False)``).
        lease_ahead: shards a thread holds leased ahead, which also sends the completions
            (``get_shards``): the loader's thread makes no Redis round trip per shard
            (default 2; 0: it makes one; not with ``lockstep``, whose ranks lease in turn).

    Raises:
        TypeError, ValueError: a bad argument; DatasetNotFoundError: an unknown dataset.
    """

    def __init__(
        self,
        orchestrator: TrainingOrchestrator,
        dataset: str,
        batch_size: int | None = None,
        *,
        mode: str = "leases",
        lockstep: bool = False,
        drop_last: bool = True,
        lease_ahead: int = 2,
    ) -> None:
        if not isinstance(orchestrator, TrainingOrchestrator):
            raise TypeError(
                f"orchestrator must be a TrainingOrchestrator, got {type(orchestrator).__name__}"
            )
        self.orchestrator = orchestrator
        self.stream: ShardStream = orchestrator.get_shards(
            dataset, batch_size, mode=mode, track_consumption=True, wait_for_others=False,
            lockstep=lockstep, drop_last=drop_last, lease_ahead=lease_ahead,
        )  # fmt: skip
        self.dataset = self.stream.params.name
        self.batch_size = self.stream.batch_size
        self._epoch: int | None = None
        self._walk: Iterator[Any] | None = None  # the iteration in progress

    def __repr__(self) -> str:
        return f"LeaseBatchSampler({self.dataset!r}, batch_size={self.batch_size})"

    def __iter__(self) -> Iterator[list[int]]:
        # (the walk starts at the first batch asked for: DataLoader makes and drops one
        # iterator of its sampler before the one it uses)
        return self._batches()

    def _batches(self) -> Iterator[list[int]]:
        if self._walk is not None:
            raise RuntimeError(
                f"{self!r} is already being iterated: one loader iterator at a time (a second "
                "would hand the same epoch's shards out twice); finish or close the first"
            )
        job_epoch = self.orchestrator.epoch
        if self._epoch is not None and self._epoch != job_epoch:
            raise RuntimeError(
                f"{self!r}: set_epoch({self._epoch}) but the job is at epoch {job_epoch}: call "
                "orchestrator.advance_epoch() at the end of every epoch"
            )
        walk = iter(self.stream)
        self._walk = walk
        try:
            yield from self._items(walk)
        finally:
            if self._walk is walk:
                self._walk = None

    def _items(self, walk: Iterator[Any]) -> Iterator[Any]:
        """What the loader gets for each batch of the walk: its indices (a subclass may hand
        out other work items: ``ShardDataset``'s)."""
        for batch in walk:
            yield batch.tolist()

    def consumed(self) -> None:
        """The training loop took the oldest batch handed out (``DataLoader`` calls it)."""
        self.stream.consumed(1)

    def close(self, walk: Iterator[Any] | None = None) -> None:
        """End the iteration in progress (only if it is ``walk``, when given): the leases it
        holds go back to the pool."""
        current = self._walk
        if current is None or (walk is not None and walk is not current):
            return
        self._walk = None
        current.close()  # type: ignore[attr-defined]

    def set_epoch(self, epoch: int) -> None:
        """Say which epoch the next iteration is (as ``DistributedSampler.set_epoch``).

        The sampler walks the job's epoch (moved by ``orchestrator.advance_epoch()``); this
        checks the loop agrees, so a loop counting from 0 after a resume fails loudly
        instead of training the wrong epoch.

        Raises:
            RuntimeError: an iteration is in progress (its batches were already asked for).
            ValueError: ``epoch`` is not the job's current epoch.
        """
        check_int("epoch", epoch, low=0, high=2**31)
        if self._walk is not None:
            raise RuntimeError(
                f"{self!r}: set_epoch({epoch}) during an iteration: the loader has already asked "
                "for this epoch's batches; call it before iterating the loader"
            )
        job_epoch = self.orchestrator.epoch
        if epoch != job_epoch:
            raise ValueError(
                f"{self!r}: set_epoch({epoch}) but the job is at epoch {job_epoch}: start the "
                "loop at orchestrator.epoch (it resumes there) and call "
                "orchestrator.advance_epoch() after each epoch"
            )
        self._epoch = epoch

    # -- the data position ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What the training step consumed of the current epoch (the ``Stateful`` protocol of
        torchdata's ``StatefulDataLoader``).

        The same position goes into every strata checkpoint by itself; this is for
        callers that keep their own record.
        """
        self.stream.settle()  # (the completions it counts have landed)
        position = self.stream.position
        return {
            "version": STATE_VERSION,
            "dataset": self.dataset,
            "batch_size": self.batch_size,
            "position": None if position is None else position.to_json(),
            "in_flight": self.stream.in_flight,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Check a ``state_dict()`` against the position the job resumed from.

        The job's data position lives in Redis and in strata checkpoints: the orchestrator
        puts it back when the job starts (``resume=True``), for every rank at once. A state
        saved elsewhere can only be checked against it; one the job did not resume from is
        refused, so a resume is never silently lost.

        Raises:
            RuntimeError: an iteration is in progress.
            ValueError: the state is malformed, of another dataset, or not contained in the
                position the job resumed from.
        """
        if self._walk is not None:
            raise RuntimeError(f"{self!r}: load_state_dict() during an iteration")
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"{self!r}: not a LeaseBatchSampler state (version {STATE_VERSION})")
        if state.get("dataset") != self.dataset:
            raise ValueError(f"{self!r}: the state is of dataset {state.get('dataset')!r}")
        raw = state.get("position")
        if raw is None:
            return
        from ..data.position import Position

        mine = Position.from_json(raw)
        resumed = self.orchestrator.resumed_positions.get(self.dataset)
        if resumed is None:
            raise ValueError(
                f"{self!r}: the job did not resume a position of {self.dataset!r}; strata "
                "restores positions from its own checkpoints (save them with "
                "orchestrator.save_checkpoint or strata_redis.torch.save)"
            )
        epoch, done, offsets = resumed
        extra = mine.done() - done
        ahead = {s: o for s, o in mine.partial.items() if s not in done and o > offsets.get(s, 0)}
        if mine.epoch != epoch or extra or ahead:
            raise ValueError(
                f"{self!r}: this position (epoch {mine.epoch}, {len(mine.done())} shards done) "
                f"is not part of the checkpoint the job resumed from (epoch {epoch}, {len(done)} "
                "shards done): its samples would be skipped or trained twice"
            )


class DataLoader(torch.utils.data.DataLoader):  # type: ignore[misc]
    """``torch.utils.data.DataLoader`` over a ``LeaseBatchSampler`` that reports each batch it
    yields to the training loop as consumed.

    Accepts every ``DataLoader`` argument (``num_workers``, ``prefetch_factor``,
    ``pin_memory``, ``collate_fn``, ...) except ``in_order=False``: batches must reach the
    loop in the order the sampler handed them out.

    ``DataLoader(shard_dataset, num_workers=..., pin_memory=...)`` takes a ``ShardDataset``'s
    own sampler (``batch_size`` None or left out: the dataset's).

    Raises:
        TypeError: ``batch_sampler`` is not a ``LeaseBatchSampler`` (and the dataset is no
            ``ShardDataset``).
        ValueError: ``in_order=False``.
    """

    def __init__(
        self, dataset: Any, batch_sampler: LeaseBatchSampler | None = None, **kwargs: Any
    ) -> None:
        if batch_sampler is None:  # a ShardDataset brings its own (and its batch size)
            batch_sampler = getattr(dataset, "lease_sampler", None)
            if kwargs.get("batch_size", 1) in (1, None):
                kwargs.pop("batch_size", None)
        if not isinstance(batch_sampler, LeaseBatchSampler):
            raise TypeError(
                "batch_sampler must be a strata_redis.torch.LeaseBatchSampler, got "
                f"{type(batch_sampler).__name__}"
            )
        if kwargs.get("in_order", True) is False:
            raise ValueError("in_order=False: batches must reach the loop in the sampler's order")
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        self.lease_sampler = batch_sampler

    def __iter__(self) -> Iterator[Any]:
        sampler = self.lease_sampler
        other = sampler._walk  # another iteration's walk (this one then fails): never closed
        walk = None  # the sampler's walk this iteration drives (not another's)
        try:
            for batch in super().__iter__():
                walk = walk or sampler._walk
                sampler.consumed()
                yield batch
        finally:
            # (also when the first batch failed: its leases go back now, not when the
            # suspended walk is collected, maybe after Redis is gone)
            walk = walk or (sampler._walk if sampler._walk is not other else None)
            if walk is not None:
                sampler.close(walk)

    def _get_iterator(self) -> Any:
        if self.num_workers == 0:
            return super()._get_iterator()
        self.check_worker_number_rationality()
        return _WorkersIter(self)


class _WorkersIter(torch.utils.data.dataloader._MultiProcessingDataLoaderIter):  # type: ignore[misc]
    """torch's iterator over worker processes, which stop at once when its start fails (the
    sampler's error while it takes its first batches: a corrupt first shard). torch leaves
    them to the half-made iterator's collection, which the error's traceback delays, at
    interpreter exit to no one: its queues' feeder threads then race the exit (a thread's
    ValueError on stderr; under pytest, exit status 1)."""

    def __init__(self, loader: DataLoader) -> None:
        try:
            super().__init__(loader)
        except BaseException:
            with contextlib.suppress(AttributeError):  # (failed before its workers existed)
                self._shutdown_workers()
            raise

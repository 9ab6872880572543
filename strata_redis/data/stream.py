"""``ShardStream``: one worker's batches of one dataset, walked once per epoch.

A stream holds where its walk stands (the data position checkpoints save, the batches
handed out and not yet consumed); the walk itself — which shards, in which batches — is one
of the walks in ``data/walks/`` (``leases``, ``lockstep``, ``static``), picked from a table.
A walk sees three narrow things (``data/walks/base.py``), never the stream: the epoch it walks
(``WalkSpec``), the stream as its ``Ledger`` (what each batch holds, when a shard's batches
are all out) and the *host*: the process that owns the worker and its round (the
orchestrator is one). The host gives the walk what it needs (``WalkHost``: the job, the
worker, the round, the lease TTL, a flag read for the per-batch check, the retry policy) and
the stream a little more (``StreamHost``: status changes, the epoch a walk begins, the
position it resumed from), and nothing else.

**A data position is never dropped.** The position a fresh round resumed from is in every
member's model, and stays in every position the stream gives until the shards it had
part-way are finished: each walk of that epoch starts with the restored offsets
(``carried``, read from the epoch's record as the walk begins: ``restored_offsets``) as its
own, whoever leases those shards, and whether or not anyone has yet — in every member of
every round of that epoch, a worker that joined it later without resuming too (its model is
the round's). A round smaller than the checkpoint's (ranks that left) leaves their
half-read shards in the pool at their offsets (``restore_position``), and its checkpoints
still record those offsets until a member finishes them, so a later resume at any world
size trains each sample once.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

import redis

from ..errors import LeaseLostError, NotReplicatedError
from ..validate import check_int
from .leases import ShardLeases
from .position import Position
from .record import done_count, done_shards, epoch_record, restored_offsets
from .sharding import DatasetParams
from .walks import WALKS, Batch, LockstepWalk, WalkHost, WalkSpec

__all__ = ["MODES", "ShardStream", "StreamHost"]

log = logging.getLogger("strata_redis.data")

#: what ``mode`` may be
MODES = ("leases", "static")


class StreamHost(WalkHost, Protocol):
    """What a stream needs of the process running it: what its walks need, and more."""

    def set_status(self, status: str) -> None:
        """Record the worker's status (``training``, ``idle``), best effort."""

    def begin_epoch(self) -> int:
        """A walk begins: the job's current epoch (read from Redis, retried)."""

    def resumed(self, dataset: str) -> tuple[int, set[int], dict[int, int]] | None:
        """The position of ``dataset`` the host's fresh round restored from a checkpoint:
        (epoch, shards done, shard -> samples trained), or None (it did not resume one)."""


class ShardStream:
    """What ``get_shards`` returns: each iteration walks the job's current epoch.

    Iterating yields numpy arrays of sample indices (``batch_size`` at most) from this
    worker's part of the epoch. ``len()`` is not defined: how many batches a worker gets
    depends on the others.

    Args:
        host: the process running the walks (``StreamHost``).
        params: the dataset.
        batch_size: samples per batch.
        mode: ``"leases"`` (fenced leases, own shards first, then stealing; every shard once
            per epoch whoever fails) or ``"static"`` (this worker's shards of the round's
            assignment, no leases: the plan of the epoch's start is kept, and a failed
            worker's shards are not redone).
        track_consumption: the position moves (and leases complete) only as ``consumed()``
            reports batches taken by the training step.
        wait_for_others: at the epoch's end, wait while others hold the last shards (so a
            failed worker's shards are redone); False ends an iteration once nothing can be
            leased now — for loops whose members meet in collectives every step (DDP), where
            waiting would deadlock.
        lockstep: every member of the round gets the same number of full batches this epoch
            (for DDP): ``quota = remaining // (world_size * batch_size)`` batches, fixed once
            per (round, epoch); batches may span shards; a rank keeps of a shard what its
            quota still needs and hands the rest back at once, so no rank ever waits on one
            blocked in a collective. The ``remaining - quota * world_size * batch_size``
            samples left (under ``world_size * batch_size``) are dropped this epoch; every
            other sample comes once.
        drop_last: with ``lockstep``, False pads instead of dropping (as
            ``DistributedSampler``): ``quota`` is rounded up, every sample comes once, and the
            ranks that find the pool empty fill their last batches with samples they already
            had (fewer than ``world_size * batch_size`` repeats in all).
        lease_ahead: with ``mode="leases"`` (not ``lockstep``), shards held leased ahead by
            a thread of the walk, which also sends the completions: the loop's thread makes
            no round trip per shard (0..4; default 0: it makes one). A checkpoint's data
            position waits for the completions to land (``settle``).

    Attributes:
        walk: the walk's name (``data/walks/``): ``lockstep``, or ``mode``.
    """

    def __init__(
        self,
        host: StreamHost,
        params: DatasetParams,
        batch_size: int,
        mode: str = "leases",
        *,
        track_consumption: bool = False,
        wait_for_others: bool = True,
        lockstep: bool = False,
        drop_last: bool = True,
        lease_ahead: int = 0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be 'leases' or 'static', got {mode!r}")
        for arg, flag in (
            ("track_consumption", track_consumption), ("wait_for_others", wait_for_others),
            ("lockstep", lockstep), ("drop_last", drop_last),
        ):  # fmt: skip
            if not isinstance(flag, bool):
                raise TypeError(f"{arg} must be a bool, got {flag!r}")
        if lockstep and mode != "leases":
            raise ValueError("lockstep=True needs mode='leases'")
        self.host = host
        self.params = params
        self.batch_size = check_int("batch_size", batch_size, low=1, high=2**31)
        self.mode = mode
        self.walk = "lockstep" if lockstep else mode
        self.track_consumption = track_consumption
        self.wait_for_others = wait_for_others and not lockstep
        self.lockstep = lockstep
        self.drop_last = drop_last
        self.lease_ahead = check_int("lease_ahead", lease_ahead, low=0, high=4)
        self._walk = WALKS[self.walk]()  # made once: a walk's state lasts between iterations
        #: shard -> samples already trained when the walk began (restored offsets)
        self.starts: dict[int, int] = {}
        #: the walked epoch's restored offsets, carried in its positions until those shards
        #: are done (read once per walk)
        self.carried: dict[int, int] = {}
        self._position: Position | None = None
        self._round = 0  # the round the position's ``base`` was read in
        # handed-out batches not yet consumed (``track_consumption``), oldest first: a batch
        # as its pieces [(shard, samples of it after the piece)], or a shard id: its end
        self._pending: deque[list[tuple[int, int]] | int] = deque()
        self._finishers: dict[int, Callable[[], None] | None] = {}
        #: the lease sets the current walk drains (``release_held``)
        self._drained: list[ShardLeases] = []
        #: batches handed out by the current walk
        self.handed_count = 0

    def __repr__(self) -> str:
        return f"ShardStream({self.params.name!r}, batch_size={self.batch_size})"

    @property
    def quota(self) -> int | None:
        """With ``lockstep``, the batches each member gets in the current epoch (None before
        the first walk, or without ``lockstep``)."""
        return self._walk.quota if isinstance(self._walk, LockstepWalk) else None

    @property
    def position(self) -> Position | None:
        """Where the current (or last) walk stands: what checkpoints save. Before the first
        walk, the position the host resumed from (None: it resumed none)."""
        if self._position is None:
            resumed = self.host.resumed(self.params.name)
            if resumed is not None:
                epoch, done, offsets = resumed
                return Position(self.params.name, epoch, self.params.num_shards, set(done),
                                partial=dict(offsets))  # fmt: skip
        return self._position

    def __iter__(self) -> Iterator[Batch]:
        host = self.host
        host.guard()
        ctx, params = host.context, self.params
        epoch = host.begin_epoch()
        done, self.starts = host.retry(epoch_record, ctx, params, epoch)
        closed = len(done) == params.num_shards
        self.carried = {} if closed else host.retry(restored_offsets, ctx, params, epoch)
        position = Position(params.name, epoch, params.num_shards, done)
        position.partial.update((s, o) for s, o in self.carried.items() if s not in done)
        self._position, self._round = position, host.round.number
        self._pending.clear()
        self._finishers.clear()
        self._drained.clear()
        self.handed_count = 0
        spec = WalkSpec(
            params, epoch, self.batch_size, frozenset(done), dict(self.starts),
            wait_for_others=self.wait_for_others, drop_last=self.drop_last,
            ahead=self.lease_ahead,
        )  # fmt: skip
        host.set_status("training")
        yield from self._walk(spec, self, host)
        host.set_status("idle")

    # -- what the training step consumed ----------------------------------------------------
    def consumed(self, batches: int = 1) -> None:
        """Record that the training step took the next ``batches`` handed-out batches.

        Only with ``track_consumption``: the data position saved in checkpoints then counts
        what the training step consumed, not what a prefetching loader asked for, and a
        shard's lease is completed once its last batch is consumed. Without it, a no-op.

        Raises:
            ValueError: more batches reported consumed than were handed out.
        """
        if not self.track_consumption:
            return
        check_int("batches", batches, low=0, high=2**31)
        position = self._position
        for _ in range(batches):
            if not self._pending or position is None:
                raise ValueError(
                    f"{self!r}: {batches} batches reported consumed, but fewer were handed out"
                )
            pieces = self._pending.popleft()
            assert isinstance(pieces, list)
            for shard, after in pieces:
                position.partial[shard] = after
            while self._pending and isinstance(self._pending[0], int):
                self._end_shard(position, self._pending.popleft())  # type: ignore[arg-type]

    @property
    def in_flight(self) -> int:
        """Batches handed out and not yet reported consumed."""
        return sum(1 for entry in self._pending if isinstance(entry, list))

    # -- the walks' ledger (walks/base.py: Ledger) ---------------------------------------------
    def trained_before(self, shard: int) -> None:
        """A shard's offset as the epoch's record had it when the walk began (a restored
        position, a finished walk's hand-back) is in the model already: the position holds
        it from the start. (An offset set during the walk — another rank's hand-back — is
        not, until the hander's own batches are consumed: the position then moves only with
        this rank's.)"""
        position = self._position
        assert position is not None
        if self.starts.get(shard, 0) > position.partial.get(shard, 0):
            position.partial[shard] = self.starts[shard]

    def dropped(self, shard: int) -> None:
        """This walk's part of ``shard`` is not in its position after all (its lease was
        taken back: the new holder trains it again): the position keeps only the restored
        offset it carries (already in the model), if any. (With ``track_consumption``, the
        position moves only as the batches handed out are consumed: nothing to drop.)"""
        if self.track_consumption:
            return
        position = self._position
        assert position is not None
        floor = self.carried.get(shard, 0)
        if floor and shard not in position.base:
            position.partial[shard] = floor
        else:
            position.partial.pop(shard, None)

    def handed(self, pieces: list[tuple[int, int]]) -> None:
        """A batch made of ``pieces`` [(shard, samples of it after the piece)] is handed out."""
        self.handed_count += 1
        if self.track_consumption:
            self._pending.append(pieces)
        else:
            assert self._position is not None
            for shard, after in pieces:
                self._position.partial[shard] = after

    def shard_end(self, shard: int, finish: Callable[[], None]) -> None:
        """Every batch of ``shard`` is handed out: ``finish`` (its completion) runs once they
        are consumed."""
        if self.track_consumption and self._pending:
            self._finishers[shard] = finish
            self._pending.append(shard)
        else:
            assert self._position is not None
            finish()
            self._finishers[shard] = None
            self._end_shard(self._position, shard)

    def _end_shard(self, position: Position, shard: int) -> None:
        finish = self._finishers.pop(shard, None)
        if finish is not None:
            finish()
        position.partial.pop(shard, None)
        position.own.add(shard)

    def finish_now(self) -> bool:
        """Complete every handed-out shard's lease now (the epoch's tail: nothing else can
        be leased, and the loader cannot consume while its sampler waits); the position
        still moves only as batches are consumed. Returns whether there was any."""
        ran = False
        for shard, finish in list(self._finishers.items()):
            if finish is not None:
                self._finishers[shard] = None
                finish()
                ran = True
        return ran

    def drains(self, leases: ShardLeases) -> None:
        """The current walk leases from ``leases`` (``release_held`` gives them back)."""
        self._drained.append(leases)

    def settle(self) -> None:
        """Wait until the completions of the shards the position counts done have landed in
        Redis (``lease_ahead`` sends them from a thread): call before saving the position.

        Raises:
            Exception: what a completion met other than ``LeaseLostError`` (that one is
                logged: the shard is another holder's), as a completion on the loop's thread
                would have raised it; a position counting that shard must not be saved.
        """
        for leases in self._drained:
            leases.settle()

    def release_held(self) -> list[tuple[int, int | None]]:
        """Give back every lease the current walk holds, at the data position: the next holder
        starts after the samples this worker trained (counted in its position, so in its
        checkpoint and, data-parallel, in every member's model). For a host that leaves
        mid-walk (preemption). Returns [(shard, offset or None: from the lease's start)].

        Errors are logged, not raised: a lease that cannot be released expires.
        """
        for leases in self._drained:
            try:
                leases.settle()  # (consumed shards' completions first)
            except (LeaseLostError, NotReplicatedError, redis.RedisError) as exc:
                log.warning("a completion did not land: %s", exc)
        position = self._position
        released: list[tuple[int, int | None]] = []
        for leases in self._drained:
            for lease in leases.held():
                trained = 0 if position is None else position.partial.get(lease.shard_id, 0)
                offset = trained if lease.start < trained < len(lease.shard) else None
                try:
                    leases.release(lease, offset)
                    released.append((lease.shard_id, offset))
                except (LeaseLostError, NotReplicatedError, redis.RedisError) as exc:
                    log.warning("shard %s not released: %s", lease.shard_id, exc)
        return released

    # -- round changes ------------------------------------------------------------------------
    def rebase(self) -> None:
        """After the host joined a new round: the shards done by now are in every member's
        model (data parallel), less what this worker handed out and its trainer has not yet
        taken."""
        host, position = self.host, self._position
        if position is None or self._round == host.round.number:
            return
        done = host.retry(done_shards, host.context, self.params, position.epoch)
        in_flight = {s for e in self._pending if isinstance(e, list) for s, _ in e}
        position.base = done - in_flight
        self._round = host.round.number

    def undone(self) -> int:
        """Shards of the walked epoch not done, for a walk that ended without waiting for
        others' last shards (``wait_for_others=False``): a round change at the epoch barrier
        must not let the epoch advance with a dead member's shards undone. 0 otherwise."""
        position = self._position
        quota_met = isinstance(self._walk, LockstepWalk) and self._walk.quota_met
        if self.wait_for_others or position is None or quota_met:
            return 0
        done = self.host.retry(done_count, self.host.context, self.params, position.epoch)
        return max(0, self.params.num_shards - done)

"""``TrainingOrchestrator``: the training loop's one handle (rendezvous, batches, checkpoints).

The seeds' loop runs as written::

    orchestrator = strata_redis.TrainingOrchestrator(coordinator_url="localhost:6379",
                                                     worker_id="worker-01")
    shard_info = orchestrator.get_shards("imagenet_total")
    for epoch in range(2):
        for step, batch in enumerate(shard_info):
            ...                                   # train on batch (numpy sample indices)
            if step % 100 == 0:
                orchestrator.save_checkpoint(step=step, epoch=epoch)
        orchestrator.advance_epoch()

It registers the worker (heartbeats in the background), joins the elastic rendezvous, and,
in a round where every member is new (a whole-job start or restart), puts the data position
back to the newest verified checkpoint. Its batches come from fenced shard leases, one Redis
round trip per shard and none per batch; each batch checks, with no round trip, whether the
heartbeat thread found the round broken (a member died or left), and if so the worker
rendezvouses again (``elastic=True``) or raises ``RoundBrokenError``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

import redis as redis_py

from . import identity
from .checkpoint.ids import MAX_NUMBER, CheckpointId
from .checkpoint.manager import CheckpointManager
from .checkpoint.manifest import CheckpointInfo
from .checkpoint.rounds import RoundCheckpoints
from .context import HasContext, JobContext
from .coordination.barrier import Barrier
from .coordination.epochs import current_epoch, round_epoch_barrier
from .coordination.rendezvous import Rendezvous, Round
from .coordination.workers import Worker, register_worker
from .data.datasets import get_dataset, list_datasets
from .data.position import (
    POSITION_PART,
    Position,
    decode_positions,
    encode_positions,
    merge_positions,
    restore_position,
)
from .data.stream import ShardStream
from .errors import (
    BarrierBrokenError,
    CheckpointError,
    EpochUnfinishedError,
    RoundBrokenError,
    StrataError,
)
from .storage import Storage, open_storage
from .validate import check_id, check_int, check_seconds

__all__ = ["TrainingOrchestrator"]

log = logging.getLogger("strata_redis.orchestrator")
T = TypeVar("T")

#: what ``state`` may be: a buffer, or a mapping of part name -> buffer
State = Any


def _age(seconds: float) -> str:
    """A duration as a person reads it: ``42 seconds``, ``17 minutes``, ``3.2 hours``."""
    if seconds < 120:
        return f"{seconds:.0f} seconds"
    if seconds < 7200:
        return f"{seconds / 60:.0f} minutes"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 86400:.1f} days"


class _Host:
    """A ``TrainingOrchestrator`` as the host of its streams' walks (``data.stream.StreamHost``):
    the narrow view a walk gets of it."""

    def __init__(self, orchestrator: TrainingOrchestrator) -> None:
        self._o = orchestrator

    @property
    def context(self) -> JobContext:
        return self._o.context

    @property
    def worker_id(self) -> str:
        return self._o.worker_id

    @property
    def round(self) -> Round:
        return self._o.round

    @property
    def lease_ttl(self) -> float:
        return self._o.lease_ttl

    def interrupted(self) -> bool:
        return self._o._broken is not None or self._o.worker.lost is not None

    def guard(self) -> None:
        self._o._guard()

    def retry(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._o._retry(fn, *args, **kwargs)

    def set_status(self, status: str) -> None:
        self._o._set_status(status)

    def begin_epoch(self) -> int:
        epoch = self._o._job_epoch = self._o._retry(current_epoch, self._o.context)
        return epoch


class TrainingOrchestrator:
    """One training worker's handle: rendezvous, batches from leased shards, checkpoints.

    Args:
        coordinator_url: the Redis (URL, ``host:port``, ``redis.Redis`` or a ``Job``).
        worker_id: this worker's id (unique in the job; a restarted process reuses it).
            None derives one per process (``identity.worker_id``): the host name and
            torchrun's rank (``gpu-a-rank-3``, the same after a restart of the rank), else
            the host name and the pid (``gpu-a-pid-4242``).
        job_id: the job; default ``$STRATA_JOB_ID``, else torchrun's ``TORCHELASTIC_RUN_ID``,
            else one derived from the user, the main script and the working directory
            (``<script>-<8 hex>``: a relaunch of the same command reproduces it;
            ``identity.job_id``). With a ``Job`` or context as ``coordinator_url``: its job.
        checkpoint_path: where checkpoints go (a ``Storage``, URL or path); None reads the
            environment (``STORAGE_BACKEND``, ``LOCAL_STORAGE_PATH``, ...), else the per-user
            ``~/.local/share/strata_redis/checkpoints`` (logged once).
        keep_count: how many committed checkpoints to keep.
        min_workers: a rendezvous round closes only with at least this many workers.
        max_workers: a round closes as soon as it has this many (None: no limit).
        last_call: seconds a round stays open for more workers once ``min_workers`` joined.
        heartbeat_timeout: seconds of silence after which a worker is declared failed.
        heartbeat_interval: seconds between heartbeats (default ``heartbeat_timeout / 10``).
        batch_size: samples per batch (default for ``get_shards``).
        state_provider: called at each ``save_checkpoint`` without ``state``: returns the
            state to save (bytes, a buffer, or a mapping of part name -> buffer).
        resume: in a round where every member is new, restore the data position (and offer
            the state, ``load_state``) from the newest verified checkpoint; with no
            checkpoint, the job starts from epoch 0 with every shard to do.
        elastic: when the round breaks, rendezvous again by itself (``on_round`` is called
            with the new round); False raises ``RoundBrokenError`` at the next step instead.
        on_round: called with each new ``Round`` this worker joins.
        max_restarts: rounds restarted by failures allowed (None: no limit); rounds that
            admit late workers never count.
        rendezvous_timeout: seconds to wait for a round to close.
        epoch_timeout: seconds ``advance_epoch`` waits for the round's other members.
        commit_timeout: seconds a checkpoint waits for the other ranks' parts.
        lease_ttl: seconds a shard lease lasts without renewal (renewed in the background).
        redis_retry: seconds the loop keeps retrying while Redis is unreachable.
        replace: take over ``worker_id`` if a registration of it is alive (a restarted
            process). None: only when torchrun says this process is a restart
            (``TORCHELASTIC_RESTART_COUNT`` > 0); otherwise a live registration of the id
            raises ``WorkerExistsError`` naming its host and pid, and leaves it untouched.

    Raises:
        TypeError, ValueError: a bad argument, named in the message (nothing is written).
        WorkerExistsError: ``worker_id`` is registered and alive, and ``replace`` is not set.
        RendezvousTimeoutError: no round closed within ``rendezvous_timeout``.
    """

    def __init__(
        self,
        coordinator_url: str | redis_py.Redis | JobContext | HasContext | None = "localhost:6379",
        worker_id: str | None = None,
        *,
        job_id: str | None = None,
        checkpoint_path: Storage | str | os.PathLike[str] | None = None,
        keep_count: int = 5,
        min_workers: int = 1,
        max_workers: int | None = None,
        last_call: float = 3.0,
        heartbeat_timeout: float = 10.0,
        heartbeat_interval: float | None = None,
        batch_size: int = 32,
        state_provider: Callable[[], State] | None = None,
        resume: bool = True,
        elastic: bool = True,
        on_round: Callable[[Round], None] | None = None,
        max_restarts: int | None = None,
        rendezvous_timeout: float = 600.0,
        epoch_timeout: float = 600.0,
        commit_timeout: float = 300.0,
        lease_ttl: float = 30.0,
        redis_retry: float = 60.0,
        replace: bool | None = None,
    ) -> None:
        # Every argument is checked before anything is written to Redis or storage.
        if worker_id is None:
            worker_id = identity.worker_id()
        self.worker_id = check_id("worker_id", worker_id)
        if replace is None:
            replace = identity.restarted()
        self.keep_count = check_int("keep_count", keep_count, low=1, high=1_000_000)
        self.batch_size = check_int("batch_size", batch_size, low=1, high=2**31)
        heartbeat_timeout = check_seconds("heartbeat_timeout", heartbeat_timeout, high=86400)
        if heartbeat_interval is None:
            heartbeat_interval = heartbeat_timeout / 10
        heartbeat_interval = check_seconds("heartbeat_interval", heartbeat_interval, high=3600)
        if heartbeat_interval >= heartbeat_timeout:
            raise ValueError(
                f"heartbeat_interval must be below heartbeat_timeout ({heartbeat_timeout}s), "
                f"got {heartbeat_interval}"
            )
        self.epoch_timeout = check_seconds("epoch_timeout", epoch_timeout, high=7 * 86400)
        self.commit_timeout = check_seconds("commit_timeout", commit_timeout, high=7 * 86400)
        self.lease_ttl = check_seconds("lease_ttl", lease_ttl, high=86400)
        self.redis_retry = check_seconds("redis_retry", redis_retry, high=86400)
        for arg, flag in (("resume", resume), ("elastic", elastic), ("replace", replace)):
            if not isinstance(flag, bool):
                raise TypeError(f"{arg} must be a bool, got {type(flag).__name__} {flag!r}")
        for arg, fn in (("state_provider", state_provider), ("on_round", on_round)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{arg} must be callable or None, got {type(fn).__name__}")
        self.state_provider = state_provider
        self.elastic = elastic
        self.on_round = on_round
        if job_id is None and not isinstance(coordinator_url, (JobContext, HasContext)):
            job_id = identity.job_id()  # never the low-level API's shared "default"
        self.context = JobContext(coordinator_url, job_id, heartbeat_timeout=heartbeat_timeout)
        self.job_id = self.context.job_id
        if "/" in self.job_id:
            raise ValueError(f"job_id must not contain '/' (it names a directory), got {job_id!r}")
        self.rendezvous = Rendezvous(
            self.context, min_workers=min_workers, max_workers=max_workers, last_call=last_call,
            timeout=rendezvous_timeout, max_restarts=max_restarts,
        )  # fmt: skip
        self._owns_client = not isinstance(
            coordinator_url, (JobContext, HasContext, redis_py.Redis)
        )
        self._owns_storage = not isinstance(checkpoint_path, Storage)
        self.storage = open_storage(checkpoint_path)

        self._host = _Host(self)
        self._streams: dict[str, ShardStream] = {}
        self._broken: RoundBrokenError | None = None
        self._seen_generation = -1
        self._ckpt: CheckpointManager | None = None
        self._old_ckpts: list[CheckpointManager] = []
        # the job's run, the round's checkpoints, the fill-ins (checkpoint/rounds.py)
        self._rounds = RoundCheckpoints(self.context, self.storage, self._retry)
        self._last_parts: dict[str, Any] | None = None  # the last save's parts, for fills
        self._status = ""
        self._job_epoch = 0  # the job's epoch as this worker last saw it
        self._epoch_warned = False
        self._closed = False
        self.resumed: CheckpointInfo | None = None
        self.resumed_meta: dict[str, Any] = {}
        #: dataset -> (epoch, shards done, shard -> offset) restored from ``resumed``
        self.resumed_positions: dict[str, tuple[int, set[int], dict[int, int]]] = {}

        self.worker: Worker = register_worker(
            self.context, self.worker_id, replace=replace, heartbeat_interval=heartbeat_interval
        )
        try:
            self._join(leaving=0)
            if self.round.fresh and resume:
                self._restore()
            else:
                self._job_epoch = self._retry(current_epoch, self.context)
        except BaseException:
            self.close()
            raise
        self.worker.on_generation = self._on_generation

    def __repr__(self) -> str:
        r = self.round
        return (
            f"TrainingOrchestrator(job={self.job_id!r}, worker={self.worker_id!r}, "
            f"round={r.number}, rank={r.rank}, world_size={r.world_size})"
        )

    # -- the round ------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This worker's rank in the current round."""
        return self.round.rank

    @property
    def world_size(self) -> int:
        """The current round's size."""
        return self.round.world_size

    @property
    def epoch(self) -> int:
        """The job's current epoch (one Redis read)."""
        return current_epoch(self.context)

    def _join(self, leaving: int, *, abort: bool = False) -> Round:
        """Join a round (leaving round ``leaving`` if it broke); it becomes ``self.round``."""
        round_ = self._retry(
            self.rendezvous.join, self.worker_id, self.worker.incarnation, leaving=leaving
        )
        if self._ckpt is not None:
            if abort:  # a member is gone: the old round's open steps can never commit
                self._ckpt.abort_pending(f"rendezvous round {leaving} broke")
            self._ckpt.close(wait=False)  # (after growth, they commit in the background)
            self._old_ckpts.append(self._ckpt)
        self._ckpt = CheckpointManager(
            self.storage, self.keep_count, job_id=self.job_id, redis=self.context,
            worker_id=self.worker_id, rank=round_.rank, world_size=round_.world_size,
            commit_timeout=self.commit_timeout,
        )  # fmt: skip
        log.info(
            "worker %r: round %d, rank %d of %d (restarts: %d failure, %d growth)",
            self.worker_id, round_.number, round_.rank, round_.world_size,
            round_.failure_restarts, round_.growth_restarts,
        )  # fmt: skip
        self.round = round_
        self._rounds.join(round_.number, round_.fresh)
        self._seen_generation = round_.generation
        self._broken = None
        if self.on_round is not None:
            self.on_round(round_)
        return round_

    def _on_generation(self, generation: int) -> None:
        """Heartbeat thread: the membership moved; is our round still whole? (Off the hot
        path: one script call per membership change.)"""
        if generation == self._seen_generation or self._broken is not None:
            return
        self._seen_generation = generation
        round_ = self.round
        try:
            self.rendezvous.check(round_)
        except RoundBrokenError as exc:
            if round_ is self.round:
                self._broken = exc
                log.warning("worker %r: %s", self.worker_id, exc)
                # on a thread of its own: the heartbeat thread never waits on the main pool
                threading.Thread(
                    target=self._on_broken, args=(round_, exc), daemon=True,
                    name=f"strata-round-broken-{self.worker_id}",
                ).start()  # fmt: skip
        except Exception:  # the heartbeat thread must go on
            log.exception("worker %r: round check failed", self.worker_id)

    def _on_broken(self, round_: Round, exc: RoundBrokenError) -> None:
        """Wake this round's waiters: its epoch barrier breaks, its open saves abort."""
        try:
            self._abort_epoch_barrier(round_, exc)
            if exc.reason != "superseded":
                self._abort_saves(exc)
        except Exception:  # a best effort: the waits are bounded anyway
            log.exception("worker %r: could not wake round %d's waiters", self.worker_id,
                          round_.number)  # fmt: skip

    def _epoch_barrier(self, round_: Round) -> Barrier:
        return round_epoch_barrier(
            self.context, round_.number, round_.world_size, self.epoch_timeout
        )

    def _abort_epoch_barrier(self, round_: Round, exc: RoundBrokenError) -> None:
        # Members waiting at the broken round's epoch barrier wake at once.
        try:
            self._epoch_barrier(round_).abort(self.worker_id, f"round over: {exc.reason}")
        except (StrataError, redis_py.RedisError) as err:
            log.info("could not break round %d's epoch barrier: %s", round_.number, err)

    def _abort_saves(self, exc: RoundBrokenError) -> None:
        # The broken round's open checkpoints can never commit: free their waiters now.
        ckpt = self._ckpt
        if ckpt is not None:
            aborted = ckpt.abort_pending(f"rendezvous round {exc.round} is over ({exc.reason})")
            if aborted:
                log.info("worker %r: aborted checkpoints %s", self.worker_id,
                         [c.label for c in aborted])  # fmt: skip

    def _guard(self) -> None:
        """The per-step check: a flag read, no round trip. A broken round is left here."""
        lost = self.worker.lost
        if lost is not None:
            raise lost
        broken = self._broken
        if broken is None:
            return
        if broken.round != self.round.number:  # about a round this worker already left
            self._broken = None
            return
        if not self.elastic:
            raise broken
        self._join(leaving=broken.round, abort=broken.reason != "superseded")
        self._rebase()

    def _rebase(self) -> None:
        for stream in self._streams.values():
            stream.rebase()

    # -- data -----------------------------------------------------------------------------
    def get_shards(
        self,
        dataset: str,
        batch_size: int | None = None,
        *,
        mode: str = "leases",
        track_consumption: bool = False,
        wait_for_others: bool = True,
        lockstep: bool = False,
        drop_last: bool = True,
    ) -> ShardStream:
        """This worker's batches of ``dataset``: iterate it once per epoch.

        Args:
            dataset: a registered dataset's name.
            batch_size: samples per batch (default: the orchestrator's).
            mode: ``"leases"`` (default) or ``"static"`` (see ``ShardStream``).
            track_consumption: the position moves (and leases complete) only as
                ``ShardStream.consumed()`` reports batches taken by the training step (for
                loaders that prefetch); by default, as batches are yielded.
            wait_for_others: at the epoch's end, wait while others hold the last shards
                (default: an iteration ends when the epoch is done, so a failed worker's
                shards are redone); False ends it once nothing can be leased now — for
                loops whose members meet in collectives every step (DDP), where waiting
                would deadlock. Then ``advance_epoch`` raises ``EpochUnfinishedError`` if
                the round changed while shards were left undone.
            lockstep: every member of the round gets the same number of full batches this
                epoch (for DDP): ``quota = remaining // (world_size * batch_size)`` batches,
                fixed once per (round, epoch); batches may span shards; a rank keeps of a
                shard what its quota still needs and hands the rest back at once, so no rank
                ever waits on one blocked in a collective. The ``remaining -
                quota * world_size * batch_size`` samples left (under ``world_size *
                batch_size``) are dropped this epoch; every other sample comes once.
            drop_last: with ``lockstep``, False pads instead of dropping (as
                ``DistributedSampler``): ``quota`` is rounded up, every sample comes once, and
                the ranks that find the pool empty fill their last batches with samples they
                already had (fewer than ``world_size * batch_size`` repeats in all).

        Returns:
            A ``ShardStream``; each iteration walks the job's current epoch.

        Raises:
            DatasetNotFoundError: ``dataset`` is not registered (the message says how).
        """
        params = get_dataset(self.context, dataset)
        stream = ShardStream(
            self._host, params, self.batch_size if batch_size is None else batch_size, mode,
            track_consumption=track_consumption, wait_for_others=wait_for_others,
            lockstep=lockstep, drop_last=drop_last,
        )  # fmt: skip
        self._streams[params.name] = stream
        return stream

    # -- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(
        self,
        step: int,
        epoch: int,
        state: State = None,
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> Future[CheckpointInfo] | None:
        """Save this rank's part of checkpoint (epoch, step), in the background.

        The part holds ``state`` (or the ``state_provider``'s, or nothing) and this rank's data
        position in every dataset it iterates. The checkpoint commits when every rank of the
        round saved it; a rank whose epoch ended before ``step`` fills its part in at the
        epoch barrier (with its last saved state and position, or the provider's now).

        The checkpoint is named by the loop's numbers (``epoch_{E}_step_{S}``, with
        ``run_{R}_`` in front after a whole-job relaunch: ``checkpoint/ids.py``) and
        ordered by (run, epoch, step): the job's run goes up by one when the whole job is
        relaunched and resumes, so a loop that counts from step 0 again saves after the
        checkpoints of the launch before.

        Args:
            step: the loop's step (it may restart every epoch), ``0 <= step <= 2**53``.
            epoch: the loop's epoch, ``0 <= epoch <= 2**53`` (a warning once if it is not the
                job's epoch, ``orchestrator.epoch``).
            state: bytes, a buffer, or a mapping of part name -> buffer.
            metadata: JSON-able values recorded with the position.

        Returns:
            The save's future (``result()`` waits for the commit), or None when (epoch, step)
            is not after this worker's previous checkpoint in this run (a warning says so).

        Raises:
            TypeError, ValueError: a bad argument.
        """
        check_int("step", step, low=0, high=MAX_NUMBER)
        check_int("epoch", epoch, low=0, high=MAX_NUMBER)
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a mapping or None, got {type(metadata).__name__}")
        self._guard()
        job_epoch = self._job_epoch
        if epoch != job_epoch and not self._epoch_warned:
            # e.g. the seeds' `for epoch in range(2)` relaunched after a resume at epoch 1
            self._epoch_warned = True
            log.warning(
                "worker %r: the loop's epoch %d is not the job's epoch %d (start the loop at "
                "orchestrator.epoch after a resume); checkpoints record the loop's epoch",
                self.worker_id, epoch, job_epoch,
            )  # fmt: skip
        cid = self._rounds.checkpoint(step, epoch)
        if cid is None:
            log.warning(
                "worker %r: checkpoint (epoch=%d, step=%d) is not after its previous one %s; "
                "not saved", self.worker_id, epoch, step, self._rounds.last,
            )  # fmt: skip
            return None
        if state is None and self.state_provider is not None:
            state = self.state_provider()
        meta = {"epoch": epoch, "step": step, "run": cid.run, "round": self.round.number,
                "rank": self.rank, "worker": self.worker_id, "job_epoch": self._job_epoch,
                "metadata": dict(metadata or {})}  # fmt: skip
        parts = self._parts(state, meta)
        self._set_status("checkpointing")
        try:
            self._retry(self._rounds.announce, self.round.number, cid, job_epoch)
            future = self._submit(parts, cid)
            self._last_parts = parts
        finally:
            self._set_status("training")
        return future

    def _parts(self, state: State, meta: dict[str, Any]) -> dict[str, Any]:
        positions = [s.position for s in self._streams.values() if s.position is not None]
        parts: dict[str, Any] = {}
        if isinstance(state, Mapping):
            parts.update(state)
        elif state is not None:
            parts["model.bin"] = state
        if POSITION_PART in parts:
            raise ValueError(f"state must not have a part named {POSITION_PART!r} (reserved)")
        # Keep the bytes of this save: a fill at the epoch barrier may save them again.
        parts = {
            name: buf if isinstance(buf, bytes) else bytes(memoryview(buf).cast("B"))
            for name, buf in parts.items()
        }
        parts[POSITION_PART] = encode_positions(positions, meta)
        return parts

    def _submit(self, parts: dict[str, Any], cid: CheckpointId) -> Future[CheckpointInfo]:
        assert self._ckpt is not None
        # (save() reads the job's newest checkpoint before it queues anything: safe to retry)
        future = self._retry(self._ckpt.save, parts, step=cid.step, epoch=cid.epoch, run=cid.run)
        self._rounds.saved(cid)
        return future

    def _fill_checkpoints(self, new_epoch: int) -> None:
        """After the epoch barrier: save this rank's part of every checkpoint of the round
        that others opened in the finished epoch after this worker's last one (its epoch
        ended before their step)."""
        missed = self._retry(self._rounds.missed, self.round.number, new_epoch - 1)
        for cid in missed:
            if self.state_provider is not None or self._last_parts is None:
                state = None if self.state_provider is None else self.state_provider()
                meta = {"epoch": cid.epoch, "step": cid.step, "run": cid.run,
                        "round": self.round.number, "rank": self.rank,
                        "worker": self.worker_id, "filled": True,
                        "job_epoch": self._job_epoch - 1}  # fmt: skip
                parts = self._parts(state, meta)
            else:
                parts = self._last_parts
            try:
                self._submit(parts, cid)
            except (CheckpointError, ValueError) as exc:
                log.warning("worker %r: could not fill checkpoint %s: %s",
                            self.worker_id, cid, exc)  # fmt: skip

    def wait_for_checkpoints(self, timeout: float | None = None) -> None:
        """Wait until this worker's saves in flight are committed or failed."""
        if self._ckpt is not None:
            self._ckpt.wait(timeout)

    @property
    def checkpoints(self) -> CheckpointManager:
        """The current round's checkpoint manager (``list()``, ``load()``, ...)."""
        assert self._ckpt is not None
        return self._ckpt

    def load_state(self, name: str = "model.bin", rank: int | None = None) -> bytes | None:
        """A part of the checkpoint this job resumed from (None if it did not resume).

        Args:
            name: the part's name.
            rank: whose part (default: this worker's rank if the checkpoint has it, else 0).
        """
        info = self.resumed
        if info is None:
            return None
        if rank is None:
            rank = self.rank if self.rank < info.world_size else 0
        return self.checkpoints.load(
            info.step, name=name, rank=rank, epoch=info.epoch, run=info.run
        )

    # -- resume ---------------------------------------------------------------------------
    def _restore(self) -> None:
        """A fresh round: put the data position back to the newest verified checkpoint (or
        to the start of epoch 0 without one). Every member calls it; the first one does it."""
        ckpt = self.checkpoints
        positions: list[Position] = []
        # (storage is the truth: joining this fresh round rebuilt the index from it, so a
        # commit whose Redis mark was lost — AOF's last second, a flushed server — counts)
        for info in ckpt.list():
            try:
                parts = [
                    ckpt.load(info.step, name=POSITION_PART, rank=r, epoch=info.epoch,
                              run=info.run)
                    for r in range(info.world_size)
                ]  # fmt: skip
            except (CheckpointError, ValueError) as exc:
                log.warning("checkpoint %s cannot be resumed from: %s", info.label, exc)
                continue
            decoded = [decode_positions(raw) for raw in parts]
            positions = [p for ps, _ in decoded for p in ps]
            self.resumed, self.resumed_meta = info, decoded[0][1]
            break
        if self.resumed is not None and self.resumed.id not in self._rounds.held:
            self._warn_resumed_from_storage(self.resumed)
        epoch = int(self.resumed_meta.get("job_epoch", 0))
        epoch = positions[0].epoch if positions else epoch
        if positions and any(p.epoch != epoch for p in positions):
            raise CheckpointError(
                f"checkpoint {self.resumed.label if self.resumed else None} of job "
                f"{self.job_id!r} records positions of different epochs",
                job_id=self.job_id,
                step=self.resumed.step if self.resumed else None,
            )
        later = max(0, self._retry(current_epoch, self.context) - epoch) + 1
        datasets = self._retry(list_datasets, self.context)
        for params in datasets:
            done, offsets = merge_positions(p for p in positions if p.dataset == params.name)
            if self.resumed is not None:
                self.resumed_positions[params.name] = (epoch, done, offsets)
            restore_position(
                self.context, params, epoch, done, offsets, workers=list(self.round.members),
                mark=self.round.number, later_epochs=later,
            )  # fmt: skip
        if not datasets:
            self.context.client.set(self.context.keys.epoch, epoch)
        self._job_epoch = epoch
        log.info(
            "worker %r: resumed at epoch %d (run %d) from %s", self.worker_id, epoch,
            self._rounds.run,
            f"checkpoint {self.resumed.id}" if self.resumed else "the start (no checkpoint)",
        )  # fmt: skip

    def _warn_resumed_from_storage(self, info: CheckpointInfo) -> None:
        """Resuming from storage alone is never silent: Redis held no committed checkpoint
        state for it (a new or flushed Redis, or another job's storage reused)."""
        age_s = max(0.0, time.time() - info.acked_ms / 1000)
        log.warning(
            "worker %r: job %r resumes from checkpoint (epoch %s, step %d) found in storage "
            "only (Redis held no checkpoint state for the job): saved %s ago, at %s; use "
            "another job_id or checkpoint_path to start over", self.worker_id, self.job_id,
            info.epoch, info.step, _age(age_s), info.location,
        )  # fmt: skip

    # -- epochs ---------------------------------------------------------------------------
    def advance_epoch(self) -> int:
        """Meet the round's other members, then move the job to the next epoch.

        A barrier over this round's members (never a lone early worker). If the round
        breaks meanwhile, the survivors rendezvous again and meet in the new round
        (``elastic``). After it, this rank fills in the checkpoints of the epoch it missed,
        and the round is reviewed: workers waiting to join make the members rendezvous
        again before the next epoch.

        Returns:
            The new epoch (the same for every member).

        Raises:
            BarrierTimeoutError: members did not arrive within ``epoch_timeout``.
            RoundBrokenError: the round broke and ``elastic`` is False.
        """
        self._set_status("idle")
        while True:
            before = self.round
            self._guard()
            if self.round is not before:
                self._check_finished()
            round_ = self.round
            try:
                # a retried arrival counts once, so a Redis blip is retried here
                release = self._retry(self._epoch_barrier(round_).wait, self.worker_id)
                break
            except BarrierBrokenError as exc:
                try:
                    self.rendezvous.check(round_)
                except RoundBrokenError as broken:
                    if round_ is self.round:
                        self._broken = broken
                    if not self.elastic:
                        raise broken from exc
                    continue
                raise
        epoch = release.epoch
        assert epoch is not None
        self._job_epoch = epoch
        self._fill_checkpoints(epoch)
        if not self._retry(self.rendezvous.review, self.round, epoch) and self._broken is None:
            # Workers are waiting (or the round broke): the next step rendezvouses again.
            self._broken = RoundBrokenError.because(
                self.job_id, self.round.number, "", "superseded"
            )
        return epoch

    def _check_finished(self) -> None:
        """After a round change at the epoch barrier: a walk that ended without waiting for
        others' last shards must not let the epoch advance with a dead member's undone."""
        for stream in self._streams.values():
            undone = stream.undone()
            if undone:
                assert stream.position is not None
                raise EpochUnfinishedError.at_barrier(
                    self.job_id, stream.params.name, stream.position.epoch, undone
                )

    # -- plumbing -------------------------------------------------------------------------
    def _set_status(self, status: str) -> None:
        if status == self._status:
            return
        try:
            self.worker.set_status(status)
            self._status = status
        except (redis_py.ConnectionError, redis_py.TimeoutError) as exc:
            log.info("worker %r: status %r not recorded: %s", self.worker_id, status, exc)

    def _retry(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call ``fn``, retrying while Redis is unreachable (up to ``redis_retry`` seconds)."""
        deadline = time.monotonic() + self.redis_retry
        delay = 0.05
        while True:
            try:
                return fn(*args, **kwargs)
            except (redis_py.ConnectionError, redis_py.TimeoutError) as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("worker %r: Redis unreachable (%s); retrying", self.worker_id, exc)
                time.sleep(delay)
                delay = min(1.0, delay * 2)

    def close(self) -> None:
        """Leave cleanly: wait for the saves in flight, stop heartbeats, deregister."""
        if self._closed:
            return
        self._closed = True
        worker = getattr(self, "worker", None)
        if self._ckpt is not None:
            if worker is not None and worker.lost is not None:
                # no other rank can complete this one's open steps now: fail them at once
                self._ckpt.abort_pending(f"worker {self.worker_id!r} is out: {worker.lost}")
            self._ckpt.close(wait=True)
        for old in self._old_ckpts:
            old.close(wait=False)
        if worker is not None:
            worker.on_generation = None
            worker.leave()
        if self._owns_storage:
            self.storage.close()
        if self._owns_client:
            self.context.close()

    def __enter__(self) -> TrainingOrchestrator:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

"""``TrainingOrchestrator``: the training loop's one handle, composing this package's parts.

It checks its arguments, registers the worker, joins the first round and resumes; its public
methods hand each concern to one collaborator: the rounds (``rounds.py``), the saves
(``saves.py``), preemption's way out (``stopping.py``), the status shown (``shown.py``), the
streams' host (``host.py``), leaving (``leaving.py``).

The parts never import one another (the layers contract); at run time they reach one
another only through the orchestrator they are given, as follows: the saves and the stop
call the rounds' check (``_member.guard``); the saves, the rounds, the host and leaving
tell the status shown; the rounds have the saves write a data position for a checkpoint
they fill in; the host's per-step check is the stop's (``_stopping.step_guard``).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

import redis as redis_py

from .. import identity
from ..checkpoint.ids import MAX_NUMBER
from ..checkpoint.manager import CheckpointManager
from ..checkpoint.manifest import CheckpointInfo
from ..checkpoint.rounds import RoundCheckpoints
from ..context import HasContext, JobContext
from ..coordination.epochs import current_epoch
from ..coordination.rendezvous import Rendezvous, Round, RoundWatch
from ..coordination.workers import Worker, register_worker
from ..data.datasets import get_dataset
from ..data.stream import ShardStream
from ..errors import RoundBrokenError
from ..launch import hosts_warning, start_line
from ..outage import ride_out
from ..preemption import DEFAULT_BUDGET_S, Preemption, parse_signals
from ..resume import Resume
from ..storage import Storage, open_storage
from ..validate import check_id, check_int, check_seconds
from .host import LoopHost
from .leaving import leave
from .rounds import RoundMember
from .saves import Saves
from .shown import ShownStatus
from .stopping import Stopping

__all__ = ["TrainingOrchestrator"]

# the loop's logger, for every module of the loop (``docs/reference/environment.md``)
log = logging.getLogger("strata_redis.orchestrator")
T = TypeVar("T")

#: what ``state`` may be: a buffer, or a mapping of part name -> buffer
State = Any


class TrainingOrchestrator:
    """One training worker's handle: rendezvous, batches from leased shards, checkpoints.

    Args:
        coordinator_url: the Redis (URL, ``host:port``, ``redis.Redis`` or a ``Job``).
        worker_id: this worker's id (unique in the job; a restarted process reuses it).
            None derives one per process (``identity.worker_id``): the host name and
            torchrun's rank (``gpu-a-rank-3``, the same after a restart of the rank), else
            the host name and the pid (``gpu-a-pid-4242``).
        job_id: the job; default ``$STRATA_JOB_ID``, else torchrun's ``TORCHELASTIC_RUN_ID``,
            else one derived from the main script's content and its arguments
            (``<script>-<8 hex>``: every process of the command derives it wherever it runs,
            a relaunch reproduces it, other arguments do not; ``identity.job_id``; a WARNING
            when such a job has live workers on other hosts, ``launch.hosts_warning``): the
            same as every other entry point of the process takes
            (a ``ShardManager(url)`` made before it registers in this job). With a ``Job`` or
            context as ``coordinator_url``: its job.
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
        redis_retry: seconds the loop keeps retrying while Redis is unreachable, or the
            storage while a fresh round reads the checkpoint it resumes from (and, with
            ``durability="replicated"``, waits for a replica to confirm a call).
        durability: ``"replicated"``: each shard completion, lease call and checkpoint
            commit is acknowledged only once a replica confirmed it (``NotReplicatedError``
            stops the loop, the shard not counted, when none did within ``redis_retry``);
            ``"default"`` does not wait. Default: the ``Job``'s given as
            ``coordinator_url``, else ``$STRATA_DURABILITY``, else ``"default"``. See
            ``strata_redis.durability``.
        replace: take over ``worker_id`` even if its holder looks alive (a restarted
            process). None: only when torchrun says this process is a restart
            (``TORCHELASTIC_RESTART_COUNT`` > 0). A stale holder (silent past the heartbeat
            timeout, or its process gone on this host: a dead rank relaunched under its id)
            is taken over in any case; one that looks alive raises ``WorkerExistsError``
            naming its host and pid, and is left untouched.
        job_retention: seconds the job's keys are kept in Redis once it ended (default
            ``$STRATA_JOB_RETENTION``, else 3 days). The job ends when its last rank closes
            after the loop's last epoch (see ``close``).
        preempt_signals: the signals that preempt the loop (names or numbers, or a
            comma-separated string; empty: none). None: ``$STRATA_PREEMPT_SIGNALS``, else
            SIGTERM. Handled only when the orchestrator is made on the main thread; see
            ``preempted``, ``should_stop``, ``preempt_exit`` and ``strata_redis.preemption``.
        preempt_budget: seconds from the preemption signal for the checkpoint to commit
            (default 25: a 30 s spot notice with room to leave); past it the save is abandoned
            and ``Preempted`` exits with 75 instead of 0.

    Raises:
        TypeError, ValueError: a bad argument, named in the message (nothing is written).
        WorkerExistsError: ``worker_id``'s holder looks alive, and ``replace`` is not set.
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
        job_retention: float | None = None,
        durability: str | None = None,
        preempt_signals: str | Iterable[int | str] | None = None,
        preempt_budget: float = DEFAULT_BUDGET_S,
    ) -> None:
        # Every argument is checked before anything is written to Redis or storage.
        signals = parse_signals(preempt_signals)
        preempt_budget = check_seconds("preempt_budget", preempt_budget, high=86400)
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
        self.context = JobContext(
            coordinator_url, job_id, heartbeat_timeout=heartbeat_timeout,
            retention=job_retention, redis_retry=self.redis_retry, durability=durability,
        )  # fmt: skip
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

        # the collaborators (this package's modules), each one concern, sharing this state
        self._status = ShownStatus(self.worker_id)  # shown.py
        self._member = RoundMember(self)  # rounds.py: the round, the epoch barrier
        self._saves = Saves(self)  # saves.py
        self._stopping = Stopping(self)  # stopping.py: preemption's way out
        self._host = LoopHost(self)  # host.py: what the streams' walks see
        self._streams: dict[str, ShardStream] = {}
        self.round: Round  # set by the first join (``RoundMember.join``)
        self._watch = RoundWatch(self.rendezvous, self.worker_id, self._member.on_broken)
        # the job's run, the round's checkpoints, the fill-ins (checkpoint/rounds.py)
        self._rounds = RoundCheckpoints(
            self.context, self.storage, self._retry, worker_id=self.worker_id,
            keep_count=self.keep_count, commit_timeout=self.commit_timeout,
            state_provider=state_provider, storage_wait=self.redis_retry,
        )  # fmt: skip
        self._job_epoch = 0  # the job's epoch as this worker last saw it
        self._closed = False
        # the loop's last call was advance_epoch (no walk began since): a clean close ends
        # the job when this is its last live worker
        self._between_epochs = False
        self._resume: Resume | None = None  # a fresh round's (resume.py)

        self.worker: Worker = register_worker(
            self.context, self.worker_id, replace=replace, heartbeat_interval=heartbeat_interval
        )
        self._status.worker = self.worker
        # the handlers go in once nothing can fail before the try below (close puts them back)
        self._preemption = Preemption(signals, preempt_budget)
        try:
            self._member.join(leaving=0)
            if self.round.fresh and resume:
                self._resume = Resume(
                    self.context, self.checkpoints, self.round, self._rounds.held,
                    self.worker_id, self._retry, storage_wait=self.redis_retry,
                )  # fmt: skip
                self._job_epoch = self._resume.restore_all()
            else:
                self._job_epoch = self._retry(current_epoch, self.context)
                if not self.round.fresh:
                    # joined a running job (relaunched under its id, or in a dead member's
                    # place) mid-epoch: its loop counts from 0, the others' are far on
                    self._retry(self._rounds.line_up, self.round.number, self._job_epoch)
            self._announce(job_id is None and not isinstance(coordinator_url, HasContext))
        except BaseException:
            self.close()
            raise
        self.worker.on_generation = self._watch.on_generation

    def _announce(self, defaulted: bool) -> None:
        """Log the loop's line at start (``launch.start_line``), and warn when a job id this
        process derived (``defaulted``: none was given) has live workers on other hosts."""
        log.info(
            "%s",
            start_line(
                self.context, self.worker_id, self.rank, self.world_size, self.storage,
                epoch=self._job_epoch, resumed=self.resumed, fresh=self.round.fresh,
            ),
        )  # fmt: skip
        if defaulted and self.job_id == identity.derived_job():
            warning = self._retry(hosts_warning, self.context, socket.gethostname())
            if warning is not None:
                log.warning("%s", warning)

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
    def resumed(self) -> CheckpointInfo | None:
        """The checkpoint this worker's fresh round resumed from (None: it did not)."""
        return None if self._resume is None else self._resume.info

    @property
    def resumed_positions(self) -> dict[str, tuple[int, set[int], dict[int, int]]]:
        """Dataset -> (epoch, shards done, shard -> offset) restored from ``resumed``."""
        return {} if self._resume is None else self._resume.positions

    @property
    def epoch(self) -> int:
        """The job's current epoch (one Redis read; a Redis restart or failover shorter than
        ``redis_retry`` is ridden out)."""
        return self._retry(current_epoch, self.context)

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
        lease_ahead: int = 0,
    ) -> ShardStream:
        """This worker's batches of ``dataset``: iterate it once per epoch.

        Args:
            dataset: a registered dataset's name.
            batch_size: samples per batch (default: the orchestrator's).
            mode: ``"leases"`` (default) or ``"static"``.
            track_consumption: the position moves (and leases complete) only as
                ``ShardStream.consumed()`` reports batches taken by the training step (for
                loaders that prefetch); by default, as batches are yielded.
            wait_for_others: at the epoch's end, wait while others hold the last shards
                (default); False ends an iteration once nothing can be leased now — for
                loops whose members meet in collectives every step (DDP). Then
                ``advance_epoch`` raises ``EpochUnfinishedError`` if the round changed
                while shards were left undone.
            lockstep: every member of the round gets the same number of full batches this
                epoch (DDP without ``Join``; ``data/walks/lockstep.py``).
            drop_last: with ``lockstep``, False pads instead of dropping.
            lease_ahead: shards a thread of the walk holds leased ahead and whose
                completions it sends (``mode="leases"``, not ``lockstep``): the loop's thread
                then makes no Redis round trip per shard (0..4; default 0).

        Returns:
            A ``ShardStream`` (its docstring details each option); each iteration walks the
            job's current epoch.

        Raises:
            DatasetNotFoundError: ``dataset`` is not registered (the message says how).
        """
        params = self._retry(get_dataset, self.context, dataset)
        if self._resume is not None and self._resume.round == self.round.number:
            self._resume.restore(params)  # (registered after the round closed: now)
        stream = ShardStream(
            self._host, params, self.batch_size if batch_size is None else batch_size, mode,
            track_consumption=track_consumption, wait_for_others=wait_for_others,
            lockstep=lockstep, drop_last=drop_last, lease_ahead=lease_ahead,
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

        A worker that joined the running job mid-epoch (a rank relaunched under its old id,
        or a replacement for a dead member) takes the round's step: in that epoch its loop's
        step ``s`` is checkpoint step ``B + s``, ``B`` being the epoch's newest checkpoint
        when it joined (its step 0 is ``B`` itself, saved by the others already: None is
        returned), so its next save is the others' next one and commits with theirs
        (``checkpoint/rounds.py``). From the next epoch on, steps are the loop's own again.

        Args:
            step: the loop's step (it may restart every epoch), ``0 <= step <= 2**53``.
            epoch: the loop's epoch, ``0 <= epoch <= 2**53`` (a warning once if it is not the
                job's epoch, ``orchestrator.epoch``).
            state: bytes, a buffer, or a mapping of part name -> buffer (or ->
                ``checkpoint.snapshot.DeferredPart``, made on the upload thread).
            metadata: JSON-able values recorded with the position.

        Returns:
            The save's future (``result()`` waits for the commit), or None when (epoch, step)
            is not after this worker's previous checkpoint in this run (a warning says so),
            or is the step a mid-epoch joiner took from the round (see above).

        Raises:
            TypeError, ValueError: a bad argument.
        """
        return self._saves.save(step, epoch, state, metadata)

    def wait_for_checkpoints(self, timeout: float | None = None) -> None:
        """Wait until this worker's saves in flight are committed or failed."""
        self._saves.wait(timeout)

    @property
    def checkpoints(self) -> CheckpointManager:
        """The current round's checkpoint manager (``list()``, ``load()``, ...)."""
        assert self._rounds.manager is not None
        return self._rounds.manager

    def load_state(self, name: str = "model.bin", rank: int | None = None) -> bytes | None:
        """A part of the checkpoint this job resumed from (None if it did not resume).

        Args:
            name: the part's name.
            rank: whose part (default: this worker's rank if the checkpoint has it, else 0).

        A storage outage is ridden out for up to ``redis_retry`` seconds (then
        ``StorageError``).
        """
        return self._saves.load(name, rank)

    @property
    def closed(self) -> bool:
        """Whether ``close`` ran (the worker left, or began to)."""
        return self._closed

    @property
    def round_broken(self) -> RoundBrokenError | None:
        """Why the current round is over, as the heartbeat thread saw it (a member declared
        failed or left, the round superseded), a flag read; None while it is whole."""
        return self._watch.broken

    # -- preemption -----------------------------------------------------------------------
    @property
    def preempted(self) -> bool:
        """A preemption signal came (``preempt_signals``), or ``request_preemption`` was
        called: a flag read, for the loop (or a framework's callback) at each step."""
        return self._preemption.requested

    def request_preemption(self) -> None:
        """Act as if a preemption signal came now (e.g. a cloud's notice read another way)."""
        self._preemption.request()

    def should_stop(self, step: int) -> bool:
        """Whether the loop stops after ``step`` (the step it just finished) to save and leave.

        False with no preemption (a flag read). Once preempted, the round agrees on a stop
        step (the first signalled member proposes the step after its current one; one Redis
        call the first time, a flag read after): True from that step on. Call it at every
        step boundary with the step you pass to ``save_checkpoint``; when True, call
        ``preempt_exit``. A loop that never calls it is stopped by the orchestrator's own
        check at its next batch (saving ``state_provider``'s state); once called, that check
        stands aside (the loop's step numbers, not the walk's batch count, are agreed on).
        """
        return self._stopping.should_stop(step)

    def preempt_exit(
        self,
        step: int,
        epoch: int,
        state: State = None,
        *,
        save: Callable[[], Future[Any] | None] | None = None,
    ) -> None:
        """Save checkpoint (``epoch``, ``step``) within the budget, release the leases at
        the data position, leave the round, deregister, and raise ``Preempted``.

        Args:
            step: as for ``save_checkpoint`` (the step ``should_stop`` said True to).
            epoch: as for ``save_checkpoint``.
            state: as for ``save_checkpoint`` (None: the ``state_provider``'s).
            save: instead of ``save_checkpoint(step, epoch, state)``, a callable that starts
                the save (a framework's, through strata: ``strata_redis.torch.save``, a
                ``CheckpointIO``) and returns its future (None: it saved synchronously, or
                there was nothing to save). Its commit is awaited within the budget.

        Raises:
            Preempted: always (a ``SystemExit``): code 0 when the checkpoint committed within
                ``preempt_budget``, else 75 (``preemption.EXIT_BUDGET_EXCEEDED``): the save was
                aborted (never commits: the relaunch resumes from the one before), and the
                leases were released and the worker left all the same.
        """
        self._stopping.exit(step, epoch, state, save)

    # -- epochs ---------------------------------------------------------------------------
    def epochs(self, count: int) -> Iterator[int]:
        """The job's epochs from where it is up to ``count - 1``: the loop's outer iterator.

        ::

            for epoch in orchestrator.epochs(2):
                for step, batch in enumerate(shard_info):
                    ...
                orchestrator.advance_epoch()

        A fresh job yields 0 and 1; relaunched after a resume in epoch 1 it yields 1 only,
        so the loop trains the epochs it names, however often it is relaunched (``for epoch
        in range(2)`` would train two more after a resume, and a checkpoint's epoch would be
        the loop's, not the job's: a warning says so). A body that does not end with
        ``advance_epoch()`` has it called for it (the epochs still meet at the barrier).

        Args:
            count: how many epochs the job trains in all (``0 <= count <= 2**53``).

        Yields:
            The job's epoch (``orchestrator.epoch``), each once.
        """
        check_int("count", count, low=0, high=MAX_NUMBER)
        epoch = self._job_epoch
        while epoch < count:
            yield epoch
            if self._job_epoch <= epoch:  # the body did not advance: advance for it
                self.advance_epoch()
            epoch = self._job_epoch

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
        return self._member.advance()

    # -- plumbing -------------------------------------------------------------------------
    def _retry(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call ``fn``, calling it again once Redis answers after an outage (each outage up
        to ``redis_retry`` seconds, then ``RedisUnavailableError``; ``outage.ride_out``)."""
        what = f"worker {self.worker_id!r}: {getattr(fn, '__name__', 'a call')}"
        return ride_out(self.context, what, fn, *args, **kwargs)

    def close(self, *, end: bool | None = None) -> None:
        """Leave cleanly: wait for the saves in flight, stop heartbeats, deregister.

        Then, if this was the job's last live worker, end the job (its keys expire after
        ``job_retention``; ``Job.end``): by default when the loop's last call was
        ``advance_epoch`` (the loop finished its epochs) and the worker was not lost; never
        when leaving a ``with`` block by an exception. A relaunch opens the job again.

        Args:
            end: True: end the job if this is its last live worker, whatever the loop did;
                False: never end it; None: as above.
        """
        if self._closed:
            return
        self._closed = True
        # the process's signal handlers are put back first: a SIGTERM while this closes (a
        # torchrun agent tearing down a failed group) ends the process as it did before the
        # loop began, instead of a flag nobody reads any more (the agent's SIGKILL 30 s on,
        # the rank a member all that while)
        preemption = getattr(self, "_preemption", None)
        if preemption is not None:
            preemption.close()
        leave(self, end)

    def __enter__(self) -> TrainingOrchestrator:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(end=False if exc_type is not None else None)

"""The round-scoped checkpoint protocol: the job's run, the checkpoints a round opened, fill-ins.

``TrainingOrchestrator`` composes one ``RoundCheckpoints`` per worker: it holds the round's
``CheckpointManager`` (one per round: a round fixes the rank and the world size; the previous
round's saves go on committing in the background, or are aborted when a member is gone), saves
this rank's parts (the loop's state and a reserved part the caller gives: its data position),
and owns two keys:

- ``keys.checkpoint_run``: the job's **run** (``ids.py``). A fresh rendezvous round (every
  member new: the whole job launched or relaunched) starts a run once for all its members
  (``start_checkpoint_run.lua``): 0 for the job's first launch, else the newest committed
  checkpoint's run + 1 (never less than the previous run + 1). On an empty Redis the index
  is rebuilt from storage first, so the run is derived from storage the same way. Elastic
  round changes within a launch keep the run: the loop keeps counting its steps.
- ``keys.round_checkpoints(R)``: the checkpoints opened in round R (index member -> the
  job's epoch they were opened in). A rank whose epoch ended before another rank's
  checkpoint (it had fewer batches) saves its part of it after the epoch barrier
  (``missed``), so the checkpoint can commit.

A process that joins its run mid-epoch (a rank relaunched under its old worker id, or a
replacement for a dead member, in a round that is not fresh) has a loop that counts from
step 0 while the others' loops are far on: it **takes the round's step** (``line_up``). The
newest checkpoint of the epoch opened or committed in the run (the round before's
announcements, the index) is its **base**: this worker's loop step ``s`` of that epoch is
checkpoint step ``base + s`` (its step 0, the base itself, was saved by the others already
and is skipped), so its next save is the others' next one and commits with them. The round
before's checkpoints that did not commit are aborted then (their parts were saved in a round
that is over), so none waits out ``commit_timeout``. From the next epoch on every loop
counts from 0 alike and the base is dropped. A committed checkpoint still holds every rank's
state at the same point of the epoch's checkpoint count, all saved in one round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from ..context import JobContext
from ..errors import CheckpointError
from ..storage import Storage, as_byte_view, retrying
from .ids import CheckpointId
from .index import CheckpointIndex
from .manager import CheckpointManager
from .manifest import CheckpointInfo, check_part_name
from .reader import CheckpointReader
from .snapshot import DeferredPart

__all__ = ["RoundCheckpoints", "loop_parts"]

log = logging.getLogger("strata_redis.checkpoint")

#: a reserved part: (name, bytes), e.g. the data position a rank saves with its state
Part = tuple[str, bytes]
#: a loop's parts: name -> bytes, or a part made on the upload thread (``DeferredPart``)
LoopParts = dict[str, bytes | DeferredPart]

#: a round's checkpoint announcements expire this long after their last write (ms)
ANNOUNCE_TTL_MS = 86_400_000


def loop_parts(state: object, extra: Part) -> LoopParts:
    """A loop's parts of a checkpoint: ``state`` (bytes, a buffer, a mapping of part name ->
    buffer, or None: nothing) as bytes the caller may keep (a fill-in saves them again),
    and the reserved part ``extra``. A ``DeferredPart`` value is kept as it is (a fill-in
    holds it again, which fails, and is skipped with a warning, once its source was reused).

    Raises:
        TypeError: a part is not plain bytes-like data (an object array holds pointers).
        ValueError: a bad part name, or ``extra``'s name in ``state``.
    """
    if isinstance(state, Mapping):
        items = list(state.items())
    else:
        items = [] if state is None else [("model.bin", state)]
    parts: LoopParts = {}
    for name, buf in items:
        check_part_name(name, arg="state part name")
        if name == extra[0]:
            raise ValueError(f"state must not have a part named {extra[0]!r} (reserved)")
        if isinstance(buf, DeferredPart):  # made on the upload thread; held while saved
            parts[name] = buf
            continue
        view = as_byte_view(buf, arg=f"state[{name!r}]" if isinstance(state, Mapping) else "state")
        parts[name] = buf if type(buf) is bytes else bytes(view)
    parts[extra[0]] = extra[1]
    return parts


class RoundCheckpoints:
    """One worker's side of the round-scoped checkpoint protocol.

    Args:
        ctx: the job.
        storage: the job's checkpoint storage (a fresh round's run is derived from it).
        retry: calls a function, retrying while Redis is unreachable (the orchestrator's).
        worker_id: this worker.
        keep_count: committed checkpoints kept (each round's manager prunes to it).
        commit_timeout: seconds a checkpoint waits for the other ranks' parts.
        state_provider: what a fill-in saves as the state, when given (else the last save's).

    Attributes:
        run: the job's run this worker saves in.
        last: the newest checkpoint this worker saved (or filled in) in this run.
        base: when this process joined its run mid-epoch, the round's checkpoint its loop's
            step 0 of that epoch stands for (``line_up``); None otherwise.
        held: at a fresh round, the committed checkpoints Redis held before the index was
            rebuilt from storage (a resume from one not in it came from storage alone).
    """

    def __init__(
        self,
        ctx: JobContext,
        storage: Storage,
        retry: Callable[..., Any] | None = None,
        *,
        worker_id: str = "worker",
        keep_count: int = 5,
        commit_timeout: float = 300.0,
        state_provider: Callable[[], object] | None = None,
        storage_wait: float = 0.0,
    ) -> None:
        self.context = ctx
        self.storage_wait = storage_wait  # seconds a storage outage is ridden out at a join
        self.storage = storage
        self._retry: Callable[..., Any] = retry or (lambda fn, *a, **kw: fn(*a, **kw))
        self.worker_id, self.keep_count, self.commit_timeout = worker_id, keep_count, commit_timeout
        self.state_provider = state_provider
        self.run = 0
        self.last: CheckpointId | None = None
        self.base: CheckpointId | None = None
        self.held: set[CheckpointId] = set()
        self.manager: CheckpointManager | None = None  # the current round's
        self._old: list[CheckpointManager] = []
        self._last_parts: LoopParts | None = None  # the last save's, for fill-ins

    def join(
        self, round_: int, fresh: bool, rank: int = 0, world_size: int = 1, *, abort: str = ""
    ) -> int:
        """Take the job's run for round ``round_`` and a manager for this rank in it: a fresh
        round starts the next run (once, for every member), any other round keeps the
        current one. The previous round's open saves are aborted with reason ``abort`` (a
        member is gone: they can never commit), else they commit in the background.
        Returns the run.

        A fresh round rebuilds the index from storage first: storage is the truth, so a
        checkpoint whose Redis mark was lost (a flushed server) still counts. A storage
        outage is ridden out for up to ``storage_wait`` seconds (``storage.outage``).
        """
        if self.manager is not None:
            if abort:
                self.manager.abort_pending(abort)
            self.manager.close(wait=False)
            self._old.append(self.manager)
        self.manager = CheckpointManager(
            self.storage, self.keep_count, job_id=self.context.job_id, redis=self.context,
            worker_id=self.worker_id, rank=rank, world_size=world_size,
            commit_timeout=self.commit_timeout,
        )  # fmt: skip
        keys = self.context.keys
        if fresh:
            index = CheckpointIndex(self.context)
            self.held = set(self._retry(index.ids))
            rebuild = CheckpointReader(self.storage, self.context).rebuild_index
            self._retry(retrying, f"worker {self.worker_id!r} reading its job's checkpoints",
                        self.storage_wait, rebuild)  # fmt: skip
            newest = self._retry(index.newest)
            candidate = 0 if newest is None else newest.run + 1
            (run,) = self._retry(
                self.context.scripts.run, "start_checkpoint_run", [keys.checkpoint_run],
                [round_, candidate], {"job_id": self.context.job_id},
            )  # fmt: skip
        else:
            run = self._retry(self.context.client.hget, keys.checkpoint_run, "run") or 0
        run = int(run)
        if run != self.run:
            self.last = self.base = None  # a new run: the loop counts from its start again
        self.run = run
        return run

    def line_up(self, round_: int, job_epoch: int) -> CheckpointId | None:
        """This process joined its run in round ``round_``, not fresh, during the job's epoch
        ``job_epoch``: take the round's step. The newest checkpoint of ``job_epoch`` in this
        run, opened in the round before or committed, becomes ``base`` (and ``last``): the
        loop's step ``s`` of that epoch is checkpoint step ``base + s``. The round before's
        checkpoints that did not commit are aborted: they can never commit now (the member
        this process replaces, or the dead one it stands in for, saved its part in a round
        that is over), so a member that saves one of them again fails at once instead of
        waiting out ``commit_timeout``. Checkpoints opened in ``round_`` itself (the others
        may save before this call) are left alone: this worker takes part in them.
        Call it once, after the process's first ``join``, before its first save.

        Returns:
            The base, or None when the epoch has no checkpoint in this run yet (the loop's
            steps are the checkpoint steps, as the others' are).
        """
        assert self.manager is not None
        index = CheckpointIndex(self.context)
        committed = set(index.ids())
        before = self.context.keys.round_checkpoints(max(round_ - 1, 0))
        opened = []
        for member in self.context.client.zrangebyscore(before, job_epoch, job_epoch):
            try:
                opened.append(CheckpointId.from_member(member))
            except ValueError:
                continue
        opened = [c for c in opened if c.run == self.run and c.epoch == job_epoch]
        for cid in opened:
            if cid not in committed:
                self.manager.protocol.abort(
                    cid, f"worker {self.worker_id!r} joined round {round_} mid-epoch: round "
                    f"{round_ - 1}, which opened the checkpoint, is over",
                )  # fmt: skip
        here = opened + [c for c in committed if c.run == self.run and c.epoch == job_epoch]
        if not here:
            return None
        self.base = max(here)
        if self.last is None or self.base > self.last:
            self.last = self.base
        log.info(
            "worker %r joined run %d mid-epoch: its loop's step 0 of epoch %d is checkpoint %s",
            self.worker_id, self.run, job_epoch, self.base,
        )  # fmt: skip
        return self.base

    def checkpoint(self, step: int, epoch: int) -> CheckpointId | None:
        """The id of the loop's (epoch, step) in this run (in the epoch it lined up in, from
        ``base`` on), or None when it is not after this worker's last checkpoint (it must not
        be saved again).

        Raises:
            ValueError: ``base`` + ``step`` is past ``MAX_NUMBER``.
        """
        base = self.base
        if base is not None and epoch == base.epoch:
            step += base.step
        cid = CheckpointId(step, epoch, self.run)
        return None if self.last is not None and cid <= self.last else cid

    def announce(self, round_: int, cid: CheckpointId, job_epoch: int) -> None:
        """Record that ``cid`` was opened in round ``round_`` during the job's ``job_epoch``,
        so ranks whose epoch ended before it fill it in (``missed``)."""
        key = self.context.keys.round_checkpoints(round_)
        with self.context.client.pipeline(transaction=False) as pipe:
            pipe.zadd(key, {cid.member: job_epoch})
            pipe.pexpire(key, ANNOUNCE_TTL_MS)
            pipe.execute()

    def save(self, round_: int, cid: CheckpointId, job_epoch: int, parts: LoopParts
             ) -> Future[CheckpointInfo]:  # fmt: skip
        """Announce ``cid`` in round ``round_`` and save this rank's ``parts`` of it (from
        ``loop_parts``) in the background; the future's result is the commit."""
        self._retry(self.announce, round_, cid, job_epoch)
        future = self._submit(parts, cid)
        self._last_parts = parts
        return future

    def _submit(self, parts: LoopParts, cid: CheckpointId) -> Future[CheckpointInfo]:
        assert self.manager is not None
        # (save() reads the job's newest checkpoint before it queues anything: safe to retry)
        future: Future[CheckpointInfo] = self._retry(
            self.manager.save, parts, step=cid.step, epoch=cid.epoch, run=cid.run
        )
        if self.last is None or cid > self.last:
            self.last = cid
        return future

    def fill(self, round_: int, finished_epoch: int, position: Callable[[CheckpointId], Part]
             ) -> None:  # fmt: skip
        """After the epoch barrier of ``finished_epoch``: save this rank's part of every
        checkpoint of the round others opened in that epoch after this worker's last one
        (its epoch ended before their step): the provider's state now and ``position(cid)``,
        else the last save's parts."""
        for cid in self._retry(self.missed, round_, finished_epoch):
            if self.state_provider is not None or self._last_parts is None:
                state = None if self.state_provider is None else self.state_provider()
                parts = loop_parts(state, position(cid))
            else:
                parts = self._last_parts
            try:
                self._submit(parts, cid)
            except (CheckpointError, ValueError) as exc:
                log.warning("worker %r: could not fill checkpoint %s: %s",
                            self.worker_id, cid, exc)  # fmt: skip

    def abort_pending(self, reason: str) -> list[CheckpointId]:
        """Abort this round's open saves (none of them can commit now)."""
        return [] if self.manager is None else self.manager.abort_pending(reason)

    def close(self, abort: str = "") -> None:
        """Wait for this round's saves (after aborting them with reason ``abort``, when
        given); stop the older rounds' managers."""
        if self.manager is not None:
            if abort:
                self.manager.abort_pending(abort)
            self.manager.close(wait=True)
        for old in self._old:
            old.close(wait=False)

    def missed(self, round_: int, finished_epoch: int) -> list[CheckpointId]:
        """The checkpoints of round ``round_`` opened before the job's epoch ``finished_epoch``
        ended and after this worker's last one (in this run), oldest first: this worker's
        epoch ended before them. Call it after the epoch barrier of ``finished_epoch``.

        Announcements of epochs before ``finished_epoch`` are trimmed: every member passed
        their fill-ins before it arrived at this barrier.
        """
        key = self.context.keys.round_checkpoints(round_)
        with self.context.client.pipeline(transaction=False) as pipe:
            pipe.zrangebyscore(key, "-inf", finished_epoch)
            pipe.zremrangebyscore(key, "-inf", f"({finished_epoch}")
            members, _ = pipe.execute()
        out = []
        for member in members:
            try:
                cid = CheckpointId.from_member(member)
            except ValueError:
                continue
            if cid.run == self.run and (self.last is None or cid > self.last):
                out.append(cid)
        return sorted(out)

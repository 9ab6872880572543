"""The round-scoped checkpoint protocol: the job's run, the checkpoints a round opened, fill-ins.

``TrainingOrchestrator`` composes one ``RoundCheckpoints`` per worker; it owns two keys:

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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..context import JobContext
from ..storage import Storage
from .ids import CheckpointId
from .index import CheckpointIndex
from .reader import CheckpointReader

__all__ = ["RoundCheckpoints"]

#: a round's checkpoint announcements expire this long after their last write (ms)
ANNOUNCE_TTL_MS = 86_400_000


class RoundCheckpoints:
    """One worker's side of the round-scoped checkpoint protocol.

    Args:
        ctx: the job.
        storage: the job's checkpoint storage (a fresh round's run is derived from it).
        retry: calls a function, retrying while Redis is unreachable (the orchestrator's).

    Attributes:
        run: the job's run this worker saves in.
        last: the newest checkpoint this worker saved (or filled in) in this run.
        held: at a fresh round, the committed checkpoints Redis held before the index was
            rebuilt from storage (a resume from one not in it came from storage alone).
    """

    def __init__(
        self, ctx: JobContext, storage: Storage, retry: Callable[..., Any] | None = None
    ) -> None:
        self.context = ctx
        self.storage = storage
        self._retry: Callable[..., Any] = retry or (lambda fn, *a, **kw: fn(*a, **kw))
        self.run = 0
        self.last: CheckpointId | None = None
        self.held: set[CheckpointId] = set()

    def join(self, round_: int, fresh: bool) -> int:
        """Take the job's run for round ``round_``: a fresh round starts the next run (once,
        for every member), any other round keeps the current one. Returns the run.

        A fresh round rebuilds the index from storage first: storage is the truth, so a
        checkpoint whose Redis mark was lost (a flushed server) still counts.
        """
        keys = self.context.keys
        if fresh:
            index = CheckpointIndex(self.context)
            self.held = set(self._retry(index.ids))
            self._retry(CheckpointReader(self.storage, self.context).rebuild_index)
            newest = index.newest()
            candidate = 0 if newest is None else newest.run + 1
            (run,) = self._retry(
                self.context.scripts.run, "start_checkpoint_run", [keys.checkpoint_run],
                [round_, candidate], {"job_id": self.context.job_id},
            )  # fmt: skip
        else:
            run = self._retry(self.context.client.hget, keys.checkpoint_run, "run") or 0
        run = int(run)
        if run != self.run:
            self.last = None  # a new run: the loop counts from its start again
        self.run = run
        return run

    def checkpoint(self, step: int, epoch: int) -> CheckpointId | None:
        """The id of the loop's (epoch, step) in this run, or None when it is not after this
        worker's last checkpoint (it must not be saved again)."""
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

    def saved(self, cid: CheckpointId) -> None:
        """This worker saved (queued) its part of ``cid``."""
        if self.last is None or cid > self.last:
            self.last = cid

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

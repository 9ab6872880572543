"""A training worker as a member of its rendezvous rounds: joining, leaving a broken round,
the per-step check, and meeting the round's other members at the epoch barrier."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis as redis_py

from ..coordination.barrier import Barrier
from ..coordination.epochs import round_epoch_barrier
from ..coordination.rendezvous import Round
from ..errors import (
    BarrierBrokenError,
    EpochUnfinishedError,
    RoundBrokenError,
    RoundRestartedError,
    StrataError,
)

if TYPE_CHECKING:
    from .loop import TrainingOrchestrator

# the loop's logger, for every module of the loop (``docs/reference/environment.md``)
log = logging.getLogger("strata_redis.orchestrator")


class RoundMember:
    """The orchestrator's rounds: the round it is in (``o.round``), its ``RoundWatch``
    (``o._watch``), and the job's epoch as this worker last saw it (``o._job_epoch``).

    It joins rounds through the orchestrator's rendezvous and tells the round's checkpoints
    (``o._rounds``) and streams (``o._streams``) of each new round.
    """

    def __init__(self, o: TrainingOrchestrator) -> None:
        self._o = o

    def join(self, leaving: int, *, abort: bool = False) -> Round:
        """Join a round (leaving round ``leaving`` if it broke); it becomes ``o.round``.

        A worker preempted while it rejoins leaves instead (``_leave_preempted``), both while
        it waits and once the round closed: it must not train in a round its process will
        not live through."""
        o = self._o
        between = None if leaving == 0 else lambda: self._leave_preempted(leaving, "")
        round_ = o._retry(
            o.rendezvous.join, o.worker_id, o.worker.incarnation, leaving=leaving,
            between=between,
        )  # fmt: skip
        if between is not None:
            between()
        if leaving and round_.fresh:  # (lib/rendezvous.lua: who carries the state)
            o.round = round_
            raise RoundRestartedError.rejoined(o.job_id, round_.number, o.worker_id, leaving)
        log.info(
            "worker %r: round %d, rank %d of %d (restarts: %d failure, %d growth)",
            o.worker_id, round_.number, round_.rank, round_.world_size,
            round_.failure_restarts, round_.growth_restarts,
        )  # fmt: skip
        o.round = round_
        o._rounds.join(
            round_.number, round_.fresh, round_.rank, round_.world_size,
            abort=f"rendezvous round {leaving} broke" if abort else "",
        )  # fmt: skip
        o._watch.watch(round_)
        if o.on_round is not None:
            o.on_round(round_)
        return round_

    def on_broken(self, round_: Round, exc: RoundBrokenError) -> None:
        """(On a thread of the watch's.) Wake the broken round's waiters: its epoch barrier
        breaks, and its open checkpoints, which can never commit now, abort."""
        o = self._o
        try:
            self.epoch_barrier(round_).abort(o.worker_id, f"round over: {exc.reason}")
        except (StrataError, redis_py.RedisError) as err:
            log.info("could not break round %d's epoch barrier: %s", round_.number, err)
        if exc.reason != "superseded":
            aborted = o._rounds.abort_pending(
                f"rendezvous round {exc.round} is over ({exc.reason})"
            )
            if aborted:
                log.info("worker %r: aborted checkpoints %s", o.worker_id,
                         [c.label for c in aborted])  # fmt: skip

    def epoch_barrier(self, round_: Round) -> Barrier:
        """The epoch barrier of ``round_``: its members, ``epoch_timeout``."""
        o = self._o
        return round_epoch_barrier(o.context, round_.number, round_.world_size, o.epoch_timeout)

    def guard(self) -> None:
        """The per-step check: a flag read, no round trip. A broken round is left here."""
        o = self._o
        lost = o.worker.lost
        if lost is not None:
            raise lost
        broken = o._watch.pending()
        if broken is None:
            return
        if not o.elastic:
            raise broken
        self._leave_preempted(broken.round, broken.reason)
        self.join(leaving=broken.round, abort=broken.reason != "superseded")
        for stream in o._streams.values():
            stream.rebase()

    def _leave_preempted(self, leaving: int, reason: str) -> None:
        """A preempted worker whose round broke leaves (``Preempted``, 75: nothing saved)
        instead of joining another round: no whole-round checkpoint can commit in the broken
        one, and in a new one it would take shards its process will not live to report (a
        torchrun agent tearing a failed group down SIGTERMs the survivors, and SIGKILLs them
        30 s later; the restarted group would find their shards done). Its leases go back
        at its data position; the relaunch resumes from the last committed checkpoint."""
        o = self._o
        if not o.preempted or o._stopping.exiting:
            return
        log.warning(
            "worker %r: preempted (%s) and round %d is over%s: leaving, not joining another",
            o.worker_id, o._preemption.signal_name, leaving, f" ({reason})" if reason else "",
        )  # fmt: skip
        o._stopping.leave(None, committed=False)

    def advance(self) -> int:
        """``advance_epoch``: the epoch barrier over the round's members (met again in a new
        round if this one breaks, with ``elastic``), the missed checkpoints filled in, the
        round reviewed."""
        o = self._o
        o._status.set("idle")
        while True:
            before = o.round
            self.guard()
            if o.round is not before:
                self._check_finished()
            round_ = o.round
            try:
                # a retried arrival counts once, so a Redis blip is retried here
                release = o._retry(self.epoch_barrier(round_).wait, o.worker_id)
                break
            except BarrierBrokenError as exc:
                try:
                    o._retry(o.rendezvous.check, round_)
                except RoundBrokenError as broken:
                    o._watch.flag(round_, broken)
                    if not o.elastic:
                        raise broken from exc
                    continue
                raise
        epoch = release.epoch
        assert epoch is not None
        o._job_epoch = epoch
        o._between_epochs = True
        o._rounds.fill(
            o.round.number, epoch - 1, lambda cid: o._saves.position(cid, epoch - 1, filled=True)
        )
        if not o._retry(o.rendezvous.review, o.round, epoch):
            # Workers are waiting (or the round broke): the next step rendezvouses again.
            superseded = RoundBrokenError.because(o.job_id, o.round.number, "", "superseded")
            o._watch.flag(o.round, superseded)
        return epoch

    def _check_finished(self) -> None:
        """After a round change at the epoch barrier: a walk that ended without waiting for
        others' last shards must not let the epoch advance with a dead member's undone."""
        o = self._o
        for stream in o._streams.values():
            undone = stream.undone()
            if undone:
                assert stream.position is not None
                raise EpochUnfinishedError.at_barrier(
                    o.job_id, stream.params.name, stream.position.epoch, undone
                )

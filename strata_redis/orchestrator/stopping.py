"""A preempted training worker's way out: the round's agreed stop step, the last checkpoint
within the budget, the leases released at the data position, and ``Preempted``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, NoReturn

from ..checkpoint.ids import MAX_NUMBER
from ..preemption import EXIT_BUDGET_EXCEEDED, Preempted
from ..validate import check_int

if TYPE_CHECKING:
    from .loop import TrainingOrchestrator

# the loop's logger, for every module of the loop (``docs/reference/environment.md``)
log = logging.getLogger("strata_redis.orchestrator")


class Stopping:
    """The orchestrator's preemption glue, over its ``Preemption`` (``o._preemption``: the
    signal flag, the round's stop step, the budget): when the loop stops, and how it leaves.
    """

    def __init__(self, o: TrainingOrchestrator) -> None:
        self._o = o
        self.exiting = False  # preempt_exit runs
        self.loop_checks = False  # the loop calls should_stop itself (numbering its steps)

    def should_stop(self, step: int) -> bool:
        """``should_stop``: False with no preemption, else whether ``step`` reached the
        round's stop step."""
        self.loop_checks = True  # (the walks' own check stands aside: see ``step_guard``)
        if not self._o._preemption.requested:
            return False
        check_int("step", step, low=0, high=MAX_NUMBER)
        return self._stop_at(step)

    def _stop_at(self, step: int) -> bool:
        """``should_stop`` once preempted: the round's stop step proposed or read."""
        o = self._o
        agreed = o._preemption.stop_step(o.context, o.round.number, step, o._retry)
        return step >= agreed

    def step_guard(self) -> None:
        """The walks' per-batch check (the round's ``guard``), and the automatic preemption:
        at the agreed stop step, a loop that does not call ``should_stop`` itself exits here
        (one that does numbers its steps its own way, e.g. a framework's global step: a
        proposal counted in this walk's batches could stop its ranks at different steps)."""
        o = self._o
        if o._preemption.requested and not self.exiting and not self.loop_checks:
            step = self._steps_done() - 1
            if step >= 0 and self._stop_at(step):
                if o.state_provider is None:
                    log.warning(
                        "worker %r: preempted with no state_provider and no preempt_exit call: "
                        "leaving without a checkpoint (the relaunch resumes from the previous "
                        "one)", o.worker_id,
                    )  # fmt: skip
                    self.leave(None, False)
                o.preempt_exit(step, o._job_epoch)
        o._member.guard()

    def _steps_done(self) -> int:
        """The steps the loop finished in this walk: the batches it took (handed out, or
        reported consumed with ``track_consumption``), of its busiest stream."""
        return max((s.handed_count - s.in_flight for s in self._o._streams.values()), default=0)

    def exit(
        self, step: int, epoch: int, state: Any, save: Callable[[], Future[Any] | None] | None
    ) -> None:
        """``preempt_exit``: the checkpoint within the budget, then ``Preempted`` (always)."""
        o = self._o
        self.exiting = True
        budget = o._preemption
        label: str | None = None
        committed = False
        try:
            future = save() if save is not None else o.save_checkpoint(step, epoch, state)
            checkpoint = getattr(future, "checkpoint", None)
            label = getattr(checkpoint, "label", None) or f"epoch {epoch} step {step}"
            left = max(0.0, budget.deadline - time.monotonic())
            if future is not None:
                future.result(timeout=left)
                committed = True
            else:  # this step was saved already (or was a joiner's): wait for what is in flight
                o.wait_for_checkpoints(left)
                last = o._rounds.last
                label = None if last is None else last.label
                committed = last is not None and any(
                    info.id == last for info in o._retry(o.checkpoints.list)
                )
        except (FutureTimeout, TimeoutError):
            aborted = o._rounds.abort_pending(
                f"worker {o.worker_id!r} preempted: not committed within "
                f"{budget.budget:g}s of {budget.signal_name}"
            )
            log.warning("worker %r: preemption budget exceeded: aborted %s", o.worker_id,
                        [c.label for c in aborted])  # fmt: skip
        except Exception as exc:  # the worker leaves all the same
            log.warning("worker %r: the preemption checkpoint failed: %s", o.worker_id, exc)
        self.leave(label, committed)

    def leave(self, label: str | None, committed: bool) -> NoReturn:
        """Release the leases at the data position, leave, raise ``Preempted``."""
        o = self._o
        self.exiting = True
        for stream in o._streams.values():
            released = stream.release_held()
            if released:
                log.info("worker %r: released %s at %s", o.worker_id, stream.params.name,
                         released)  # fmt: skip
        budget = o._preemption
        seconds = time.monotonic() - budget.since
        code = 0 if committed else EXIT_BUDGET_EXCEEDED
        error = Preempted(
            code, job_id=o.job_id, worker_id=o.worker_id, signal=budget.signal_name,
            checkpoint=label, committed=committed, seconds=seconds,
        )  # fmt: skip
        log.warning("%s", error)
        try:
            o.close(end=False)
        finally:  # the loop ends with Preempted even when leaving failed
            raise error

"""A dead peer never hangs the survivors: a watch that ends this rank's process group when a
member of its round is declared failed.

A rank blocked in a collective whose peer died waits for the backend's timeout (gloo's and
NCCL's default: 30 minutes). The orchestrator's heartbeat thread learns of the failure within
the heartbeat timeout (the reaper declares the silent member failed; ``RoundWatch`` flags the
round broken); this watch, polling that flag, then ends the wait:

- it aborts the process group (``torch.distributed.distributed_c10d._abort_process_group``),
  which interrupts NCCL's collectives; gloo's abort (torch 2.13 here) returns but leaves a
  blocked ``all_reduce`` blocked, so
- it exits the process with ``EXIT_PEER_LOST`` (76): under torchrun the agent sees a failed
  local trainer and restarts it (``--max-restarts``), and the restart re-rendezvouses without
  the dead member: a clean restart of the local trainer, resuming from the newest committed
  checkpoint.

The bound is the heartbeat timeout, plus a heartbeat interval and this watch's poll (0.2 s).
Only a member declared *failed* trips it: one that left (a clean end of the loop, or a
preempted rank that saved and left) does not, nor does a rank that is itself being preempted.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import torch.distributed as dist

from ..orchestrator import TrainingOrchestrator

__all__ = ["EXIT_PEER_LOST", "PeerWatch"]

log = logging.getLogger("strata_redis.torch")

#: the exit code of a rank whose round lost a member while its process group was in use
EXIT_PEER_LOST = 76
#: seconds between two looks at the round's flag
POLL_S = 0.2


class PeerWatch:
    """Watch ``orchestrator``'s round while this rank's process group runs; on a member
    declared failed, abort the group and exit the process (``exit_code``).

    Args:
        orchestrator: this rank's orchestrator (its heartbeat thread flags the round).
        exit_code: the exit code (None: abort the group only, and let the loop's next
            collective raise; for backends whose abort interrupts a blocked collective).
        exit: how to exit (``os._exit``: no cleanup runs, as none may be blocked behind the
            collective).
    """

    def __init__(
        self,
        orchestrator: TrainingOrchestrator,
        exit_code: int | None = EXIT_PEER_LOST,
        exit: Any = os._exit,
    ) -> None:
        self.orchestrator = orchestrator
        self.exit_code = exit_code
        self._exit = exit
        self._stop = threading.Event()
        self._round = orchestrator.round.number
        self._thread = threading.Thread(
            target=self._run, name=f"strata-peer-watch-{orchestrator.worker_id}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (the group was destroyed, or the loop ended)."""
        self._stop.set()

    def _run(self) -> None:
        o = self.orchestrator
        while not self._stop.wait(POLL_S):
            if o.closed or o.preempted:
                return
            broken = o.round_broken
            if broken is None or broken.round != self._round:
                continue
            if broken.reason != "failed":
                continue  # left (the loop ended, or a peer saved and left): no hang to end
            log.warning(
                "worker %r: %s; ending this rank's process group so the survivors do not wait "
                "for the backend's timeout", o.worker_id, broken,
            )  # fmt: skip
            try:
                if dist.is_initialized():
                    dist.distributed_c10d._abort_process_group()
            except Exception as exc:  # exiting anyway
                log.warning("process group abort failed: %s", exc)
            if self.exit_code is not None:
                for handler in logging.getLogger().handlers:
                    handler.flush()
                self._exit(self.exit_code)
            return

"""Preemption: a signal (SIGTERM by default) asks the loop to stop at a step its round agrees on.

A spot instance gets a notice (30 s on the big clouds, then SIGKILL), and torchrun's agent
forwards the SIGTERM it gets to every rank. The handler only records that the signal came
(``Preemption.requested``, one attribute write: nothing in it can deadlock or block); the
loop acts at its next step boundary, off the signal handler:

1. **Agree on the stop step.** The first signalled member of the round proposes ``s + 1``
   (``s``: the step it just finished) in one Redis record of the round (``propose_stop``; the
   first proposal wins, the others read it). Data-parallel ranks run within one step of
   each other (every step ends in a collective), and a rank that finished step ``s`` cannot
   finish ``s + 1`` before the proposer joined it, so every signalled rank reads the agreed
   step by the time it finishes it: each trains up to it, then they save that same step. A
   rank that finds itself past the agreed step (a loop with no collective, signalled much
   later) saves its own step: that checkpoint cannot commit, and the relaunch resumes from
   the one before (all or nothing).
2. **Save within the budget** (``preempt_budget``, 25 s from the signal by default: inside
   the 30 s notice with room to leave).
3. **Release the leases at the data position** (the next holder starts after what this
   rank trained), **leave the round and deregister**, then raise ``Preempted`` (a
   ``SystemExit``): uncaught, the process exits 0.

Past the budget the save is abandoned (the checkpoint never commits: a relaunch resumes from
the previous one, all or nothing), the leases are released and the worker leaves all the
same, and ``Preempted`` carries ``EXIT_BUDGET_EXCEEDED`` (75) instead of 0.

The signals are ``STRATA_PREEMPT_SIGNALS`` (names or numbers, comma-separated; empty: none)
or the orchestrator's ``preempt_signals``. The handlers are the process's: installed from
the main thread by the first orchestrator that asks, put back when the last one closes.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from .context import JobContext
from .errors import Preempted

__all__ = [
    "DEFAULT_BUDGET_S",
    "ENV_SIGNALS",
    "EXIT_BUDGET_EXCEEDED",
    "Preempted",
    "Preemption",
    "is_handler",
    "parse_signals",
    "propose_stop",
]

log = logging.getLogger("strata_redis.preemption")

#: the environment variable naming the preemption signals
ENV_SIGNALS = "STRATA_PREEMPT_SIGNALS"
#: seconds from the signal to a committed checkpoint (a spot notice is 30 s at the least)
DEFAULT_BUDGET_S = 25.0
#: the exit code when the checkpoint did not commit within the budget (``EX_TEMPFAIL``)
EXIT_BUDGET_EXCEEDED = 75
#: how long a round's stop record lives (milliseconds)
STOP_TTL_MS = 86_400_000


def parse_signals(value: str | Iterable[int | str] | None) -> tuple[signal.Signals, ...]:
    """The signals named by ``value``: a comma-separated string or an iterable of names
    (``"SIGTERM"``, ``"TERM"``) or numbers; None reads ``STRATA_PREEMPT_SIGNALS`` (unset:
    SIGTERM). An empty string or iterable names none.

    Raises:
        ValueError: a name or number that is not a signal (or SIGKILL/SIGSTOP, which cannot
            be caught).
    """
    if value is None:
        value = os.environ.get(ENV_SIGNALS, "SIGTERM")
    items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
    found: list[signal.Signals] = []
    for item in items:
        try:
            if isinstance(item, int) or (isinstance(item, str) and item.isdigit()):
                sig = signal.Signals(int(item))
            else:
                name = str(item).upper()
                sig = signal.Signals[name if name.startswith("SIG") else "SIG" + name]
        except (KeyError, ValueError):
            raise ValueError(f"preempt_signals: {item!r} is not a signal") from None
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(f"preempt_signals: {sig.name} cannot be caught")
        if sig not in found:
            found.append(sig)
    return tuple(found)


class _Handlers:
    """The process's preemption handlers: installed once, shared by every ``Preemption``,
    the previous handlers put back when the last user is gone."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.previous: dict[signal.Signals, Any] = {}
        #: monotonic time of the first signal, and which one (None: none came)
        self.at: float | None = None
        self.signum: int | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        # only attribute writes: async-signal-safe in effect (Python runs this between two
        # bytecodes of the main thread; nothing here takes a lock or does I/O)
        if self.at is None and self.users > 0:
            self.at = time.monotonic()
            self.signum = signum
            return
        # a second signal (the loop did not get to the first: blocked, or not checking), or
        # no loop listens any more (closed off the main thread, which could not put the
        # handlers back): the previous handler (by default, termination) gets it, as if
        # none were installed
        previous = self.previous.get(signal.Signals(signum), signal.SIG_DFL)
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        else:
            signal.raise_signal(signum)

    def install(self, signals: tuple[signal.Signals, ...]) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False  # signal.signal works only there: the loop checks no signal
        with self.lock:
            for sig in signals:
                if sig not in self.previous:
                    self.previous[sig] = signal.signal(sig, self.handle)
            self.users += 1
        return True

    def uninstall(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users > 0:
                return
            # no loop listens: a later one starts with no preemption pending
            self.at = self.signum = None
            if threading.current_thread() is not threading.main_thread():
                return  # (``handle`` passes signals on to ``previous`` meanwhile)
            previous, self.previous = self.previous, {}
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


_HANDLERS = _Handlers()


def is_handler(handler: object) -> bool:
    """Whether ``handler`` (as ``signal.getsignal`` returns it) is the preemption handler: for
    a framework that wraps the process's handlers in its own (Lightning's SIGTERM handling) to
    put it back alone."""
    return handler == _HANDLERS.handle


class Preemption:
    """One loop's view of the process's preemption signals and its round's stop step.

    Args:
        signals: the signals that preempt (``parse_signals``); empty: none is handled.
        budget: seconds from the signal for the checkpoint to commit.
    """

    def __init__(self, signals: tuple[signal.Signals, ...], budget: float) -> None:
        self.signals = signals
        self.budget = budget
        self._installed = bool(signals) and _HANDLERS.install(signals)
        if signals and not self._installed:
            log.info("preemption signals not handled: the loop was not made on the main thread")
        #: set by ``request`` (a caller that learned of the preemption otherwise)
        self._asked_at: float | None = None
        #: the agreed stop step of the round it was read in: (round, step)
        self.stop: tuple[int, int] | None = None

    @property
    def requested(self) -> bool:
        """A preemption signal came (or ``request`` was called): a flag read."""
        return self._asked_at is not None or (self._installed and _HANDLERS.at is not None)

    @property
    def since(self) -> float:
        """Monotonic time the preemption was asked for (now if it was not)."""
        times = [t for t in (self._asked_at, _HANDLERS.at if self._installed else None) if t]
        return min(times) if times else time.monotonic()

    @property
    def deadline(self) -> float:
        """Monotonic time by which the checkpoint must have committed."""
        return self.since + self.budget

    @property
    def signal_name(self) -> str:
        """The signal that came (``"request"`` when asked for otherwise)."""
        signum = _HANDLERS.signum if self._installed else None
        return signal.Signals(signum).name if signum is not None else "request"

    def request(self) -> None:
        """Ask for preemption as a signal would (for a caller told otherwise, e.g. a cloud
        metadata poller); the budget counts from now."""
        if self._asked_at is None:
            self._asked_at = time.monotonic()

    def close(self) -> None:
        """Put the process's handlers back if this was their last user."""
        if self._installed:
            self._installed = False
            _HANDLERS.uninstall()

    def stop_step(self, ctx: JobContext, round_: int, step: int, retry: Callable[..., Any]) -> int:
        """The step the round stops at, proposing ``step + 1`` if nobody proposed yet. Once
        read, each later call is a flag read unless the round changed."""
        if self.stop is not None and self.stop[0] == round_:
            return self.stop[1]
        agreed = int(retry(propose_stop, ctx, round_, step + 1))
        self.stop = (round_, agreed)
        return agreed


def propose_stop(ctx: JobContext, round_: int, step: int) -> int:
    """Propose ``step`` as round ``round_``'s stop step; returns the agreed one (the first
    proposal)."""
    reply = ctx.scripts.run(
        "propose_stop", [ctx.keys.preempt_stop(round_)], [step, STOP_TTL_MS],
        {"job_id": ctx.job_id, "round": round_},
    )  # fmt: skip
    return int(reply[0])

"""The elastic rendezvous: workers meet in numbered rounds with dense, stable ranks.

A round opens at the first join and closes when ``max_workers`` joined, or when
``min_workers`` joined and a last-call window passed (on Redis' clock), or at once when every
live member of the previous round (and every live waiting worker) is back. Every member gets
the same ``Round``: (number, rank, world size, members). A worker that arrives while a round
runs waits for the next one, which opens when a member of the running round dies (the round
is *broken*) or at an epoch boundary when workers are waiting (``review``). Restarts caused
by failures and by growth are counted apart; only failures count against ``max_restarts``.
Joining, closing, checking and reviewing are each one Lua script, so every member sees one
history.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from ..connection import (
    Replies,
    StreamPage,
    queue_stream_page,
    take_stream_page,
    zrange_pages,
)
from ..context import JobContext
from ..errors import RendezvousTimeoutError, RestartLimitError, RoundBrokenError
from ..keys import Keys
from ..outage import RIDDEN, Outage, ride_out, riding_out
from ..scripts import check
from ..status import Status
from ..validate import check_int, check_seconds

__all__ = [
    "Rendezvous",
    "Round",
    "RoundEvent",
    "RoundWatch",
    "queue_round_events",
    "take_round_events",
]

log = logging.getLogger("strata_redis.rendezvous")

#: how long a finished round's keys stay readable (ms)
KEEP_ROUND_MS: Final = 86_400_000
#: rendezvous events kept (approximate)
EVENTS_CAP: Final = 1000
#: the longest a joiner blocks between two looks at the rendezvous (ms; shorter with a
#: heartbeat timeout below 4 s: each look of a waiter refreshes its waiting entry)
MAX_BLOCK_MS: Final = 1000
#: the rendezvous hash's field that says the rendezvous was ended for good (``end``)
ENDED: Final = "ended"
#: a closed round's members are read in pages of this many (one ZRANGE each)
MEMBERS_PAGE: Final = 5_000


@dataclass(frozen=True)
class Round:
    """One closed rendezvous round, as each of its members sees it.

    Attributes:
        number: the round (1, 2, ...); every member of a round has the same.
        rank: this member's rank, ``0 <= rank < world_size``, fixed for the round.
        world_size: how many members the round has.
        members: the members' ids in rank order.
        fresh: no member carries the job's state from the previous round: a whole-job start
            or restart (the orchestrator restores the data position from the newest
            checkpoint then). A member carries it when it was in a fresh round or one that
            passed an epoch barrier, and in every round since: a worker that joined a running
            job and lost all who held the state before either never got it (its round is
            fresh, not a continuation of a model nobody holds).
        generation: the membership generation when the round closed.
        failure_restarts: rounds opened because a member failed or left, so far.
        growth_restarts: rounds opened to admit workers that arrived late, so far.
    """

    number: int
    rank: int
    world_size: int
    members: tuple[str, ...]
    fresh: bool
    generation: int
    failure_restarts: int
    growth_restarts: int


class Rendezvous:
    """A job's elastic rendezvous, with this process's limits.

    Args:
        ctx: the job.
        min_workers: a round closes only with at least this many members.
        max_workers: a round closes as soon as it has this many; later arrivals wait for the
            next round. None: no limit.
        last_call: seconds a round stays open for more joiners once ``min_workers`` joined.
        timeout: seconds ``join`` waits for a round to close before it raises.
        max_restarts: failure restarts allowed before ``join`` raises ``RestartLimitError``
            (None: no limit). Restarts that admit new workers never count.

    Raises:
        ValueError, TypeError: a bad argument, named in the message.
    """

    def __init__(
        self,
        ctx: JobContext,
        *,
        min_workers: int = 1,
        max_workers: int | None = None,
        last_call: float = 3.0,
        timeout: float = 600.0,
        max_restarts: int | None = None,
    ) -> None:
        self.context = ctx
        self.min_workers = check_int("min_workers", min_workers, low=1, high=100_000)
        if max_workers is None:
            max_workers = 100_000
        self.max_workers = check_int("max_workers", max_workers, low=1, high=100_000)
        if self.max_workers < self.min_workers:
            raise ValueError(
                f"max_workers must be at least min_workers ({self.min_workers}), got {max_workers}"
            )
        self.last_call = check_seconds("last_call", last_call, high=86400)
        self.timeout = check_seconds("timeout", timeout, high=7 * 86400)
        self.max_restarts = (
            None if max_restarts is None
            else check_int("max_restarts", max_restarts, low=0, high=1_000_000)
        )  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"Rendezvous(job={self.context.job_id!r}, min_workers={self.min_workers}, "
            f"max_workers={self.max_workers}, last_call={self.last_call})"
        )

    def _keys(self, g: int) -> list[str]:
        k = self.context.keys
        before = max(g - 1, 0)
        return [
            k.rendezvous, k.rendezvous_waiting, k.rendezvous_events, k.heartbeats, k.status,
            k.incarnation, k.generation, k.events,
            k.round_members(before), k.round_ranks(before),
            k.round_members(g), k.round_ranks(g), k.round_expected(g),
            k.round_members(g + 1), k.round_ranks(g + 1), k.round_expected(g + 1),
        ]  # fmt: skip

    @riding_out
    def current_round(self) -> int:
        """The number of the newest round (0 before the first join)."""
        return int(self.context.client.hget(self.context.keys.rendezvous, "round") or 0)

    def join(
        self,
        worker_id: str,
        incarnation: int,
        *,
        leaving: int = 0,
        spare_waits: bool = False,
        between: Callable[[], None] | None = None,
    ) -> Round:
        """Join the open round (or open one) and wait until it closes.

        Args:
            worker_id: a live registered worker.
            incarnation: its registration's incarnation (``Worker.incarnation``).
            leaving: the round this worker was a member of and that broke (0: none); the
                first member to say so opens the next round.
            spare_waits: a spare (waiting while the running round is at ``max_workers``)
                waits with no deadline, as torchrun's redundant agents do; ``timeout`` counts
                again from when it stops being one. False: ``timeout`` counts from the call.
            between: called before each wait for the round to close; it may raise to give
                the join up (the caller then leaves: its leave takes it out of the round).

        Returns:
            The closed round, with this worker's rank.

        Raises:
            RendezvousEndedError: the rendezvous was ended for good (``end``); ``.spare``
                says the worker was waiting as a spare then.
            RendezvousTimeoutError: no round closed with this worker within ``timeout``.
            RestartLimitError: failure restarts exceed ``max_restarts``.
            WorkerFailedError: the worker is not live (so are ``WorkerLeftError``,
                ``WorkerReplacedError`` and ``WorkerNotRegisteredError``).
        """
        ctx = self.context
        deadline = time.monotonic() + self.timeout
        outage = Outage(ctx, f"rendezvous join of {worker_id!r}")
        guess = ride_out(ctx, outage.what, self.current_round)
        ids = {"job_id": ctx.job_id, "worker_id": worker_id, "round": guess}
        spare = False
        while True:
            try:
                reply = self.join_step(worker_id, incarnation, guess, leaving)
            except RIDDEN as exc:
                outage.failed(exc)  # Redis answers again: the step repeats (it is idempotent)
                continue
            if int(reply[0]) == Status.ROUND_MOVED:
                guess = int(reply[1])
                continue
            payload = check(reply, {**ids, "round": guess, "spare": spare})
            kind = payload[0]
            if kind == "waiting":
                spare = spare_waits and bool(int(payload[3]))
                if spare:  # no deadline while it cannot be admitted
                    deadline = time.monotonic() + self.timeout
            else:
                spare = False
            if kind == "closed":
                number, rank, world = map(int, payload[1:4])
                members = ride_out(ctx, outage.what, self.members, number)
                if len(members) == world and members[rank] == worker_id:
                    return self._closed(payload, members)
                # the round's keys changed under us (its state lost): the next call says so
                time.sleep(0.05)
            else:
                guess = int(payload[1])
            if time.monotonic() > deadline:
                key = ctx.keys.round_members(guess)
                joined = sorted(ctx.client.zrange(key, 0, 99))
                raise RendezvousTimeoutError.after(
                    ctx.job_id, guess, joined, self.min_workers, self.timeout,
                    count=int(ctx.client.zcard(key)),
                )  # fmt: skip
            if kind == "closed":
                continue
            if between is not None:
                between()
            block = self._look_ms()  # a waiter's looks keep its waiting entry fresh
            if kind == "joining" and int(payload[3]):
                block = min(block, max(5, int(payload[3]) - int(payload[4]) + 5))
            # Block until something happens in the rendezvous (or the window closes).
            try:
                ctx.client.xread({ctx.keys.rendezvous_events: payload[-1]}, block=block, count=16)
            except RIDDEN as exc:
                outage.failed(exc)

    def join_step(self, worker_id: str, incarnation: int, guess: int, leaving: int) -> Any:
        """One call of the join script (no waiting): its raw reply, status code first.
        ``join`` loops over it; a tool or test can drive a rendezvous step by step."""
        args = [worker_id, incarnation, guess, leaving, self.min_workers, self.max_workers,
                int(self.last_call * 1000), EVENTS_CAP, KEEP_ROUND_MS]  # fmt: skip
        return self.context.scripts.call("join_rendezvous", self._keys(guess), args)

    def _closed(self, payload: list[Any], members: tuple[str, ...]) -> Round:
        number, rank, world, fresh, failures, growth, generation = map(int, payload[1:8])
        if self.max_restarts is not None and failures > self.max_restarts:
            raise RestartLimitError.over(self.context.job_id, number, failures, self.max_restarts)
        return Round(number, rank, world, members, bool(fresh), generation, failures, growth)

    @riding_out
    def members(self, number: int) -> tuple[str, ...]:
        """A round's members in rank order, read in pages of ``MEMBERS_PAGE`` (each one
        bounded command, however big the round)."""
        ctx = self.context
        return tuple(
            map(str, zrange_pages(ctx.client, ctx.keys.round_members(number), MEMBERS_PAGE))
        )

    def check(self, round_: Round) -> None:
        """Raise if ``round_`` is over: a member died or left, or a newer round opened.

        One script call, on the heartbeat client (the orchestrator runs it from the
        heartbeat thread when the membership generation moves, off the hot path; it must
        never wait behind this process's blocking calls).

        Raises:
            RoundBrokenError: the round is over (``.culprit``, ``.reason``).
        """
        ctx, k = self.context, self.context.keys
        more = 1
        while more:  # each call reads a bounded slice of the membership changes
            (more,) = ctx.heartbeat_scripts.run(
                "check_round",
                [k.rendezvous, k.round_ranks(round_.number), k.heartbeats, k.status,
                 k.incarnation, k.rendezvous_events, k.events],
                [round_.number, EVENTS_CAP],
                {"job_id": ctx.job_id, "round": round_.number},
            )  # fmt: skip

    def review(self, round_: Round, epoch: int) -> bool:
        """At an epoch boundary: does ``round_`` go on? Decided once for all its members.

        Returns:
            True if the round goes on; False if it is over (workers are waiting to join, or it
            broke): its members ``join`` again.
        """
        ctx, k = self.context, self.context.keys
        (decision,) = ctx.scripts.run(
            "review_round",
            [
                k.rendezvous,
                k.rendezvous_waiting,
                k.heartbeats,
                k.rendezvous_events,
                k.events,
                k.generation,
                k.round_expected(round_.number + 1),
            ],
            [round_.number, epoch, self.max_workers, EVENTS_CAP, self._stale_ms()],
            {"job_id": ctx.job_id, "round": round_.number},
        )
        return bool(decision == "keep")

    @riding_out
    def ended(self) -> bool:
        """Whether the rendezvous was ended for good (``end``): torchrun's ``is_closed``."""
        return bool(self.context.client.hget(self.context.keys.rendezvous, ENDED) == "1")

    def end(self) -> None:
        """End the rendezvous for good, so that late or leftover agents stop (torchrun's
        ``set_closed`` and ``shutdown``, called when a run is over): every later ``join``,
        and every one waiting now, raises ``RendezvousEndedError``. Distinct from a round's
        ``closed`` state, which only means the round took its members. One MULTI: the
        field, and an event that wakes the waiting joiners."""
        ctx, k = self.context, self.context.keys
        with ctx.client.pipeline(transaction=True) as pipe:
            pipe.hset(k.rendezvous, ENDED, "1")
            pipe.xadd(
                k.rendezvous_events,
                {"type": "end"},
                maxlen=EVENTS_CAP,
                approximate=True,
            )
            pipe.execute()

    @riding_out
    def waiting(self, mine: int) -> int:
        """Workers that could join a round after round ``mine``: they arrived while it ran
        and it has room (fewer than ``max_workers`` members), or they are in a newer round
        that is collecting members (opened by a member that re-joined after a failure).
        Spares, waiting behind a round at ``max_workers``, are not counted (torchrun's
        redundancy list): a round cannot grow to admit them. Only live waiters count: a
        waiter's entry is refreshed on each of its looks at the rendezvous (at least once per
        ``heartbeat_timeout / 4``), and one older than ``heartbeat_timeout`` on Redis' clock is
        a waiter that died (SIGKILLed, its host lost), not counted: the members do not restart
        for a node that never comes. Two calls at most."""
        ctx, k = self.context, self.context.keys
        waiting, number, state, world = ctx.scripts.run(
            "count_waiting",
            [k.rendezvous, k.rendezvous_waiting],
            [self._stale_ms()],
            {"job_id": ctx.job_id, "round": mine},
        )
        count = int(waiting)
        if state == "closed" and int(world or 0) >= self.max_workers:
            count = 0  # full: the waiting are spares
        if number is not None and int(number) > mine and state == "joining":
            count += int(ctx.client.zcard(k.round_members(int(number))))
        return count

    def _stale_ms(self) -> int:
        """A waiting entry older than this (ms) is a dead waiter's: the heartbeat timeout."""
        return int(self.context.heartbeat_timeout * 1000)

    def _look_ms(self) -> int:
        """The longest a waiter goes between two looks (each refreshes its waiting entry)."""
        return max(5, min(MAX_BLOCK_MS, self._stale_ms() // 4))

    @riding_out
    def state(self) -> dict[str, str]:
        """The rendezvous hash as it stands (round, state, world size, restart counts...)."""
        return dict(self.context.client.hgetall(self.context.keys.rendezvous))


class RoundWatch:
    """A member's watch over its round, for a loop that looks at it every step with no round
    trip (``broken`` is a flag read).

    The heartbeat thread calls ``on_generation`` when the membership generation moves (off
    the hot path: one script call per membership change); when the round is over it sets
    ``broken`` and calls ``on_broken(round, error)`` on a thread of its own, so the
    heartbeat thread never waits on anything the loop holds (it wakes the round's waiters).

    Args:
        rendezvous: the job's rendezvous.
        worker_id: the member (for messages).
        on_broken: called once per broken round, best effort (errors are logged).

    Attributes:
        round: the round watched (None before the first ``watch``).
        broken: why the watched round is over (None while it is whole).
    """

    def __init__(
        self,
        rendezvous: Rendezvous,
        worker_id: str,
        on_broken: Callable[[Round, RoundBrokenError], None],
    ) -> None:
        self.rendezvous, self.worker_id, self.on_broken = rendezvous, worker_id, on_broken
        self.round: Round | None = None
        self.broken: RoundBrokenError | None = None
        self._seen = -1

    def watch(self, round_: Round) -> None:
        """Watch ``round_``, just joined: it is whole."""
        self.round, self._seen, self.broken = round_, round_.generation, None

    def flag(self, round_: Round, exc: RoundBrokenError) -> None:
        """``round_`` is over (the caller found it): flag it if it is the one watched and
        no break is flagged yet."""
        if round_ is self.round and self.broken is None:
            self.broken = exc

    def pending(self) -> RoundBrokenError | None:
        """The watched round's break, if any (a break of a round already left is dropped)."""
        broken = self.broken
        if broken is not None and (self.round is None or broken.round != self.round.number):
            self.broken = broken = None
        return broken

    def on_generation(self, generation: int) -> None:
        """Heartbeat thread: the membership moved; is the round still whole?"""
        round_ = self.round
        if round_ is None or generation == self._seen or self.broken is not None:
            return
        self._seen = generation
        try:
            self.rendezvous.check(round_)
        except RoundBrokenError as exc:
            if round_ is self.round:
                self.broken = exc
                log.warning("worker %r: %s", self.worker_id, exc)
                threading.Thread(
                    target=self._wake, args=(round_, exc), daemon=True,
                    name=f"strata-round-broken-{self.worker_id}",
                ).start()  # fmt: skip
        except Exception:  # the heartbeat thread must go on
            log.exception("worker %r: round check failed", self.worker_id)

    def _wake(self, round_: Round, exc: RoundBrokenError) -> None:
        try:
            self.on_broken(round_, exc)
        except Exception:  # a best effort: the waits are bounded anyway
            log.exception("worker %r: could not wake round %d's waiters", self.worker_id,
                          round_.number)  # fmt: skip


# -- batched reads (connection.py: the queue/take convention) ---------------------------------
@dataclass(frozen=True)
class RoundEvent:
    """One entry of the rendezvous event stream.

    Attributes:
        type: ``open``, ``close``, ``broken`` or ``end``.
        round: the round it is about (None for ``end``).
        ms: when it happened, ms on Redis' clock.
        detail: the rest of the entry: ``reason`` (open, broken), ``world_size`` (close),
            ``worker`` (broken: the member that broke it).
    """

    type: str
    round: int | None
    ms: int
    detail: dict[str, str]


def _round_event(entry_id: str, f: dict[str, str]) -> RoundEvent:
    rest = {k: v for k, v in f.items() if k not in ("type", "round", "ms")}
    number = f.get("round")
    ms = f.get("ms")
    return RoundEvent(
        type=f.get("type", "?"),
        round=int(number) if number and number.isdigit() else None,
        ms=int(float(ms)) if ms else int(entry_id.split("-", 1)[0]),
        detail=rest,
    )


def queue_round_events(pipe: Any, job_id: str, count: int, after: str | None = None) -> None:
    """Queue a read of the newest ``count`` rendezvous events (those after entry ``after``)."""
    queue_stream_page(pipe, Keys(job_id).rendezvous_events, count, after)


def take_round_events(replies: Replies) -> StreamPage[RoundEvent]:
    """The events ``queue_round_events`` read, newest first, and the stream's length."""
    return take_stream_page(replies, _round_event)

"""Barriers: named, reusable, released at once; they time out and fail fast, never hang."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Final

from ..connection import SCAN_STEP
from ..context import JobContext, as_context
from ..errors import BarrierBrokenError, BarrierError, BarrierTimeoutError
from ..outage import RIDDEN, Outage, riding_out
from ..scripts import Call, check
from ..status import Status
from ..validate import check_id, check_int, check_seconds
from .latency import RECORDER
from .registry import reap_call, reaped
from .waiters import release_pops

log = logging.getLogger("strata_redis.barrier")

#: ``expected=LIVE``: the barrier releases when every live registered worker has arrived.
LIVE: Final = "live"
#: names starting with this are the library's own (``epochs.EPOCH_BARRIER``).
RESERVED_PREFIX: Final = "strata:"
MAX_EXPECTED: Final = 100_000
MAX_TIMEOUT: Final = 7 * 86400.0
#: the first arrivals of a generation block on the wake stream and the membership events,
#: so a failure wakes them (and they wake everyone); the rest block on the release list,
#: the cheapest broadcast Redis has (one RPUSH of N tokens serves N BLPOPs).
WATCHERS: Final = 2
#: outcomes of finished generations kept in the state hash, for late waiters and retries.
KEEP_OUTCOMES: Final = 64
WAKE_CAP: Final = 32
#: barrier keys live at least this long after their last use (seconds).
MIN_KEY_TTL: Final = 3600.0
#: release tokens outlive a release this long (ms); a waiter that comes later reads the
#: outcome from the state hash instead, after at most one blocking slice.
RELEASE_TTL_MS: Final = 60_000
EVENTS_SCANNED: Final = 10_000


@dataclass(frozen=True)
class Release:
    """A released barrier generation, as every participant sees it.

    Attributes:
        barrier: the barrier's name.
        generation: the generation that released.
        participants: how many workers arrived in it.
        epoch: the job's new epoch (the epoch barrier only), else None.
        released_us: the release time, microseconds on Redis' clock.
        first_us: the first arrival's time, microseconds on Redis' clock.
    """

    barrier: str
    generation: int
    participants: int
    epoch: int | None
    released_us: int
    first_us: int


@dataclass(frozen=True)
class BarrierState:
    """A barrier's current generation, for people and dashboards (``Barrier.state``).

    Attributes:
        barrier: the barrier's name.
        generation: the current generation.
        expected: what it was opened with (a count or ``"live"``), None before any arrival.
        arrived: the workers that arrived in it, sorted.
        broken: whether it broke (arrivals are refused until ``reset``).
    """

    barrier: str
    generation: int
    expected: int | str | None
    arrived: list[str]
    broken: bool


@dataclass(frozen=True)
class _Arrival:
    generation: int
    index: int
    #: Redis' clock minus the local monotonic clock, in microseconds (within half a round trip)
    offset_us: float
    outcome: str
    wake_id: str
    events_id: str


class _Memo:
    """Per job and process: each barrier's next generation, and the tickets of open waits."""

    def __init__(self) -> None:
        self.generations: dict[str, int] = {}
        self.tickets: dict[tuple[str, str], str] = {}


def _memo(ctx: JobContext) -> _Memo:
    return ctx.memo("barrier", _Memo)


def check_expected(expected: object) -> int | str:
    """Return ``expected`` if it is ``LIVE`` or an int in ``[1, MAX_EXPECTED]``, else raise."""
    if isinstance(expected, str):
        if expected != LIVE:
            raise ValueError(f"expected must be a count or {LIVE!r}, got {expected!r}")
        return expected
    return check_int("expected", expected, low=1, high=MAX_EXPECTED)


def check_barrier_name(name: object) -> str:
    """Return ``name`` if it is a valid barrier name (an id, not reserved), else raise."""
    name = check_id("name", name)
    if name.startswith(RESERVED_PREFIX):
        raise ValueError(f"name must not start with {RESERVED_PREFIX!r} (reserved), got {name!r}")
    return name


def _check_reason(reason: object) -> str:
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a str, got {type(reason).__name__} {reason!r}")
    if not reason or len(reason) > 1024 or not reason.isprintable():
        raise ValueError(f"reason must be 1 to 1024 printable characters, got {reason!r}")
    return reason


class Barrier:
    """A named, reusable barrier of a job. Made by ``Job.barrier``.

    Each use is a *generation*: it opens at its first arrival and releases when ``expected``
    workers have arrived (a count), or when every live registered worker has (``LIVE``,
    judged at the moment of release). Then every waiter of that generation leaves at once
    and the next arrival opens the next generation; slow waiters of the old one are not
    confused with it.

    A generation never hangs. It *breaks* — every waiter gets ``BarrierBrokenError`` at
    once, naming the culprit — when a member is declared failed by the reaper, or calls
    ``abort``. When a waiter's timeout passes it breaks too, and every waiter gets
    ``BarrierTimeoutError`` naming the live workers that did not arrive. A broken generation
    refuses arrivals until ``reset``, so nobody passes it alone; the survivors reset it (all
    may call ``reset(err.generation)``: only the first moves it) and meet again.

    Args:
        ctx: the job's context (a ``Job`` gives its own: ``job.barrier(...)``).
        name: the barrier's name (an id; names starting with ``strata:`` are reserved).
        expected: how many workers must arrive, or ``LIVE`` (``"live"``) for every live
            registered worker. Every participant must pass the same.
        timeout: the default for ``wait``, in seconds.

    Raises:
        ValueError, TypeError: a bad argument, named in the message.
    """

    def __init__(
        self, ctx: JobContext, name: str, expected: int | str = LIVE, *, timeout: float = 300.0
    ) -> None:
        self._init(ctx, check_barrier_name(name), expected, timeout, counter=None)

    @classmethod
    def reserved(
        cls, ctx: JobContext, name: str, expected: int | str, timeout: float, counter: str | None
    ) -> Barrier:
        """A library-owned barrier (a reserved name), whose release increments ``counter``."""
        barrier = cls.__new__(cls)
        barrier._init(ctx, name, expected, timeout, counter)
        return barrier

    def _init(
        self, ctx: JobContext, name: str, expected: object, timeout: object, counter: str | None
    ) -> None:
        self.context = ctx
        self.name = name
        self.expected = check_expected(expected)
        self.timeout = check_seconds("timeout", timeout, high=MAX_TIMEOUT)
        self._counter = counter
        k = ctx.keys
        self._state, self._arrived = k.barrier(name), k.barrier_arrived(name)
        self._tickets, self.wake_key = k.barrier_tickets(name), k.barrier_wake(name)

    def __repr__(self) -> str:
        return f"Barrier({self.name!r}, expected={self.expected!r}, job={self.context.job_id!r})"

    # -- public API ----------------------------------------------------------------------
    def wait(self, worker_id: str, timeout: float | None = None) -> Release:
        """Arrive, and block (inside Redis) until this generation releases.

        A Redis restart or failover shorter than the job's ``redis_retry`` is ridden out:
        the wait re-issues its blocking read once Redis answers again (``outage.Outage``);
        so is Redis refusing writes at its memory limit (the arrival waits for memory).
        A retry after a connection error (by ``wait`` itself, or by calling ``wait`` again
        from the same process and job) is counted once: it is answered from the generation
        the first attempt was counted in. While it waits, the caller runs the reaper step every
        ``heartbeat_timeout / 2`` seconds, so a dead member is detected even when every
        live worker is blocked here.

        Args:
            worker_id: the arriving worker; it must be registered and live.
            timeout: seconds to wait (default: the barrier's).

        Returns:
            The release: generation, participants, and the new epoch for the epoch barrier.

        Raises:
            BarrierTimeoutError: the generation timed out (this or another waiter's timeout).
            BarrierBrokenError: a member failed or aborted (``.culprit``, ``.reason``).
            WorkerNotRegisteredError, WorkerFailedError, WorkerLeftError: refused arrival.
            BarrierError: ``expected`` differs from the generation's, or its record expired.
            RedisUnavailableError: Redis stayed unreachable past ``redis_retry`` (calling
                ``wait`` again is a retry of the same arrival).
            RedisMemoryFullError: Redis refused writes past ``redis_retry`` (likewise).
            ValueError, TypeError: a bad argument.
        """
        check_id("worker_id", worker_id)
        if timeout is None:
            timeout = self.timeout
        timeout = check_seconds("timeout", timeout, high=MAX_TIMEOUT)
        deadline = time.monotonic() + timeout
        memo = _memo(self.context)
        key = (self.name, worker_id)
        ticket = memo.tickets.setdefault(key, uuid.uuid4().hex)
        outage = Outage(self.context, f"barrier {self.name!r} wait of {worker_id!r}")
        arrival: _Arrival | None = None
        try:
            while True:
                try:
                    if arrival is None:  # a repeated arrival (same ticket) counts once
                        arrival = self._arrive(worker_id, ticket, timeout)
                    release = self._await(worker_id, arrival, deadline, timeout)
                    break
                except RIDDEN as exc:
                    outage.failed(exc)  # Redis answers again: re-issue the blocking read
        except RIDDEN:
            raise  # the ticket stays: calling again is a retry of this arrival
        except BaseException:
            memo.tickets.pop(key, None)
            raise
        memo.tickets.pop(key, None)
        return release

    def abort(self, worker_id: str, reason: str) -> int:
        """Break the current generation: every waiter gets ``BarrierBrokenError`` at once.

        Args:
            worker_id: the aborting worker (registered; named as the culprit).
            reason: why, for the waiters' error message (1 to 1024 printable characters).

        Returns:
            The generation that is now broken (pass it to ``reset``).

        Raises:
            WorkerNotRegisteredError: the worker is unknown to the job.
            ValueError, TypeError: a bad argument.
        """
        check_id("worker_id", worker_id)
        return self._break(worker_id, _check_reason(reason))

    def reset(self, generation: int | None = None) -> int:
        """Move a broken barrier on to a fresh generation, so the survivors can meet again.

        Args:
            generation: the generation that broke (``err.generation``): the call only moves
                the barrier if that generation is current, so every survivor may call it.
                None: the current generation, broken first (reason ``"reset"``) if workers
                are waiting in it.

        Returns:
            The generation now current.
        """
        arg = "" if generation is None else check_int("generation", generation, low=1, high=2**53)
        while True:
            current, what = self.context.scripts.run(
                "reset_barrier", [self._state, self._arrived], [arg, self._ttl_ms(self.timeout)],
                lambda: self._context(""),
            )  # fmt: skip
            if what == "open" and generation is None:
                self._break("", "reset")
                continue
            _memo(self.context).generations[self.name] = int(current)
            return int(current)

    @riding_out
    def generation(self) -> int:
        """The current generation (1 before the barrier's first use)."""
        return int(self.context.client.hget(self._state, "gen") or 1)

    @riding_out
    def state(self) -> BarrierState:
        """The current generation: its number, expected, arrivals, and whether it broke."""
        fields = self.context.client.hgetall(self._state)  # a few fields per generation
        # (SSCAN steps: 10^5 arrivals in one SMEMBERS would hold Redis for ~10 ms)
        arrived = set(self.context.client.sscan_iter(self._arrived, count=SCAN_STEP))
        gen = int(fields.get("gen", 1))
        raw = fields.get("expected")
        expected: int | str | None = None if raw is None else raw if raw == LIVE else int(raw)
        return BarrierState(self.name, gen, expected, sorted(arrived), f"r:{gen}" in fields)

    # -- arrival -------------------------------------------------------------------------
    def _context(self, worker_id: str) -> dict[str, Any]:
        return {
            "job_id": self.context.job_id,
            "barrier": self.name,
            "worker_id": worker_id,
            "expected": self.expected,
        }

    def _keys(self, generation: int) -> list[str]:
        k = self.context.keys
        keys = [
            self._state, self._arrived, self._tickets,
            k.barrier_release(self.name, generation), self.wake_key,
            k.heartbeats, k.status, k.events,
        ]  # fmt: skip
        if self._counter is not None:
            keys.append(self._counter)
        return keys

    @staticmethod
    def _ttl_ms(timeout: float) -> int:
        # outlive every waiter's timeout, so an open generation never expires under it
        return int(max(MIN_KEY_TTL, 2 * timeout + 60) * 1000)

    def arrive_call(self, worker_id: str, ticket: str, generation: int, timeout: float) -> Call:
        """One arrival as a raw script call (``wait`` sends it; perf/ sends it raw, too).

        Args:
            worker_id: the arriving worker.
            ticket: a unique id of this wait (a retried arrival with it counts once).
            generation: the generation the caller believes current.
            timeout: the wait's timeout, seconds (the keys outlive it).
        """
        args: list[str | int] = [
            worker_id, ticket, generation, str(self.expected), self._ttl_ms(timeout),
            KEEP_OUTCOMES, WAKE_CAP, WATCHERS, RELEASE_TTL_MS,
        ]  # fmt: skip
        return "arrive_barrier", self._keys(generation), args

    def _arrive(self, worker_id: str, ticket: str, timeout: float) -> _Arrival:
        memo = _memo(self.context)
        guess = memo.generations.get(self.name, 1)
        for _ in range(10):
            # the release list's key names the generation, and keys go through KEYS only,
            # so the caller names the generation it expects; the script says if it moved
            _, keys, args = self.arrive_call(worker_id, ticket, guess, timeout)
            sent = time.monotonic()
            reply = self.context.scripts.call("arrive_barrier", keys, args)
            received = time.monotonic()
            if int(reply[0]) == Status.BARRIER_MOVED:
                guess = memo.generations[self.name] = int(reply[1])
                continue
            gen, index, now_us, outcome, wake_id, events_id = check(
                reply, lambda: self._context(worker_id)
            )
            offset = int(now_us) - (sent + received) / 2 * 1e6
            memo.generations[self.name] = int(gen)
            return _Arrival(int(gen), int(index), offset, outcome, wake_id, events_id)
        check(reply, self._context(worker_id))  # raises: it kept moving
        raise AssertionError("unreachable")  # pragma: no cover

    # -- waiting -------------------------------------------------------------------------
    def _await(self, worker_id: str, a: _Arrival, deadline: float, timeout: float) -> Release:
        outcome = a.outcome
        # a slice: reap every half heartbeat timeout, and never block past the socket
        # timeout (a silent partition then ends in a TimeoutError, not a hang)
        slice_s = min(self.context.heartbeat_timeout / 2, as_context(self.context).max_block)
        release_key = self.context.keys.barrier_release(self.name, a.generation)
        events_key = self.context.keys.events
        wake_id, events_id = a.wake_id, a.events_id
        watcher = bool(wake_id)
        client = self.context.client
        while not outcome:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                outcome = self._check(
                    a.generation, "timeout", worker_id, timeout, reap=True, offset_us=a.offset_us
                )
                break
            block = min(remaining, slice_s)
            if watcher:
                reply = client.xread(
                    {self.wake_key: wake_id, events_key: events_id},
                    count=100,
                    block=max(1, int(block * 1000)),
                )
                entries = _stream_entries(reply)
                for stream, entry_id, fields in entries:
                    if stream == self.wake_key:
                        wake_id = entry_id
                        if fields.get("g") == str(a.generation):
                            outcome = fields["o"]
                    else:
                        events_id = entry_id
                if not outcome:
                    # a membership event (or the slice's end): settle the generation now
                    outcome = self._check(
                        a.generation, "check", worker_id, timeout, reap=not entries,
                        offset_us=a.offset_us,
                    )  # fmt: skip
            else:
                # one blocked connection for every such waiter of the job in this process
                token = release_pops(self.context).pop(release_key, max(block, 0.001))
                if token is not None and token.startswith("+"):
                    # the first of a batch: more waiters than one release pushes at once
                    token = token[1:]
                    self.context.scripts.run(
                        "refill_release", [self._state, release_key],
                        [a.generation, RELEASE_TTL_MS], self._context(worker_id),
                    )  # fmt: skip
                if token is not None and token.startswith("R "):
                    outcome = token
                else:  # the slice ended, or a "broken" token: read the record
                    outcome = self._check(
                        a.generation, "check", worker_id, timeout, reap=token is None,
                        offset_us=a.offset_us,
                    )  # fmt: skip
        return self._settle(worker_id, a, outcome)

    def _check(
        self, generation: int, action: str, worker_id: str, timeout: float, *,
        reason: str = "", reap: bool = False, offset_us: float | None = None,
    ) -> str:  # fmt: skip
        args: list[str | int] = [
            generation, action, worker_id, reason, self._ttl_ms(timeout), KEEP_OUTCOMES,
            WAKE_CAP, EVENTS_SCANNED, RELEASE_TTL_MS,
        ]  # fmt: skip
        call = ("check_barrier", self._keys(generation), args)
        if reap:
            # the reaper step first, in the same round trip, so the check sees its verdicts
            # stamped with its send time on Redis' clock: after a stall it judges nobody
            sent_ms = None if offset_us is None else (time.monotonic() * 1e6 + offset_us) / 1000
            reap_reply, reply = self.context.scripts.run_many(
                [reap_call(self.context, sent_ms), call]
            )
            reaped(self.context, reap_reply)
        else:
            reply = self.context.scripts.call(*call)
        (outcome,) = check(reply, lambda: self._context(worker_id))
        return str(outcome)

    def _break(self, worker_id: str, reason: str) -> int:
        for _ in range(10):
            gen = self.generation()
            outcome = self._check(gen, "abort", worker_id, self.timeout, reason=reason)
            if outcome.startswith("B\n") or outcome == "G":
                return gen
            # released (or moved on) just before the abort landed: break the next one
        raise BarrierError(
            f"barrier {self.name!r} of job {self.context.job_id!r} kept moving; abort not recorded",
            job_id=self.context.job_id,
            barrier=self.name,
        )

    def _settle(self, worker_id: str, a: _Arrival, outcome: str) -> Release:
        if outcome.startswith("R "):
            release = self._release(outcome)
            _memo(self.context).generations[self.name] = release.generation + 1
            if a.index == 1:
                self._record_latency(a, release)
            return release
        if outcome.startswith("B\n"):
            raise self._broken(outcome)
        what = "has expired" if outcome == "G" else "finished, but its outcome is no longer kept"
        raise BarrierError(
            f"barrier {self.name!r} of job {self.context.job_id!r} generation {a.generation} "
            f"{what}",
            job_id=self.context.job_id,
            barrier=self.name,
        )

    def _release(self, outcome: str) -> Release:
        _, gen, released, first, participants, counter = outcome.split(" ")
        epoch = None if counter == "-" else int(counter)
        return Release(self.name, int(gen), int(participants), epoch, int(released), int(first))

    def _broken(self, outcome: str) -> BarrierError:
        _, gen, culprit, reason, expected, arrived, absent, *missing = outcome.split("\n")
        g, n = int(gen), int(arrived)
        where = f"barrier {self.name!r} of job {self.context.job_id!r} generation {g}"
        # the record names up to 100 of the absent workers; their count is exact
        names = f"{missing}"
        if len(missing) < int(absent):
            names = f"{int(absent)}, among them {missing}"
        if reason == "timeout":
            if expected == LIVE:
                count = int(absent)
                what = f"live workers {names} did not arrive"
            else:
                count = max(int(expected) - n, int(absent))
                what = (
                    f"{count} of {expected} arrivals missing; "
                    f"live registered workers that did not arrive: {names}"
                )
            return BarrierTimeoutError(
                f"{where} timed out: {what} (reset it to meet again)",
                job_id=self.context.job_id, barrier=self.name, missing=missing, generation=g,
                missing_count=count,
            )  # fmt: skip
        if reason == "failed":
            what = f"worker {culprit!r} was declared failed"
        elif culprit:
            what = f"worker {culprit!r} aborted it: {reason}"
        else:
            what = f"it was aborted: {reason}"
        return BarrierBrokenError(
            f"{where} is broken: {what} (reset it to meet again)",
            job_id=self.context.job_id, barrier=self.name, culprit=culprit, reason=reason,
            generation=g,
        )  # fmt: skip

    def _record_latency(self, a: _Arrival, release: Release) -> None:
        # the first arrival waited longest and, as a watcher, is woken after the list
        # waiters: its wake time bounds what the others saw
        woke_us = time.monotonic() * 1e6 + a.offset_us
        RECORDER.put(
            self.context,
            {
                "barrier": self.name,
                "generation": release.generation,
                "participants": release.participants,
                "release_us": int(max(0.0, woke_us - release.released_us)),
                "wait_us": release.released_us - release.first_us,
                "at_ms": release.released_us // 1000,
            },
        )


def _stream_entries(reply: Any) -> list[tuple[str, str, dict[str, str]]]:
    """(stream, id, fields) of an XREAD reply, as redis-py gives it over RESP2 or RESP3."""
    out = []
    for stream, entries in reply.items() if isinstance(reply, dict) else reply or []:
        if entries and isinstance(entries[0], list):  # RESP3 wraps the entries once more
            entries = entries[0]
        out += [(stream, entry_id, fields) for entry_id, fields in entries]
    return out

"""Riding out a short Redis outage: calls wait for Redis to answer (or to accept writes)
again, then re-issue what they were doing, within the job's ``redis_retry`` budget.

A restart or failover of Redis closes every connection, so a call blocked in Redis
(a barrier wait, a rendezvous, a checkpoint wait) fails with a ``ConnectionError`` though
the state it waits on is intact. The caller keeps an ``Outage`` for the call, and hands it
each such error (``failed``): it logs the outage once, polls Redis (one read of the job's
era key, routed to the job's slot under Redis Cluster) until Redis answers, and returns so
the caller re-issues its step; the steps that wait are idempotent (a barrier arrival is
counted once per ticket). When Redis has not answered within the budget, counted from the
outage's first error, ``failed`` raises ``RedisUnavailableError``. A connection-pool limit
of this process (``PoolExhaustedError``) is not an outage and passes through, nor are
credentials Redis refuses (``AuthenticationError``).

Redis at its memory limit (``maxmemory`` reached under ``noeviction``) is a pause of the
same kind: it refuses every write (``OutOfMemoryError``) and applies nothing of a refused
script, whose first write is the prelude's clock tick (``era.py``), so the call can be sent
again once memory is freed. ``failed`` logs one WARNING when the wait starts, probes with
the era check alone (``check_era``: a tick, the write Redis refuses while it is full) until
Redis accepts writes, logs one WARNING when it ends, and returns; past the budget it raises
``RedisMemoryFullError``. Heartbeat threads do not wait (a tick is skipped, and logged once):
the reaper's grace for write outages (``lua/reap_workers.lua``) keeps a live worker whose
heartbeats were refused from being declared failed.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Concatenate, Final, ParamSpec, TypeVar

import redis
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    MaxConnectionsError,
    OutOfMemoryError,
)

from .context import HasContext, JobContext, as_context
from .errors import RedisMemoryFullError, RedisUnavailableError

__all__ = ["LOST", "RIDDEN", "Outage", "ride_out", "riding_out"]

log = logging.getLogger("strata_redis.outage")

#: the errors that mean Redis could not be reached (closed, refused, timed out, loading)
LOST: Final = (redis.ConnectionError, redis.TimeoutError)
#: connection errors that are no outage: a limit of this process, credentials Redis refuses
#: (waiting does not change them)
NOT_OUTAGES: Final = (MaxConnectionsError, AuthenticationError, AuthorizationError)
#: what a call rides out: Redis unreachable (``LOST``), or refusing writes at its memory limit
RIDDEN: Final = (*LOST, OutOfMemoryError)
#: a step that ran this long after Redis answered again ended the outage: the next error
#: is a new one, with a budget of its own
SETTLED_S: Final = 1.0
T = TypeVar("T")
P = ParamSpec("P")
H = TypeVar("H", bound=HasContext)


class Outage:
    """The outages one call rides out (make one per call).

    Args:
        context: the job (its client, era key and ``redis_retry`` budget).
        what: the call, for the log and the error (e.g. ``"barrier 'b' wait of 'w-1'"``).
        budget: seconds an outage may last (default: ``context.redis_retry``).
    """

    def __init__(self, context: JobContext, what: str, budget: float | None = None) -> None:
        self.context = context
        self.what = what
        self.budget = context.redis_retry if budget is None else budget
        self.since: float | None = None  # the current outage's first error
        self.full = False  # the current outage is Redis refusing writes (else: unreachable)
        self.back = 0.0  # when Redis last answered again
        self.outages = 0  # how many this call rode out

    def failed(self, exc: BaseException) -> None:
        """Handle one lost connection or one write refused at Redis' memory limit: return
        once Redis answers (accepts writes) again, so the caller re-issues the step.

        Raises:
            RedisUnavailableError: Redis did not answer within the budget.
            RedisMemoryFullError: Redis refused writes for the whole budget.
            exc: it is no outage (a pool limit of this process, not a connection error, or
                an outage an inner call already waited out whole).
        """
        full = isinstance(exc, OutOfMemoryError)
        if (
            not isinstance(exc, RIDDEN)
            or isinstance(exc, (*NOT_OUTAGES, RedisUnavailableError))
            or (isinstance(exc, RedisMemoryFullError) and exc.seconds is not None)
        ):
            raise exc
        now = time.monotonic()
        if self.since is None or now - self.back > SETTLED_S or full != self.full:
            self.since, self.full = now, full
            self.outages += 1
            if full:
                log.warning(
                    "job %r: %s: Redis is at its memory limit (maxmemory, noeviction) and "
                    "refuses writes; waiting up to %.3gs for memory to be freed",
                    self.context.job_id, self.what, self.budget,
                )  # fmt: skip
            else:
                log.warning(
                    "job %r: %s: Redis unreachable (%s: %s); retrying for up to %.3gs",
                    self.context.job_id, self.what, type(exc).__name__, exc, self.budget,
                )  # fmt: skip
        deadline = self.since + self.budget
        delay = 0.05 if full else 0.02
        last: BaseException = exc
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                waited = time.monotonic() - self.since
                if full:
                    raise RedisMemoryFullError.at(self.context.job_id, last, waited) from last
                raise RedisUnavailableError.after(
                    self.context.job_id, self.what, waited, last
                ) from last
            threading.Event().wait(min(delay, left))
            delay = min(0.5, delay * 2)
            try:
                self._probe(full)
            except RIDDEN as again:
                if isinstance(again, NOT_OUTAGES):
                    raise
                last = again
                continue
            self.back = time.monotonic()
            if full:
                log.warning(
                    "job %r: %s: Redis accepts writes again after %.3gs; resuming",
                    self.context.job_id, self.what, self.back - self.since,
                )  # fmt: skip
            else:
                log.info(
                    "job %r: %s: Redis answers again after %.3gs; resuming",
                    self.context.job_id, self.what, self.back - self.since,
                )  # fmt: skip
            return

    def _probe(self, full: bool) -> None:
        """Ask Redis whether the outage is over: a read of the era key (it answers), or
        the era check alone (it accepts writes: its clock tick is one)."""
        if full:
            self.context.scripts.check()
        else:
            self.context.client.exists(self.context.keys.era)


def ride_out(
    context: JobContext,
    what: str,
    fn: Callable[..., T],
    *args: object,
    **kwargs: object,
) -> T:
    """Call ``fn`` (an idempotent step, or one that applies nothing when refused), calling
    it again after each outage it meets (``Outage.failed``).

    Raises:
        RedisUnavailableError: an outage outlasted ``context.redis_retry``.
        RedisMemoryFullError: Redis refused writes at its memory limit for longer than
            ``context.redis_retry`` (also a plain command's: scripts raise it themselves).
    """
    outage = Outage(context, what)
    while True:
        try:
            return fn(*args, **kwargs)
        except RIDDEN as exc:
            outage.failed(exc)


def riding_out(method: Callable[Concatenate[H, P], T]) -> Callable[Concatenate[H, P], T]:
    """Make a public method of an object on a job (one with a ``context``: a ``Job``, a
    manager, a facade) ride out outages, as ``ride_out`` does. Only for a method that reads,
    or that may be sent again as it is (idempotent)."""

    @functools.wraps(method)
    def call(self: H, /, *args: P.args, **kwargs: P.kwargs) -> T:
        step = functools.partial(method, self, *args, **kwargs)
        return ride_out(as_context(self.context), method.__qualname__, step)

    return call

"""Riding out a short Redis outage: blocking calls wait for Redis to answer again, then
re-issue what they were doing, within the job's ``redis_retry`` budget.

A restart or failover of Redis closes every connection, so a call blocked in Redis
(a barrier wait, a rendezvous, a checkpoint wait) fails with a ``ConnectionError`` though
the state it waits on is intact. The caller keeps an ``Outage`` for the call, and hands it
each such error (``failed``): it logs the outage once, polls Redis (one read of the job's
era key, routed to the job's slot under Redis Cluster) until Redis answers, and returns so
the caller re-issues its step; the steps that wait are idempotent (a barrier arrival is
counted once per ticket). When Redis has not answered within the budget, counted from the
outage's first error, ``failed`` raises ``RedisUnavailableError``. A connection-pool limit
of this process (``PoolExhaustedError``) is not an outage and passes through.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final, TypeVar

import redis
from redis.exceptions import MaxConnectionsError, OutOfMemoryError

from .context import JobContext
from .errors import RedisMemoryFullError, RedisUnavailableError

__all__ = ["LOST", "Outage", "ride_out"]

log = logging.getLogger("strata_redis.outage")

#: the errors that mean Redis could not be reached (closed, refused, timed out, loading)
LOST: Final = (redis.ConnectionError, redis.TimeoutError)
#: a step that ran this long after Redis answered again ended the outage: the next error
#: is a new one, with a budget of its own
SETTLED_S: Final = 1.0
T = TypeVar("T")


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
        self.back = 0.0  # when Redis last answered again
        self.outages = 0  # how many this call rode out

    def failed(self, exc: BaseException) -> None:
        """Handle one lost connection: return once Redis answers again (re-issue the step).

        Raises:
            RedisUnavailableError: Redis did not answer within the budget.
            exc: it is no outage (a pool limit of this process, or not a connection error).
        """
        if not isinstance(exc, LOST) or isinstance(
            exc, (MaxConnectionsError, RedisUnavailableError)
        ):
            raise exc
        now = time.monotonic()
        if self.since is None or now - self.back > SETTLED_S:
            self.since = now
            self.outages += 1
            log.warning(
                "job %r: %s: Redis unreachable (%s: %s); retrying for up to %.3gs",
                self.context.job_id, self.what, type(exc).__name__, exc, self.budget,
            )  # fmt: skip
        deadline = self.since + self.budget
        delay = 0.02
        last: BaseException = exc
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RedisUnavailableError.after(
                    self.context.job_id, self.what, time.monotonic() - self.since, last
                ) from last
            threading.Event().wait(min(delay, left))
            delay = min(0.5, delay * 2)
            try:
                self.context.client.exists(self.context.keys.era)
            except LOST as again:
                if isinstance(again, MaxConnectionsError):
                    raise
                last = again
                continue
            self.back = time.monotonic()
            log.info(
                "job %r: %s: Redis answers again after %.3gs; resuming",
                self.context.job_id, self.what, self.back - self.since,
            )  # fmt: skip
            return


def ride_out(
    context: JobContext, what: str, fn: Callable[..., T], *args: object, **kwargs: object
) -> T:
    """Call ``fn`` (an idempotent step), calling it again after each outage it meets.

    Raises:
        RedisUnavailableError: an outage outlasted ``context.redis_retry``.
        RedisMemoryFullError: Redis refused a write at its memory limit (also a plain
            command's: scripts raise it themselves).
    """
    outage = Outage(context, what)
    while True:
        try:
            return fn(*args, **kwargs)
        except LOST as exc:
            outage.failed(exc)
        except OutOfMemoryError as exc:
            if isinstance(exc, RedisMemoryFullError):
                raise
            raise RedisMemoryFullError.at(context.job_id, exc) from exc

"""The job context: what every feature of one job needs (ids, client, keys, scripts, timeouts).

Features take a ``JobContext`` and never the ``Job`` facade, so imports only point down:
the facade is built on the features, the features on this. Anything that holds a context
(a ``Job``, a ``ShardManager``) can be passed where one is asked for (``as_context``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

import redis

from .connection import describe, make_client
from .keys import Keys
from .scripts import Scripts
from .validate import check_id, check_int, check_seconds

__all__ = ["DEFAULT_JOB", "JOB_ENV", "HasContext", "JobContext", "as_context"]

JOB_ENV = "STRATA_JOB_ID"
DEFAULT_JOB = "default"
T = TypeVar("T")


@runtime_checkable
class HasContext(Protocol):
    """Anything built on a job context (``Job``, ``ShardManager``): it exposes ``context``."""

    @property
    def context(self) -> JobContext: ...


class JobContext:
    """One job's coordination state in one Redis, as the features see it.

    Args:
        redis: a Redis URL (``redis://``, ``rediss://``, ``unix://``), ``host:port``, a
            ``redis.Redis``, or another context (or what holds one): its client and
            scripts are shared. Default: ``$STRATA_REDIS_URL`` or ``redis://localhost:6379/0``.
        job_id: the job's id. Default: the shared context's, else ``$STRATA_JOB_ID``, else
            ``"default"``.
        heartbeat_timeout: seconds without a heartbeat after which the reaper declares a
            worker failed. Every process of a job should use the same value.
        events_cap: approximate length at which the membership event stream is trimmed.

    Attributes:
        job_id, keys (the key schema), client, scripts, heartbeat_timeout, events_cap.
    """

    def __init__(
        self,
        redis: str | redis.Redis | JobContext | HasContext | None = None,
        job_id: str | None = None,
        *,
        heartbeat_timeout: float = 10.0,
        events_cap: int = 10_000,
    ) -> None:
        shared = as_context(redis) if isinstance(redis, (JobContext, HasContext)) else None
        if job_id is None:
            job_id = shared.job_id if shared is not None else os.environ.get(JOB_ENV)
            job_id = job_id or DEFAULT_JOB
        self.job_id: str = check_id("job_id", job_id, job=True)
        self.heartbeat_timeout = check_seconds("heartbeat_timeout", heartbeat_timeout, high=86400)
        self.events_cap = check_int("events_cap", events_cap, low=100, high=10_000_000)
        self.keys: Keys = Keys(self.job_id)
        if shared is not None:
            self.client: Any = shared.client
            self.scripts: Scripts = shared.scripts
        else:
            self.client = make_client(redis)  # type: ignore[arg-type]
            self.scripts = Scripts(self.client)
        self._memos: dict[str, Any] = {}
        self._memo_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"JobContext({self.job_id!r}, redis={describe(self.client)!r})"

    @property
    def context(self) -> JobContext:
        """This context (so a context is accepted wherever a holder of one is)."""
        return self

    def memo(self, name: str, factory: Callable[[], T]) -> T:
        """A per-job cache kept with this context: made by ``factory`` on first use."""
        with self._memo_lock:
            value = self._memos.get(name)
            if value is None:
                value = self._memos[name] = factory()
            return value

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()


def as_context(obj: JobContext | HasContext) -> JobContext:
    """The context of ``obj``: a ``JobContext``, or what holds one (``Job``, ``ShardManager``).

    Raises:
        TypeError: ``obj`` is neither.
    """
    if isinstance(obj, JobContext):
        return obj
    context = getattr(obj, "context", None)
    if not isinstance(context, JobContext):
        raise TypeError(f"expected a Job or a JobContext, got {type(obj).__name__}")
    return context

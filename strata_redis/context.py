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

from . import identity
from .connection import (
    DEFAULT_MAX_CONNECTIONS,
    SOCKET_TIMEOUT,
    describe,
    heartbeat_client,
    is_cluster,
    make_client,
    max_block,
)
from .durability import REPLICATED, check_durability
from .era import Era, EraScripts
from .keys import Keys
from .scripts import Scripts
from .validate import check_id, check_int, check_seconds

__all__ = [
    "DEFAULT_RETENTION_S",
    "MAX_RETENTION_S",
    "RETENTION_ENV",
    "HasContext",
    "JobContext",
    "as_context",
]

T = TypeVar("T")


@runtime_checkable
class HasContext(Protocol):
    """Anything built on a job context (``Job``, ``ShardManager``): it exposes ``context``."""

    @property
    def context(self) -> JobContext: ...


class JobContext:
    """One job's coordination state in one Redis, as the features see it.

    Args:
        redis: a Redis URL (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``),
            ``host:port``, a ``redis.Redis`` or ``redis.cluster.RedisCluster``, or another
            context (or what holds one): its client and scripts are shared. Default:
            ``$STRATA_REDIS_URL`` or ``redis://localhost:6379/0``.
        job_id: the job's id. Default: the shared context's, else this process's default
            (``identity.job_id``: ``$STRATA_JOB_ID``, else torchrun's run id, else
            ``<script>-<8 hex>`` derived from the launch, logged once): the same for every
            entry point of one process.
        heartbeat_timeout: seconds without a heartbeat after which the reaper declares a
            worker failed (default: the shared context's, else 10). Every process of a job
            should use the same value.
        events_cap: approximate length at which the membership event stream is trimmed
            (default: the shared context's, else 10,000).
        max_connections: the most connections this process opens for the client made from
            a URL (``connection.DEFAULT_MAX_CONNECTIONS``); every thread blocked in a barrier
            or checkpoint wait holds one. Past it, callers wait up to 30 s for a free one,
            then get ``connection.PoolExhaustedError``. Heartbeats use a small pool of their
            own on top (``connection.HEARTBEAT_CONNECTIONS``). Ignored with a shared context
            or a given decoding ``redis.Redis`` (its pool is the caller's).
        min_replicas: after each lease grant, renewal, hand-back or completion and each
            checkpoint commit, ``WAIT`` until this many replicas have it (default: the
            shared context's, else 1 with ``durability="replicated"``, else 0 — no wait; see
            ``era.EraScripts``).
        replica_timeout: the longest one such wait lasts, seconds (default: the shared
            context's, else 1).
        durability: ``"default"`` (a call is acknowledged once the primary applied it;
            ``min_replicas`` waits best effort) or ``"replicated"`` (a lease grant, renewal,
            hand-back, completion or checkpoint commit is acknowledged only once
            ``min_replicas`` replicas confirmed it, and raises ``NotReplicatedError`` when
            none did within ``redis_retry``; ``durability.py``). Default: the shared
            context's, else ``$STRATA_DURABILITY``, else ``"default"``.
        retention: seconds an ended job's keys are kept (``coordination/lifecycle.py``;
            default: the shared context's, else ``$STRATA_JOB_RETENTION``, else 3 days).
        redis_retry: seconds a blocking call (barrier, epoch, rendezvous and checkpoint
            waits) keeps retrying while Redis is unreachable before it raises
            ``RedisUnavailableError`` (default: the shared context's, else 60; see
            ``outage.Outage``).

    Attributes:
        job_id: the job's id.
        keys: the key schema (``keys.Keys``) of the job.
        client: the job's Redis client.
        scripts: the Lua scripts on ``client`` (every call carries the job's era).
        era: the job's ``era.Era``: a loss of the job's state raises ``StateLostError``.
        heartbeat_timeout: as the argument.
        events_cap: as the argument.
        retention: as the argument.
        redis_retry: as the argument.
        heartbeat_scripts: the scripts on the heartbeat client.
        max_block: seconds one blocking command may block.
    """

    def __init__(
        self,
        redis: str | redis.Redis | JobContext | HasContext | None = None,
        job_id: str | None = None,
        *,
        heartbeat_timeout: float | None = None,
        events_cap: int | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        min_replicas: int | None = None,
        replica_timeout: float | None = None,
        durability: str | None = None,
        retention: float | None = None,
        redis_retry: float | None = None,
    ) -> None:
        shared = as_context(redis) if isinstance(redis, (JobContext, HasContext)) else None
        # not given: the shared context's settings (a CheckpointManager made from a job
        # keeps the job's durability knob), else the defaults
        if heartbeat_timeout is None:
            heartbeat_timeout = shared.heartbeat_timeout if shared is not None else 10.0
        if events_cap is None:
            events_cap = shared.events_cap if shared is not None else 10_000
        if durability is None and shared is not None:
            durability = shared.durability
        self.durability: str = check_durability(durability)
        replicated = self.durability == REPLICATED
        if min_replicas is None:
            min_replicas = shared.min_replicas if shared is not None else 0
            min_replicas = max(min_replicas, 1) if replicated else min_replicas
        if replica_timeout is None:
            replica_timeout = shared.replica_timeout if shared is not None else 1.0
        if retention is None:
            retention = shared.retention if shared is not None else _default_retention()
        if redis_retry is None:
            redis_retry = shared.redis_retry if shared is not None else 60.0
        if job_id is None:
            job_id = shared.job_id if shared is not None else identity.job_id()
        self.job_id: str = check_id("job_id", job_id, job=True)
        self.heartbeat_timeout: float = check_seconds(
            "heartbeat_timeout", heartbeat_timeout, high=86400
        )
        self.retention: float = check_seconds("retention", retention, high=MAX_RETENTION_S)
        self.events_cap: int = check_int("events_cap", events_cap, low=100, high=10_000_000)
        self.redis_retry: float = check_seconds("redis_retry", redis_retry, high=86400)
        self.keys: Keys = Keys(self.job_id)
        if shared is not None:
            self.client: Any = shared.client
            self._scripts: Scripts = shared._scripts
            self._heartbeat: list[Scripts] = shared._heartbeat
            self._heartbeat_lock: threading.Lock = shared._heartbeat_lock
        else:
            self.client = make_client(redis, max_connections=max_connections)  # type: ignore[arg-type]
            self._scripts = Scripts(self.client)
            self._heartbeat = []
            self._heartbeat_lock = threading.Lock()
        # the job's era (era.py): one per job in a process, so contexts of one job that
        # share a client share it; every script of this context carries it
        self.era: Era = (
            shared.era if shared is not None and shared.job_id == self.job_id
            else Era(
                self.client, self.keys.era, self.job_id, self.keys.clock, self.keys.anchors,
                self.keys.history,
            )
        )  # fmt: skip
        self.min_replicas: int = check_int(
            "min_replicas", min_replicas, low=1 if replicated else 0, high=100
        )
        if self.min_replicas and is_cluster(self.client):
            raise ValueError(
                "min_replicas and durability='replicated' need a script and its WAIT on one "
                "connection, which redis-py's Redis Cluster client cannot give: use the "
                "default durability and min_replicas 0 with Redis Cluster"
            )
        self.replica_timeout: float = check_seconds("replica_timeout", replica_timeout, high=3600)
        knob = (self.min_replicas, self.replica_timeout, self.durability, self.redis_retry)
        same = (
            shared is not None and shared.era is self.era
            and (shared.min_replicas, shared.replica_timeout, shared.durability,
                 shared.redis_retry) == knob
        )  # fmt: skip
        # one job's contexts with one knob share one view (and its count of shortfalls)
        self.scripts: EraScripts = (
            shared.scripts if same and shared is not None
            else EraScripts(self._scripts, self.era, *knob)
        )  # fmt: skip
        self._heartbeat_scripts: EraScripts | None = None
        self.max_block: float = max_block(self.client)
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

    @property
    def heartbeat_scripts(self) -> EraScripts:
        """The scripts on this process's heartbeat client (made on first use, shared).

        A pool of its own, so heartbeats never wait behind blocking calls; its socket
        timeout is below the heartbeat timeout, so a stalled call fails before the reaper's
        verdict would.
        """
        with self._heartbeat_lock:
            if not self._heartbeat:
                timeout = max(1.0, min(SOCKET_TIMEOUT, self.heartbeat_timeout / 2))
                client = heartbeat_client(self.client, socket_timeout=timeout)
                self._heartbeat.append(Scripts(client))
            if self._heartbeat_scripts is None:
                self._heartbeat_scripts = EraScripts(self._heartbeat[0], self.era)
            return self._heartbeat_scripts

    def close(self) -> None:
        """Close the client's connections (and the heartbeat client's)."""
        self.client.close()
        with self._heartbeat_lock:
            for scripts in self._heartbeat:
                scripts.client.close()


#: how long an ended job's keys are kept by default (``coordination/lifecycle.py``): 3 days
DEFAULT_RETENTION_S = 3 * 86400.0
#: the longest retention of an ended job's keys: a year
MAX_RETENTION_S = 365 * 86400.0
#: the environment variable of the default retention of an ended job's keys, seconds
RETENTION_ENV = "STRATA_JOB_RETENTION"


def _default_retention() -> float:
    """``$STRATA_JOB_RETENTION`` seconds, else 3 days."""
    raw = os.environ.get(RETENTION_ENV, "").strip()
    if not raw:
        return DEFAULT_RETENTION_S
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"${RETENTION_ENV} must be a number of seconds, got {raw!r}") from None


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

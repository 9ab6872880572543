"""The job's era: state loss in Redis is detected, never papered over.

Each job's state in Redis carries an era, ``strata:{<job>}:era``: a random id the job's
first script call creates (``SET NX``: one era, whoever comes first). A context learns it
once and passes it, with the era key, to every script it runs; a prelude in front of every
script compares it with the stored one before the script touches anything, and answers
``STATE_LOST`` when the key is missing (Redis restarted without persistence, was flushed,
or failed over to a replica that had not synced) or holds another era (the job was started
again meanwhile). The context then raises ``StateLostError``, and keeps raising it: a
context never adopts a new era, so a fencing token, a barrier ticket or a checkpoint step
from before the loss can never act on state made after it. Start a new process (or a new
context) to join the job's new era; ``TrainingOrchestrator`` then resumes from the newest
checkpoint in storage.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

from redis.exceptions import MovedError, OutOfMemoryError

from .errors import Context, RedisMemoryFullError, StateLostError
from .scripts import Call, Scripts, check
from .status import Status

__all__ = ["DURABLE_SCRIPTS", "Era", "EraScripts"]

log = logging.getLogger("strata_redis.era")

#: what the prelude puts after the status code of a ``STATE_LOST`` reply
_LOST: Final = int(Status.STATE_LOST)
#: the scripts whose writes ``min_replicas`` waits for: lease grants, renewals, hand-backs and
#: completions, and checkpoint commits
DURABLE_SCRIPTS: Final = frozenset(
    {"acquire_shard", "renew_shard", "release_shard", "commit_checkpoint"}
)


class Era:
    """One job's era as one context knows it (learned at the first script call, then fixed).

    Args:
        client: the job's Redis client.
        key: the era key (``Keys.era``).
        job_id: the job, for the error.
    """

    def __init__(self, client: Any, key: str, job_id: str) -> None:
        self._client = client
        self.key = key
        self.job_id = job_id
        self._value: str | None = None
        self._lock = threading.Lock()

    @property
    def known(self) -> str | None:
        """The era this context works in, or None before its first script call."""
        return self._value

    def value(self) -> str:
        """The era: learned once (created if the job has none yet), then always the same."""
        if self._value is None:
            with self._lock:
                if self._value is None:
                    fresh = secrets.token_hex(8)
                    # one round trip, atomic: set it if absent, and say what was there
                    try:
                        old = self._client.set(self.key, fresh, nx=True, get=True)
                    except MovedError as exc:
                        raise _moved(self.job_id, exc) from None
                    self._value = fresh if old is None else _text(old)
        return self._value

    def lost(self, found: object) -> StateLostError:
        """The error for a ``STATE_LOST`` reply (``found``: the stored era, "" if none)."""
        return StateLostError.because(self.job_id, self._value or "", _text(found) or None)

    def check(self) -> None:
        """Raise ``StateLostError`` if this context has an era and Redis no longer holds it.

        For code that finds state missing without a script (a plain read): it tells a loss
        from a thing never created.
        """
        if self._value is None:
            return
        found = self._client.get(self.key)
        if found is None or _text(found) != self._value:
            raise self.lost("" if found is None else found)


class EraScripts:
    """A job's view of the registered scripts: every call carries the era key and value.

    The same interface as ``Scripts`` (``run``, ``call``, ``run_many``); a ``STATE_LOST``
    reply raises ``StateLostError`` before anything else looks at it.

    Args:
        scripts: the scripts registered on the client.
        era: the job's era.
        min_replicas: after a script of ``DURABLE_SCRIPTS``, ``WAIT`` (on the same
            connection) until this many replicas have its writes; 0 does not wait.
        replica_timeout: the longest that wait lasts, seconds. A shortfall is logged and
            counted (``shortfalls``), never raised: the write is done on the primary, and
            ``WAIT`` makes a failover lose fewer acknowledged writes, it is no guarantee.
    """

    def __init__(
        self, scripts: Scripts, era: Era, min_replicas: int = 0, replica_timeout: float = 1.0
    ) -> None:
        self._scripts = scripts
        self._era = era
        self.min_replicas = min_replicas
        self.replica_timeout = replica_timeout
        self.shortfalls = 0

    @property
    def client(self) -> Any:
        """The client the scripts run on."""
        return self._scripts.client

    def names(self) -> list[str]:
        """The names of every registered script."""
        return self._scripts.names()

    def __getitem__(self, name: str) -> Any:
        """The registered ``redis.commands.core.Script`` (its ``sha``, its source)."""
        return self._scripts[name]

    def stamp(self, keys: Sequence[str], args: Sequence[Any]) -> tuple[list[str], list[Any]]:
        """A script call's keys and arguments with the era appended (for a caller that sends
        EVALSHA itself, as perf/bench_barrier.py does on raw sockets)."""
        return [*keys, self._era.key], [*args, self._era.value()]

    def _send(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except MovedError as exc:
            raise _moved(self._era.job_id, exc) from None
        except OutOfMemoryError as exc:  # the script wrote nothing: Redis refused its first write
            raise RedisMemoryFullError.at(self._era.job_id, exc) from exc

    def _checked(self, reply: Any) -> Any:
        if isinstance(reply, list) and len(reply) == 2 and reply[0] == _LOST:
            raise self._era.lost(reply[1])
        return reply

    def call(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run one script with the era; its raw reply (status unchecked, but never lost).

        Raises:
            StateLostError: the job's state in Redis is not this context's era's.
        """
        keys, args = self.stamp(keys, args)
        if not self.min_replicas or name not in DURABLE_SCRIPTS:
            return self._checked(self._send(self._scripts.call, name, keys, args))
        timeout_ms = max(1, round(self.replica_timeout * 1000))
        reply, acked = self._send(
            self._scripts.call_and_wait, name, keys, args, self.min_replicas, timeout_ms
        )
        if acked < self.min_replicas:
            self.shortfalls += 1
            log.warning(
                "job %r: %s: %d of %d replicas had its writes after %.3gs (a failover now "
                "could lose them)", self._era.job_id, name, acked, self.min_replicas,
                self.replica_timeout,
            )  # fmt: skip
        return self._checked(reply)

    def run(
        self,
        name: str,
        keys: Sequence[str],
        args: Sequence[Any],
        context: Context | Callable[[], Context],
    ) -> list[Any]:
        """Run one script with the era, map its status code, return the payload after it."""
        return check(self.call(name, keys, args), context)

    def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """Run several scripts with the era in one round trip; their raw replies."""
        stamped: list[Call] = [(name, *self.stamp(keys, args)) for name, keys, args in calls]
        return [self._checked(reply) for reply in self._send(self._scripts.run_many, stamped)]


def _moved(job_id: str, exc: MovedError) -> ValueError:
    """A plain client sent to one node of a Redis Cluster: say how to connect instead."""
    return ValueError(
        f"job {job_id!r} lives on another node of a Redis Cluster ({exc.host}:{exc.port}); "
        "connect with a redis+cluster://host:port URL (any node) or a "
        "redis.cluster.RedisCluster"
    )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")

"""The job's era and clock: state loss and rollback in Redis are detected, never papered over.

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

State can also go *back* while the era stands: a failover to a replica that lagged, a
restart from an older snapshot. So the prelude also ticks the job's clock
(``strata:{<job>}:clock``) on every call and returns the tick with the reply; a context
remembers the highest tick it saw (its ``mark``) and sends it with every call. Redis
holding a lower clock answers ``STATE_ROLLED_BACK`` before the script touches anything,
and marks the era rolled back, so every other process of the job (and any new one) stops
with ``StateRolledBackError`` too. Height alone can be masked: after a failover that lost k
ticks, k calls of processes that did not see them raise the clock back. So every call also
carries an id of its own (8 random characters: ``call_id``), which the prelude writes at its
tick in the job's history (``strata:{<job>}:history``, the last ``status.HISTORY_TICKS``
ticks), and the id of the call that took the context's mark: a history that holds another
id at the mark is a state that does not continue the one this process saw, whatever the
clock says. Committed checkpoints record the era and the mark, so a relaunch after a
rollback that no live process saw is caught by the first rank that resumes (``resume.py``).

``min_replicas`` (``WAIT``) narrows what a failover can lose; it cannot stop it (``WAIT`` is
no consensus: a replica that had the write may still not be the one promoted). What it
cannot prevent, the clock detects at the next call of a process that saw the lost writes.

The era also records the layout the job's state is written in (``keys.LAYOUT``):
``<16 hex>.v<layout>``. A context that learns an era of another layout (or of none: made by
older code) raises ``JobLayoutError`` before any script runs, once per process, at no cost
of its own (the era is read then anyway): code never reads state another version wrote.

A ``maxmemory-policy`` that evicts keys can drop a lease record or the epoch, which trains
samples twice: the first script call checks the policy (``check_eviction``) and refuses it
with ``RedisConfigError`` unless ``STRATA_ALLOW_EVICTION=1`` opts out (a warning then), and
calls check it again every ``POLICY_EVERY`` seconds (an operator's ``CONFIG SET`` while the
job runs). A key that is lost all the same (evicted meanwhile, deleted by hand) is caught by
the anchors and the structure checks of the scripts (``status.ERA_CHECK``: ``LOST``).
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from redis.exceptions import MovedError, NoPermissionError, OutOfMemoryError, ResponseError

from .connection import Replies, take_reply
from .durability import DEFAULT, REPLICATED, has_waitaof, shortfall, waits
from .errors import (
    Context,
    JobLayoutError,
    NotReplicatedError,
    RedisConfigError,
    RedisMemoryFullError,
    StateLostError,
    StateRolledBackError,
)
from .keys import LAYOUT, Keys
from .scripts import Call, Scripts, check
from .status import Status

__all__ = [
    "ALLOW_EVICTION_ENV",
    "DURABLE_SCRIPTS",
    "POLICY_EVERY",
    "Era",
    "EraScripts",
    "call_id",
    "check_eviction",
    "eviction_risk",
    "layout_of",
    "lost_error",
    "marked",
    "new_era",
    "queue_era_state",
    "take_era_state",
]

log = logging.getLogger("strata_redis.era")

#: what the prelude answers in place of a clock tick when it refused the call
_REFUSED: Final = 0
_LOST: Final = int(Status.STATE_LOST)
_ROLLED_BACK: Final = int(Status.STATE_ROLLED_BACK)
#: the scripts whose writes ``min_replicas`` waits for: lease grants, renewals, hand-backs and
#: completions, and checkpoint commits
DURABLE_SCRIPTS: Final = frozenset(
    {"acquire_shard", "renew_shard", "release_shard", "commit_checkpoint"}
)
#: what separates an era's random id from the layout of the job's state (``new_era``)
LAYOUT_TAG: Final = ".v"
#: how a rolled-back era is marked in Redis (``status.ERA_CHECK``):
#: ``<era>!rolled-back:<clock it held><<clock a process had seen>``, or ``...~<seen>`` when
#: the clock was not behind but Redis' history at the seen tick is another call's
ROLLED_BACK_MARK: Final = "!rolled-back:"
#: how an era is marked in Redis when part of its state is gone (``status.ERA_CHECK``):
#: ``<era>!lost:<key>`` (an anchor's name, or any key's part after the job's tag:
#: ``status.ERA_CHECK``'s ``LOST``)
PARTLY_LOST_MARK: Final = "!lost:"
#: set to 1 to run on a Redis whose ``maxmemory-policy`` may evict the job's keys
ALLOW_EVICTION_ENV: Final = "STRATA_ALLOW_EVICTION"
#: seconds between two checks of ``maxmemory-policy`` by one process (one ``INFO memory``)
POLICY_EVERY: Final = 10.0


def eviction_risk(policy: str, limit: int) -> str | None:
    """What a ``maxmemory-policy`` (with ``maxmemory`` ``limit`` bytes, 0: none) risks for a
    job, in words; None for ``noeviction`` (at the limit, writes fail instead)."""
    if policy == "noeviction":
        return None
    return (
        f"Redis' maxmemory-policy is {policy!r}"
        + (f" with maxmemory {limit} bytes" if limit else " (no maxmemory yet)")
        + ": at the memory limit Redis evicts keys, and an evicted lease record, epoch or "
        "checkpoint step can train samples twice or hang the job"
    )


def check_eviction(client: Any, job_id: str, known: str | None = None) -> str | None:
    """Refuse a Redis whose ``maxmemory-policy`` may evict keys (``INFO memory``).

    Args:
        known: the policy the last check saw: the same policy again is not warned twice.

    Returns:
        The policy (None: Redis did not say: ``INFO`` is not allowed to this user, or a
        Redis Cluster client, which asks every node: then nothing is checked).

    Raises:
        RedisConfigError: a policy other than ``noeviction`` with a ``maxmemory`` set,
            unless ``$STRATA_ALLOW_EVICTION`` is ``1`` (then one WARNING).
    """
    try:
        info = client.info("memory")
    except (NoPermissionError, ResponseError) as exc:
        log.debug("job %r: maxmemory-policy not checked: %s", job_id, exc)
        return None
    if not isinstance(info, dict) or "maxmemory_policy" not in info:
        return None  # a cluster client answers per node: not checked
    policy = str(info["maxmemory_policy"])
    limit = int(info.get("maxmemory", 0) or 0)
    what = eviction_risk(policy, limit)
    if what is None:
        return policy
    allowed = os.environ.get(ALLOW_EVICTION_ENV, "") == "1"
    if limit and not allowed:
        raise RedisConfigError(
            f"job {job_id!r}: {what}. Set `maxmemory-policy noeviction` (at the limit, calls "
            "then wait for memory, and fail with a clear error past redis_retry), or set "
            f"{ALLOW_EVICTION_ENV}=1 to run "
            "anyway without the exactly-once guarantee",
            setting="maxmemory-policy", value=policy,
        )  # fmt: skip
    if policy != known:
        log.warning("job %r: %s (use `maxmemory-policy noeviction`)", job_id, what)
    return policy


def new_era() -> str:
    """A fresh era: a random id and this code's layout (``<16 hex>.v<LAYOUT>``)."""
    return f"{secrets.token_hex(8)}{LAYOUT_TAG}{LAYOUT}"


def layout_of(era: str) -> int | None:
    """The layout an era records (None: none, an era made by older code); the marks a
    rollback or loss appends (``!...``) are skipped."""
    _, tag, version = era.split("!", 1)[0].rpartition(LAYOUT_TAG)
    return int(version) if tag and version.isdigit() else None


def marked(found: str) -> bool:
    """Whether an era key's value is marked rolled back or partly lost (no longer usable)."""
    return ROLLED_BACK_MARK in found or PARTLY_LOST_MARK in found


def lost_error(job_id: str, era: str, found: str | None) -> StateLostError:
    """The error for a job whose era is not ``era``: Redis holds ``found`` (None: no era),
    which may be an era marked rolled back (``StateRolledBackError``, with the clock Redis
    held and the one a process had seen, read from the mark) or partly lost (naming the key).

    The era key's format is read here only; the error classes format what they are given.
    """
    if found and ROLLED_BACK_MARK in found:
        tail = found.split(ROLLED_BACK_MARK, 1)[1]
        diverged = "~" in tail
        low, _, high = tail.partition("~" if diverged else "<")
        clock, seen = (int(low), int(high)) if low.isdigit() and high.isdigit() else (None, None)
        return StateRolledBackError.detected(
            job_id, era, clock, seen, found=found, diverged=diverged
        )
    if found and PARTLY_LOST_MARK in found:
        key = found.split(PARTLY_LOST_MARK, 1)[1] or "?"
        return StateLostError.partly(job_id, era, found, key)
    return StateLostError.because(job_id, era, found)


class Era:
    """One job's era as one context knows it (learned at the first script call, then fixed),
    and the highest tick of the job's clock this process has seen.

    Args:
        client: the job's Redis client.
        key: the era key (``Keys.era``).
        job_id: the job, for the error.
        clock_key: the clock key (``Keys.clock``).
        anchors: the job's anchor keys, in ``status.ANCHORS``' order (``Keys.anchors``).
        history_key: the history key (``Keys.history``).
    """

    def __init__(
        self,
        client: Any,
        key: str,
        job_id: str,
        clock_key: str,
        anchors: Sequence[str],
        history_key: str,
    ) -> None:
        self._client = client
        self.key = key
        self.clock_key = clock_key
        self.history_key = history_key
        self.anchors = tuple(anchors)
        self.job_id = job_id
        self._value: str | None = None
        #: (the mark, the id of the call that took it: "" when not known): one attribute,
        #: so a reader never pairs a mark with another tick's id
        self._seen: tuple[int, str] = (0, "")
        self._lock = threading.Lock()
        #: the maxmemory-policy the last check saw, and when the next check is due
        self._policy: str | None = None
        self._policy_due = 0.0
        #: the refusal of the last check: every call raises it until a check passes (one
        #: call alone could be a heartbeat thread's, which logs it and goes on)
        self._refused: RedisConfigError | None = None

    @property
    def known(self) -> str | None:
        """The era this context works in, or None before its first script call."""
        return self._value

    @property
    def mark(self) -> int:
        """The highest tick of the job's clock this process has seen (0: none yet)."""
        return self._seen[0]

    @property
    def seen_at(self) -> tuple[int, str]:
        """The mark and the id of the call that took it ("": not known, e.g. a mark read
        from a checkpoint): what every call sends for the prelude's checks."""
        return self._seen

    def seen(self, clock: int, call: str = "") -> None:
        """Raise the mark to ``clock`` (a tick Redis answered to the call with the id
        ``call``, or a checkpoint recorded: no id)."""
        if clock > self._seen[0]:
            with self._lock:
                if clock > self._seen[0]:
                    self._seen = (clock, call)

    def value(self) -> str:
        """The era: learned once (created if the job has none yet), then always the same.

        Raises:
            StateRolledBackError: the job's era is marked rolled back.
            JobLayoutError: the job's state was made in another layout (``keys.LAYOUT``).
            RedisConfigError: Redis may evict the job's keys (``check_eviction``).
        """
        if self._value is None:
            with self._lock:
                if self._value is None:
                    fresh = new_era()
                    # one round trip, atomic: set it if absent, and say what was there
                    try:
                        old = self._client.set(self.key, fresh, nx=True, get=True)
                    except MovedError as exc:
                        raise _moved(self.job_id, exc) from None
                    era = fresh if old is None else _text(old)
                    if marked(era):
                        raise lost_error(self.job_id, "", era)
                    layout = layout_of(era)
                    if layout != LAYOUT:
                        raise JobLayoutError.made(self.job_id, era, layout, LAYOUT)
                    self._policy = check_eviction(self._client, self.job_id)
                    self._policy_due = time.monotonic() + POLICY_EVERY
                    self._value = era
        return self._value

    def watch(self) -> None:
        """Check ``maxmemory-policy`` again when ``POLICY_EVERY`` seconds have passed since
        the last check (it can be changed while the job runs).

        Raises:
            RedisConfigError: Redis may evict the job's keys now (``check_eviction``).
        """
        if self._value is None:
            return
        if time.monotonic() >= self._policy_due:
            self._policy_due = time.monotonic() + POLICY_EVERY  # once per period, not per thread
            try:
                self._policy = check_eviction(self._client, self.job_id, self._policy)
                self._refused = None
            except RedisConfigError as exc:
                self._refused = exc
        if self._refused is not None:
            raise self._refused

    def lost(self, found: object) -> StateLostError:
        """The error for a ``STATE_LOST`` reply (``found``: the stored era, "" if none)."""
        return lost_error(self.job_id, self._value or "", _text(found) or None)

    def rolled_back(self, clock: object, diverged: bool = False) -> StateRolledBackError:
        """The error for a ``STATE_ROLLED_BACK`` reply (``clock``: the clock Redis held;
        ``diverged``: it was not below the mark, but Redis' history at the mark is another)."""
        mark = self._seen[0]
        return StateRolledBackError.detected(
            self.job_id, self._value or "", int(_text(clock) or 0), mark,
            by="this process (from Redis, or from the newest checkpoint)",
            found=f"{self._value}{ROLLED_BACK_MARK}{_text(clock)}{'~' if diverged else '<'}{mark}",
            diverged=diverged,
        )  # fmt: skip

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


def queue_era_state(pipe: Any, job_id: str) -> None:
    """Queue a read of the job's era (for a reader that shows whether its state is usable:
    ``lifecycle.job_state``'s ``lost``)."""
    pipe.get(Keys(job_id).era)


def take_era_state(replies: Replies) -> bool:
    """Whether the job's state is intact, from ``queue_era_state``'s reply: its era exists
    and is not marked rolled back or partly lost."""
    era = _text(take_reply(replies))
    return bool(era) and not marked(era)


class EraScripts:
    """A job's view of the registered scripts: every call carries the era key and value.

    The same interface as ``Scripts`` (``run``, ``call``, ``run_many``); a ``STATE_LOST``
    reply raises ``StateLostError`` before anything else looks at it.

    Args:
        scripts: the scripts registered on the client.
        era: the job's era.
        min_replicas: after a script of ``DURABLE_SCRIPTS``, ``WAIT`` (on the same
            connection) until this many replicas have its writes; 0 does not wait.
        replica_timeout: the longest one wait lasts, seconds. In the default durability a
            shortfall is logged and counted (``shortfalls``), never raised: the write is done
            on the primary, and ``WAIT`` makes a failover lose fewer acknowledged writes, it
            is no guarantee.
        durability: ``"replicated"``: a shortfall is asked again (the wait alone, on the same
            connection) until ``budget`` seconds have passed, then raised
            (``NotReplicatedError``), and the wait also asks the primary's AOF fsync where
            the server has ``WAITAOF`` (``durability.py``).
        budget: the seconds a replicated call waits for its replicas (the job's
            ``redis_retry``).
    """

    def __init__(
        self,
        scripts: Scripts,
        era: Era,
        min_replicas: int = 0,
        replica_timeout: float = 1.0,
        durability: str = DEFAULT,
        budget: float = 60.0,
    ) -> None:
        self._scripts = scripts
        self._era = era
        self.min_replicas = min_replicas
        self.replica_timeout = replica_timeout
        self.durability = durability
        self.budget = budget
        self.shortfalls = 0
        #: whether this server takes ``WAITAOF 1`` (``durability.has_waitaof``), asked at the
        #: first replicated call and again after a refusal (AOF switched off, a failover)
        self._waitaof: bool | None = None

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
        """A script call's keys and arguments with the era, the clock and the history
        appended (for a caller that sends EVALSHA itself, as perf/bench_barrier.py does on
        raw sockets: it passes the raw reply and these arguments to ``unwrap``). The job's
        anchor keys go first (the prelude checks that those once made still exist:
        ``status.ANCHORS``); the last argument is this call's own id."""
        era = self._era.value()
        try:
            self._era.watch()
        except RedisConfigError:
            # a state that went back or was lost outranks the policy's refusal: a job
            # stopped by the refusal alone would be relaunched on that state without a word
            stamped = self._stamped([], [], era)
            self.unwrap(self._send(self._scripts.call, "check_era", *stamped), stamped[1])
            raise
        return self._stamped(keys, args, era)

    def _stamped(
        self, keys: Sequence[str], args: Sequence[Any], era: str
    ) -> tuple[list[str], list[Any]]:
        mark, mark_id = self._era.seen_at
        era_keys = [*self._era.anchors, self._era.key, self._era.clock_key, self._era.history_key]
        return [*keys, *era_keys], [*args, era, mark, mark_id, call_id()]

    def _send(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except MovedError as exc:
            raise _moved(self._era.job_id, exc) from None
        except OutOfMemoryError as exc:  # the script wrote nothing: Redis refused its first write
            raise RedisMemoryFullError.at(self._era.job_id, exc) from exc

    def unwrap(self, reply: Any, args: Sequence[Any]) -> Any:
        """A script's reply as the script returned it: the prelude's clock tick taken off
        (and remembered with the call's id, the last of its stamped ``args``), its refusals
        raised.

        Raises:
            StateLostError: the job's state in Redis is not this context's era's, or the
                script found a key of a structure it relies on gone (``LOST`` in the prelude).
            StateRolledBackError: it went back (Redis' clock is below this process's mark,
                or its history at the mark is not the one this process saw).
        """
        if isinstance(reply, Exception):
            return reply
        tick = int(reply[0])
        inner: Any = reply[1] if len(reply) > 1 else None
        if tick == _REFUSED:
            if inner[0] == _ROLLED_BACK:
                raise self._era.rolled_back(inner[1], diverged=len(inner) > 2)
            if inner[0] == _LOST:
                raise self._era.lost(inner[1])
        self._era.seen(tick, args[-1])
        if isinstance(inner, list) and inner and inner[0] == _LOST:
            raise self._era.lost(inner[1])  # the script found a key of its structure gone
        return inner

    def call(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run one script with the era; its raw reply (status unchecked, but never lost).

        Raises:
            StateLostError: the job's state in Redis is not this context's era's.
        """
        keys, args = self.stamp(keys, args)
        if not self.min_replicas or name not in DURABLE_SCRIPTS:
            return self.unwrap(self._send(self._scripts.call, name, keys, args), args)
        if self.durability == REPLICATED:
            return self.unwrap(self._replicated(name, keys, args), args)
        timeout_ms = max(1, round(self.replica_timeout * 1000))
        reply, (acked,) = self._send(
            self._scripts.call_and_wait,
            name,
            keys,
            args,
            waits(self.min_replicas, timeout_ms, False),
        )
        if isinstance(acked, Exception):
            raise acked
        if int(acked) < self.min_replicas:
            self.shortfalls += 1
            log.warning(
                "job %r: %s: %d of %d replicas had its writes after %.3gs (a failover now "
                "could lose them)", self._era.job_id, name, acked, self.min_replicas,
                self.replica_timeout,
            )  # fmt: skip
        return self.unwrap(reply, args)

    def _replicated(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a durable script and wait until ``min_replicas`` replicas (and the local AOF,
        where ``WAITAOF`` is there) confirm it, asking again within ``budget``; its raw reply.

        The reply of a call not confirmed is dropped before ``unwrap``: its clock tick does
        not raise this process's mark, so a failover that loses it reads as no rollback of
        what this process was told.

        Raises:
            NotReplicatedError: not confirmed within ``budget`` seconds.
        """
        if self._waitaof is None:
            self._waitaof = self._send(has_waitaof, self._scripts.client)
        timeout_ms = max(1, round(self.replica_timeout * 1000))
        plan = waits(self.min_replicas, timeout_ms, self._waitaof)
        began = time.monotonic()
        confirmed = refused = False
        missing: tuple[int, bool] | None = None  # the last shortfall

        def again(reply: Any, replies: list[Any]) -> list[Any] | None:
            nonlocal plan, confirmed, refused, missing
            if _refusal(reply):
                refused = True  # a rollback or loss: raised now, not after the budget
                return None
            try:
                short = shortfall(replies, self.min_replicas)
            except ResponseError as exc:
                if len(plan) == 1:
                    raise
                # WAITAOF refused (AOF switched off meanwhile): ask again with WAIT alone
                log.warning("job %r: %s: %s; waiting with WAIT", self._era.job_id, name, exc)
                self._waitaof = None
                plan = waits(self.min_replicas, timeout_ms, False)
                return plan
            if short is None:
                confirmed = True
                return None
            if missing is None:
                self.shortfalls += 1
                log.warning(
                    "job %r: %s: %d of %d replicas confirmed it after %.3gs; asking again for "
                    "up to %.3gs (durability='replicated')", self._era.job_id, name, short[0],
                    self.min_replicas, self.replica_timeout, self.budget,
                )  # fmt: skip
            missing = short
            return plan if time.monotonic() - began < self.budget else None

        reply, _ = self._send(self._scripts.call_and_wait, name, keys, args, plan, again)
        if refused:
            return reply  # (unwrap raises it: it outranks a shortfall)
        if not confirmed:
            acked, fsynced = missing or (0, False)
            raise NotReplicatedError.after(
                self._era.job_id, name, acked, self.min_replicas, fsynced,
                time.monotonic() - began,
            )  # fmt: skip
        return reply

    def run(
        self,
        name: str,
        keys: Sequence[str],
        args: Sequence[Any],
        context: Context | Callable[[], Context],
    ) -> list[Any]:
        """Run one script with the era, map its status code, return the payload after it."""
        return check(self.call(name, keys, args), context)

    def check(self) -> None:
        """Run the era and clock check alone (``check_era``): after raising the era's mark
        from elsewhere (a checkpoint's clock), learn now whether Redis went back.

        Raises:
            StateLostError: as ``call``; ``StateRolledBackError`` when Redis went back.
        """
        self.run("check_era", [], [], {"job_id": self._era.job_id})

    def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """Run several scripts with the era in one round trip; their raw replies."""
        stamped: list[Call] = [(name, *self.stamp(keys, args)) for name, keys, args in calls]
        replies = self._send(self._scripts.run_many, stamped)
        return [self.unwrap(reply, call[2]) for reply, call in zip(replies, stamped, strict=True)]


def _refusal(reply: Any) -> bool:
    """Whether a script's raw reply is a refusal ``unwrap`` raises: the prelude's (a state
    lost or rolled back) or the script's ``LOST`` (a key of its structure gone)."""
    if isinstance(reply, Exception):
        return False
    inner = reply[1] if len(reply) > 1 else None
    return int(reply[0]) == _REFUSED or (
        isinstance(inner, list) and bool(inner) and inner[0] == _LOST
    )


def call_id() -> str:
    """A fresh id for one script call: 8 URL-safe characters from 6 random bytes (readable
    in ``redis-cli`` and in SLOWLOG, and one slot of the job's history)."""
    return base64.urlsafe_b64encode(os.urandom(6)).decode()


def _moved(job_id: str, exc: MovedError) -> ValueError:
    """A plain client sent to one node of a Redis Cluster: say how to connect instead."""
    return ValueError(
        f"job {job_id!r} lives on another node of a Redis Cluster ({exc.host}:{exc.port}); "
        "connect with a redis+cluster://host:port URL (any node) or a "
        "redis.cluster.RedisCluster"
    )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")

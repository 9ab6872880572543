"""The durability modes: when a lease grant, completion or checkpoint commit is acknowledged.

``durability="default"``: a call returns once the primary applied it. ``min_replicas``
then ``WAIT``\\ s for that many replicas after each call of ``era.DURABLE_SCRIPTS``, best
effort: a replica that does not answer in ``replica_timeout`` is logged and counted, and the
call returns all the same.

``durability="replicated"``: such a call is acknowledged (returns) only once at least
``min_replicas`` replicas (1 unless set) confirmed its writes — and, on a Redis that has
``WAITAOF`` (7.2 or later) with AOF on, once the primary fsynced them too. A replica that
does not confirm in ``replica_timeout`` is asked again (``WAIT`` only: the script is not
sent twice) until the job's ``redis_retry`` budget is spent; then the call raises
``NotReplicatedError`` and its effect must be treated as not acknowledged. ``WAIT`` covers
every write before it in the replication stream, so a replica that confirmed a call also
holds everything the call saw: a failover to it loses nothing acknowledged. ``WAIT`` is no
consensus: a failover to a replica that did *not* confirm can still lose acknowledged
writes (``docs/operations/redis.md`` says which deployments rule that out).

This module names the modes, validates them, chooses the wait commands for one server
(``waits``, ``shortfall``) and judges what a deployment can honour (``assess``: ``strata
doctor``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from redis.exceptions import NoPermissionError, ResponseError

__all__ = [
    "DEFAULT",
    "DURABILITY_ENV",
    "MODES",
    "REPLICATED",
    "Deployment",
    "assess",
    "check_durability",
    "has_waitaof",
    "knows_waitaof",
    "shortfall",
    "waits",
]

log = logging.getLogger("strata_redis.durability")

#: a call is acknowledged once the primary applied it (``min_replicas``: best effort)
DEFAULT: Final = "default"
#: a call of ``era.DURABLE_SCRIPTS`` is acknowledged once ``min_replicas`` replicas have it
REPLICATED: Final = "replicated"
#: every mode, in the order the docs list them
MODES: Final = (DEFAULT, REPLICATED)
#: the mode of a job when none is given in code
DURABILITY_ENV: Final = "STRATA_DURABILITY"


def check_durability(value: object) -> str:
    """A durability mode, validated; None reads ``$STRATA_DURABILITY``, else ``"default"``.

    Raises:
        ValueError: not one of ``MODES`` (the message names them).
        TypeError: not a string.
    """
    source = "durability"
    if value is None:
        value = os.environ.get(DURABILITY_ENV, "").strip() or DEFAULT
        source = f"${DURABILITY_ENV}"
    if not isinstance(value, str):
        raise TypeError(f"{source} must be a str, got {type(value).__name__} {value!r}")
    if value not in MODES:
        choices = ", ".join(repr(m) for m in MODES)
        raise ValueError(f"{source} must be one of {choices}, got {value!r}")
    return value


def knows_waitaof(client: Any) -> bool:
    """Whether this server has ``WAITAOF`` (Redis 7.2 or later), probed with ``WAITAOF 0 0
    0``, which waits for nothing (refused or not allowed to this user: False)."""
    try:
        client.execute_command("WAITAOF", 0, 0, 0)
    except (NoPermissionError, ResponseError) as exc:
        log.debug("no WAITAOF: %s", exc)
        return False
    return True


def has_waitaof(client: Any) -> bool:
    """Whether ``WAITAOF 1 ...`` can be sent to this server: it has the command
    (``knows_waitaof``) and AOF is on (with AOF off it refuses a local count). Not readable
    by this user: False (``WAIT`` alone)."""
    if not knows_waitaof(client):
        return False
    try:
        info = client.info("persistence")
    except (NoPermissionError, ResponseError):
        return False
    return bool(int(info.get("aof_enabled", 0) or 0)) if isinstance(info, dict) else False


def waits(replicas: int, timeout_ms: int, waitaof: bool) -> list[tuple[Any, ...]]:
    """The command sent after a durable call on its connection: ``WAIT replicas timeout``,
    or ``WAITAOF 1 0 timeout`` then ``WAIT`` where the server fsyncs (``has_waitaof``): the
    primary's own AOF, and replicas counted as ``WAIT`` counts them (in memory), so the
    mode's promise does not depend on the replicas' persistence."""
    wait = ("WAIT", replicas, timeout_ms)
    return [("WAITAOF", 1, 0, timeout_ms), wait] if waitaof else [wait]


def shortfall(replies: Sequence[Any], replicas: int) -> tuple[int, bool] | None:
    """What ``waits``' replies fall short of: None when every replica and the local fsync
    (if asked) confirmed, else ``(replicas that confirmed, local fsync confirmed)``.

    Raises:
        ResponseError: a wait was refused (e.g. AOF switched off since ``has_waitaof``).
    """
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    acked = int(replies[-1])
    local = int(replies[0][0]) >= 1 if len(replies) > 1 else True
    return None if acked >= replicas and local else (acked, local)


@dataclass(frozen=True)
class Deployment:
    """What a Redis primary says about its durability, as ``strata doctor`` reads it.

    Attributes:
        role: ``master`` or ``slave`` (INFO replication).
        replicas: replicas connected to it.
        in_sync: of those, the ones whose acknowledged offset is the primary's (or within
            a second of lag, ``lag`` 0 or 1).
        min_replicas_to_write: ``min-replicas-to-write`` (None: not readable).
        aof: AOF on.
        fsync: ``appendfsync`` (None: not readable or AOF off).
        waitaof: the server has ``WAITAOF`` (7.2 or later).
    """

    role: str
    replicas: int
    in_sync: int
    min_replicas_to_write: int | None
    aof: bool
    fsync: str | None
    waitaof: bool


def assess(deployment: Deployment) -> tuple[str, str]:
    """Which durability mode this deployment can honour: ``(level, detail)`` for the doctor.

    ``ok`` when ``durability="replicated"`` can be honoured (a replica in sync), ``warn``
    when only ``"default"`` can (a replicated call would wait out its budget and raise
    ``NotReplicatedError``), each with what a failover or a restart may lose.
    """
    d = deployment
    if d.role != "master":
        return "warn", (
            f"this server is a {d.role}: ask its primary (durability is judged where writes go)"
        )
    disk = (
        f"AOF appendfsync {d.fsync or '?'}" + (", WAITAOF fsyncs each acknowledged call"
                                               if d.waitaof else ", no WAITAOF (Redis < 7.2)")
        if d.aof else "no AOF: a restart of the primary alone loses what no replica has"
    )  # fmt: skip
    if d.replicas == 0:
        return "warn", (
            "durability replicated: cannot be honoured (no replica); default only: a "
            f"failover or restart loses unreplicated writes ({disk})"
        )
    if d.in_sync == 0:
        return "warn", (
            f"durability replicated: cannot be honoured now ({d.replicas} replica(s), none "
            f"in sync); default only ({disk})"
        )
    if d.replicas == 1:
        safety = "a failover can only promote that replica"
    else:
        safety = (
            f"{d.replicas} replicas: a failover may promote one that did not confirm a call; "
            f"use min_replicas={d.replicas}, or a Sentinel that promotes the most advanced one"
        )
    if d.min_replicas_to_write:
        safety += (
            f"; min-replicas-to-write {d.min_replicas_to_write}: with fewer replicas in reach "
            "the primary refuses writes at once"
        )
    return "ok", (
        f"durability replicated: can be honoured ({d.in_sync} of {d.replicas} replica(s) "
        f"in sync; {safety}; {disk})"
    )

"""A job's lifecycle: its record (``Keys.job``), ending it, expiring it, opening it again,
and the state a reader shows for it; and the walks over every key of a job (``SCAN`` in
bounded steps) that expire, persist or delete them.

States (``JOB_STATES``), as ``job_state`` derives them from what Redis holds:

- ``running``: at least one worker heartbeated within the job's heartbeat timeout;
- ``stale``: workers are registered but all silent past the job's timeout (nobody reaped
  them: every worker died at once), or the last of them was declared failed;
- ``ended``: ended explicitly (``Job.end()``, or ``TrainingOrchestrator`` when its last
  rank closes after the loop), or every worker left (the last one deregistered);
- ``lost``: the job's era key is gone while its record or workers remain, or it is marked
  rolled back or partly lost (``era.py``: Redis lost the job's state, or part of it, or went
  back);
- ``idle``: no worker ever registered (a job with checkpoints only).

The record is made by the job's first registration (``open_job``) and holds the job's
heartbeat timeout: readers (``strata status``, ``strata jobs``, the dashboard, ``/metrics``)
judge staleness by it, not by a default of their own. An ended job's keys expire
``retention`` seconds after the end (``DEFAULT_RETENTION_S``, ``$STRATA_JOB_RETENTION``, or
per job). A worker that registers in an ended job opens it again: ``running``, its keys'
expiry cleared (a relaunch carries on; the checkpoint index is rebuilt from storage if it
was gone).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..connection import Replies, is_cluster, run_read, server_time, take_reply
from ..context import DEFAULT_RETENTION_S, MAX_RETENTION_S, RETENTION_ENV, JobContext
from ..era import queue_era_state, take_era_state
from ..keys import Keys
from ..scripts import check
from ..validate import check_seconds
from .registry import (
    list_jobs,
    queue_events,
    queue_liveness,
    queue_registered,
    take_events,
    take_liveness,
    take_registered,
)

__all__ = [
    "DEFAULT_RETENTION_S",
    "JOB_STATES",
    "KEY_BATCH",
    "MAX_RETENTION_S",
    "RETENTION_ENV",
    "JobRecord",
    "JobState",
    "delete_job",
    "discover_jobs",
    "end_job",
    "job_keys",
    "job_state",
    "open_job",
    "queue_record",
    "read_record",
    "read_states",
    "take_record",
]

log = logging.getLogger("strata_redis.lifecycle")

JOB_STATES: Final = ("running", "stale", "ended", "lost", "idle")
#: keys per script call or ``UNLINK`` of a walk over a job's keys (and the ``SCAN`` hint)
KEY_BATCH: Final = 500


@dataclass(frozen=True)
class JobRecord:
    """A job's record (``Keys.job``), as stored.

    Attributes:
        created_ms: when its first worker registered, ms on Redis' clock.
        state: ``running`` or ``ended`` (the derived states are ``JobState.state``).
        heartbeat_timeout_s: the job's heartbeat timeout.
        retention_s: how long its keys are kept once it ended.
        ended_ms, expires_ms: while ended: when it ended, and when its keys expire.
        reopened: times it was joined again after it ended.
    """

    created_ms: int | None
    state: str
    heartbeat_timeout_s: float | None
    retention_s: float | None
    ended_ms: int | None = None
    expires_ms: int | None = None
    reopened: int = 0


def _int(value: Any) -> int | None:
    return None if value in (None, "") else int(value)


def queue_record(pipe: Any, job_id: str) -> None:
    """Queue a read of the job's record."""
    pipe.hgetall(Keys(job_id).job)


def take_record(replies: Replies) -> JobRecord | None:
    """The record ``queue_record`` read; None if the job has none (no worker ever
    registered, or a job from before records were kept)."""
    raw = {_text(k): _text(v) for k, v in (take_reply(replies) or {}).items()}
    if not raw.get("state"):
        return None
    timeout = _int(raw.get("heartbeat_timeout_ms"))
    retention = raw.get("retention_s")
    return JobRecord(
        created_ms=_int(raw.get("created_ms")),
        state=raw["state"],
        heartbeat_timeout_s=None if timeout is None else timeout / 1000,
        retention_s=None if not retention else float(retention),
        ended_ms=_int(raw.get("ended_ms")),
        expires_ms=_int(raw.get("expires_ms")),
        reopened=_int(raw.get("reopened")) or 0,
    )


def read_record(ctx: JobContext) -> JobRecord | None:
    """The job's record (None: it has none)."""
    return run_read(ctx.client, lambda pipe: queue_record(pipe, ctx.job_id), take_record)


def job_state(
    record: JobRecord | None,
    *,
    era: bool,
    live: int,
    fresh: int,
    registered: int,
    last_event: str | None,
) -> str:
    """A job's state (``JOB_STATES``) from what Redis holds.

    Args:
        record: the job's record (``take_record``).
        era: whether the job's state is intact (``era.take_era_state``).
        live: workers in the live set (registered, not failed or left), fresh or silent.
        fresh: those of them that heartbeated within the job's heartbeat timeout.
        registered: every worker the job has seen.
        last_event: the type of the newest membership event (``join``, ``leave``, ...).
    """
    if not era and (record is not None or registered):
        return "lost"
    if record is not None and record.state == "ended":
        return "ended"
    if fresh:
        return "running"
    if live:
        return "stale"
    if registered:
        return "ended" if last_event == "leave" else "stale"
    return "idle"


@dataclass(frozen=True)
class JobState:
    """One job as ``strata jobs`` lists it (its lifecycle part: ``read_states``).

    Attributes:
        job_id: the job.
        state: one of ``JOB_STATES``.
        live: workers that heartbeated within the job's heartbeat timeout.
        registered: every worker the job has seen (live, silent, failed and left).
        silent: workers registered as live but silent past the timeout (not reaped).
        heartbeat_timeout_s: the job's (its record's, else the reader's default).
        last_activity_ms: the newest heartbeat or membership event, else the record's
            end or creation, ms on Redis' clock; None if none of them.
        record: the job's record, if it has one.
        now_ms: Redis' time of the read, ms.
    """

    job_id: str
    state: str
    live: int
    registered: int
    silent: int
    heartbeat_timeout_s: float
    last_activity_ms: int | None
    record: JobRecord | None
    now_ms: int


def read_states(
    client: Any, job_ids: Sequence[str], heartbeat_timeout: float = 10.0
) -> list[JobState]:
    """The lifecycle state of each job, in two pipelined round trips (bounded commands).

    Args:
        client: the Redis (a cluster client too: each job's reads go to its node).
        job_ids: the jobs.
        heartbeat_timeout: the timeout of a job that has no record, seconds.
    """
    if not job_ids:
        return []
    cluster = is_cluster(client)
    with client.pipeline(transaction=False) as pipe:
        if not cluster:
            pipe.time()
        for job_id in job_ids:
            queue_record(pipe, job_id)
        replies = iter(pipe.execute())
    if cluster:
        sec, usec = server_time(client, Keys(job_ids[0]).job)
    else:
        sec, usec = take_reply(replies)
    now_ms = int(sec) * 1000 + int(usec) // 1000
    records = [take_record(replies) for _ in job_ids]
    timeouts = [
        r.heartbeat_timeout_s if r is not None and r.heartbeat_timeout_s else heartbeat_timeout
        for r in records
    ]
    with client.pipeline(transaction=False) as pipe:
        for job_id, timeout in zip(job_ids, timeouts, strict=True):
            queue_era_state(pipe, job_id)
            queue_liveness(pipe, job_id, now_ms - int(timeout * 1000))
            queue_registered(pipe, job_id)
            queue_events(pipe, job_id, 1)
        replies = iter(pipe.execute())
    out = []
    for job_id, record, timeout in zip(job_ids, records, timeouts, strict=True):
        era = take_era_state(replies)
        live, fresh, newest = take_liveness(replies)
        registered = take_registered(replies)
        events = take_events(replies).entries
        last_event = events[0][1] if events else None
        activity = [newest] if newest is not None else []
        if last_event is not None:
            activity.append(last_event.ms)
        if record is not None:
            activity += [ms for ms in (record.ended_ms, record.created_ms) if ms is not None]
        state = job_state(
            record, era=era, live=live, fresh=fresh, registered=registered,
            last_event=None if last_event is None else last_event.type,
        )  # fmt: skip
        out.append(JobState(
            job_id, state, fresh, registered, live - fresh, timeout,
            max(activity) if activity else None, record, now_ms,
        ))  # fmt: skip
    return out


def open_job(ctx: JobContext) -> bool:
    """A worker joins: create the job's record on its first registration, or open an ended
    job again (its keys' expiry cleared, in bounded steps). Called by ``register_worker``.

    Returns:
        Whether the job had ended and was opened again.

    Raises:
        StateLostError: the job's era is gone.
    """
    k = ctx.keys
    reply = check(
        ctx.scripts.call(
            "open_job", [k.job], [int(ctx.heartbeat_timeout * 1000), _retention_arg(ctx.retention)]
        ),
        {"job_id": ctx.job_id},
    )
    reopened, stored_ms, expires = int(reply[0]), int(reply[1]), _text(reply[2])
    if stored_ms != int(ctx.heartbeat_timeout * 1000):
        log.warning(
            "job %r: this process's heartbeat timeout is %gs, the job's is %gs (set by its "
            "first worker); readers judge staleness by the job's", ctx.job_id,
            ctx.heartbeat_timeout, stored_ms / 1000,
        )  # fmt: skip
    if reopened:
        log.info("job %r was ended: opened again, its keys no longer expire", ctx.job_id)
        if expires:
            _walk(ctx, "persist_keys", expires)
    return bool(reopened)


def end_job(
    ctx: JobContext, retention: float | None = None, *, only_if_idle: bool = False
) -> int | None:
    """End the job: its record says ``ended``, and every key of the job expires
    ``retention`` seconds from now (set in bounded steps over a ``SCAN`` of its keys).

    Ending an ended job keeps its end and expiry, and gives keys written since the same
    expiry. A worker that registers afterwards opens the job again.

    Args:
        ctx: the job.
        retention: seconds its keys are kept (default: the context's ``retention``).
        only_if_idle: end it only if no worker is live (the orchestrator's last rank).

    Returns:
        When the job's keys expire, ms on Redis' clock; None if ``only_if_idle`` and
        workers are live.

    Raises:
        StateLostError: the job's era is gone.
        ValueError, TypeError: a bad ``retention``.
    """
    if retention is None:
        retention = ctx.retention
    retention = check_seconds("retention", retention, high=MAX_RETENTION_S)
    k = ctx.keys
    reply = check(
        ctx.scripts.call(
            "end_job", [k.job, k.heartbeats],
            [_retention_arg(retention), "1" if only_if_idle else "0",
             int(ctx.heartbeat_timeout * 1000)],
        ),
        {"job_id": ctx.job_id},
    )  # fmt: skip
    expires = int(reply[0])
    if not expires:
        return None
    _walk(ctx, "expire_keys", str(expires))
    return expires


def _retention_arg(retention: float) -> str:
    return f"{retention:.3f}".rstrip("0").rstrip(".")


def _walk(ctx: JobContext, script: str, expires: str) -> None:
    """Run ``script`` (expire_keys/persist_keys) over every key of the job, a batch a call;
    stop when the script says the job's state moved on."""
    record = ctx.keys.job
    for batch in job_keys(ctx.client, ctx.job_id):
        reply = check(ctx.scripts.call(script, [record, *batch], [expires]), {"job_id": ctx.job_id})
        if int(reply[0]) < 0:
            return


def job_keys(client: Any, job_id: str, batch: int = KEY_BATCH) -> Iterator[list[str]]:
    """Every key of ``job_id`` (and no other job's), in batches of at most ``batch``: a
    ``SCAN`` with the job's escaped pattern on the node that holds the job (Redis Cluster:
    one slot), each step one bounded command. Keys made during the walk may be missed."""
    pattern = Keys(job_id).pattern
    if is_cluster(client):
        node = client.get_node_from_key(Keys(job_id).job)
        keys = client.scan_iter(match=pattern, count=KEY_BATCH, target_nodes=node)
    else:
        keys = client.scan_iter(match=pattern, count=KEY_BATCH)
    chunk: list[str] = []
    for key in keys:
        chunk.append(_text(key))
        if len(chunk) >= batch:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def delete_job(client: Any, job_id: str) -> int:
    """Delete every key of ``job_id`` (``UNLINK``, a batch at a time); keys of other jobs,
    including jobs whose ids start with this one's, are untouched. Storage is not touched.

    Returns:
        The number of keys deleted.
    """
    Keys(job_id)  # validates the id
    deleted = 0
    for batch in job_keys(client, job_id):
        deleted += int(client.unlink(*batch))
    return deleted


def discover_jobs(client: Any) -> list[str]:
    """Every job with a key in this Redis (every primary of a cluster), sorted: a ``SCAN``
    over ``strata:{*}:*`` in bounded steps (``registry.list_jobs``; for operators, not hot
    paths). Finds jobs that only have checkpoints, too."""
    return list_jobs(client)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

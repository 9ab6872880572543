"""The Redis key schema: every key strata_redis uses is built here and nowhere else.

All keys of one job share the Redis Cluster hash tag ``{<job_id>}``, so every script's keys
live in one slot and the library runs unchanged on Redis Cluster. Names are words, so
``redis-cli --scan --pattern 'strata:*'`` reads as the job's state. The README lists them.

A variable part that is not the job id (a barrier or dataset name) always comes last in its
key, so ``:`` or braces inside it cannot collide with another key of the schema.
"""

from __future__ import annotations

from dataclasses import dataclass

from .validate import check_id

PREFIX = "strata"


@dataclass(frozen=True)
class Keys:
    """The keys of one job."""

    job_id: str

    def __post_init__(self) -> None:
        check_id("job_id", self.job_id, job=True)

    @property
    def base(self) -> str:
        """``strata:{<job>}``: the prefix of every key of this job."""
        return f"{PREFIX}:{{{self.job_id}}}"

    # -- worker registry ---------------------------------------------------------------
    @property
    def heartbeats(self) -> str:
        """ZSET worker id -> last heartbeat, ms on Redis' clock; live workers only."""
        return f"{self.base}:heartbeats"

    @property
    def status(self) -> str:
        """HASH worker id -> idle | training | checkpointing | failed | left."""
        return f"{self.base}:status"

    @property
    def incarnation(self) -> str:
        """HASH worker id -> membership generation of its latest registration."""
        return f"{self.base}:incarnation"

    @property
    def info(self) -> str:
        """HASH worker id -> JSON {host, address, gpu_count, labels, registered_ms}."""
        return f"{self.base}:info"

    @property
    def generation(self) -> str:
        """STRING membership generation: +1 on every join, leave and failure."""
        return f"{self.base}:generation"

    @property
    def events(self) -> str:
        """STREAM membership events (join/leave/fail), capped; waiters block on it."""
        return f"{self.base}:events"


def job_keys_pattern(job_id: str | None = None) -> str:
    """A ``SCAN`` pattern for the keys of one job, or of every job when ``job_id`` is None."""
    if job_id is None:
        return f"{PREFIX}:*"
    return f"{Keys(job_id).base}:*"

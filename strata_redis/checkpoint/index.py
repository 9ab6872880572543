"""The checkpoint index in Redis: the committed steps of a job and their metadata, for listing.

This class is the only writer of the index from Python (the commit script adds a step to it
atomically with the commit, through the keys ``keys`` gives it). Storage holds the truth:
the index is rebuilt from the metadata.json files when Redis lost it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from ..connection import Replies, take_reply
from ..context import JobContext
from ..keys import Keys
from ..validate import check_int
from .manifest import CheckpointInfo, decode_metadata

__all__ = ["CheckpointIndex"]

log = logging.getLogger("strata_redis.checkpoint")


class CheckpointIndex:
    """One job's checkpoint index: a sorted set of committed steps and a hash of their metadata."""

    def __init__(self, ctx: JobContext) -> None:
        self.context = ctx
        k = ctx.keys
        self._steps, self._info, self._built = (
            k.checkpoints,
            k.checkpoint_info,
            k.checkpoint_indexed,
        )

    @property
    def keys(self) -> list[str]:
        """The index's keys as the commit scripts take them: (steps ZSET, metadata HASH)."""
        return [self._steps, self._info]

    def is_built(self) -> bool:
        """Whether Redis holds the index (False on a new or flushed Redis)."""
        return bool(self.context.client.exists(self._built))

    def steps(self) -> list[int]:
        """The committed steps, newest first."""
        return [int(s) for s in self.context.client.zrange(self._steps, 0, -1, desc=True)]

    def newest(self) -> int | None:
        """The newest committed step, or None."""
        top = self.context.client.zrange(self._steps, 0, 0, desc=True)
        return int(top[0]) if top else None

    def metadata(self, step: int) -> bytes | None:
        """The encoded metadata of committed ``step``, or None if it is not indexed."""
        raw: bytes | None = self.context.client.hget(self._info, str(step))
        return raw

    def infos(self, count: int | None = 100) -> list[CheckpointInfo]:
        """The newest ``count`` (None: all) committed steps, newest first (Redis only).

        ``location`` is left empty: what a dashboard shows, without touching storage.
        """
        if count is not None:
            count = check_int("count", count, low=1, high=1_000_000)
        client, job_id = self.context.client, self.context.job_id
        steps = client.zrange(self._steps, 0, -1 if count is None else count - 1, desc=True)
        if not steps:
            return []
        out = []
        for step, raw in zip(steps, client.hmget(self._info, steps), strict=True):
            try:
                out.append(decode_metadata(raw or b"", job_id, int(step)))
            except ValueError as exc:
                log.warning("step %s: bad index entry (%s); rebuild_index() fixes it", step, exc)
        return out

    def replace(self, found: dict[int, bytes], stale: list[int]) -> None:
        """Add ``found`` (step -> encoded metadata), drop ``stale``, mark the index built."""
        with self.context.client.pipeline(transaction=True) as pipe:
            if found:
                pipe.zadd(self._steps, {str(s): s for s in found})
                pipe.hset(self._info, mapping={str(s): raw for s, raw in found.items()})
            if stale:
                pipe.zrem(self._steps, *map(str, stale))
                pipe.hdel(self._info, *map(str, stale))
            pipe.set(self._built, int(time.time() * 1000))
            pipe.execute()

    def drop(self, step: int) -> None:
        """Remove ``step`` from the index (retention, before its files are deleted)."""
        with self.context.client.pipeline(transaction=True) as pipe:
            pipe.zrem(self._steps, str(step))
            pipe.hdel(self._info, str(step))
            pipe.execute()


# -- batched reads of the index (connection.py: the queue/take convention) -------------------
def queue_newest_steps(pipe: Any, job_id: str, count: int) -> None:
    """Queue a read of the newest ``count`` committed steps of the index."""
    pipe.zrange(Keys(job_id).checkpoints, 0, count - 1, desc=True)


def take_newest_steps(replies: Replies) -> list[int]:
    """The committed steps ``queue_newest_steps`` read, newest first."""
    return [int(s) for s in take_reply(replies)]


def queue_infos(pipe: Any, job_id: str, steps: Sequence[int]) -> None:
    """Queue a read of the indexed metadata of committed ``steps`` (nothing if none)."""
    if steps:
        pipe.hmget(Keys(job_id).checkpoint_info, [str(s) for s in steps])


def take_infos(
    replies: Replies, job_id: str, steps: Sequence[int]
) -> dict[int, CheckpointInfo | None]:
    """Step -> its ``CheckpointInfo`` (``location`` empty), as ``queue_infos`` read them;
    None for a step no longer indexed or whose entry is bad (logged)."""
    if not steps:
        return {}
    out: dict[int, CheckpointInfo | None] = {}
    for step, raw in zip(steps, take_reply(replies), strict=True):
        out[step] = None
        if raw is not None:
            try:
                out[step] = decode_metadata(raw, job_id, step)
            except ValueError as exc:
                log.warning("step %s: bad index entry (%s); rebuild_index() fixes it", step, exc)
    return out

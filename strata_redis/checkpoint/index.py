"""The checkpoint index in Redis: a job's committed checkpoints and their metadata, for listing.

This class is the only writer of the index from Python (the commit script adds a checkpoint
to it atomically with the commit, through the keys ``keys`` gives it). The sorted set holds
each committed checkpoint's ``CheckpointId.member`` with score 0, so Redis orders it by
member bytes, which is (run, epoch, step) order (``ids.py``); the hash maps the same member
to the checkpoint's metadata.json bytes. Storage holds the truth: the index is rebuilt from
the metadata.json files when Redis lost it. A third hash keeps where each committed
checkpoint lives in storage (its ``location``: what a dashboard shows without touching
storage).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..connection import Replies, take_reply
from ..context import JobContext
from ..keys import Keys
from ..validate import check_int
from .ids import CheckpointId
from .manifest import CheckpointInfo, decode_metadata

__all__ = ["CheckpointIndex"]

log = logging.getLogger("strata_redis.checkpoint")


class CheckpointIndex:
    """One job's checkpoint index: a sorted set of committed checkpoints and their metadata."""

    def __init__(self, ctx: JobContext) -> None:
        self.context = ctx
        k = ctx.keys
        self._ids, self._info, self._built, self._where = (
            k.checkpoints,
            k.checkpoint_info,
            k.checkpoint_indexed,
            k.checkpoint_locations,
        )

    @property
    def keys(self) -> list[str]:
        """The index's keys as the commit scripts take them: (ids ZSET, metadata HASH,
        locations HASH)."""
        return [self._ids, self._info, self._where]

    def is_built(self) -> bool:
        """Whether Redis holds the index (False on a new or flushed Redis)."""
        return bool(self.context.client.exists(self._built))

    def ids(self) -> list[CheckpointId]:
        """The committed checkpoints, newest first (members that do not parse are skipped)."""
        return _parse(self.context.client.zrange(self._ids, 0, -1, desc=True))

    def newest(self) -> CheckpointId | None:
        """The newest committed checkpoint, or None."""
        top = _parse(self.context.client.zrange(self._ids, 0, 0, desc=True))
        return top[0] if top else None

    def metadata(self, cid: CheckpointId) -> bytes | None:
        """The encoded metadata of committed ``cid``, or None if it is not indexed."""
        raw: bytes | None = self.context.client.hget(self._info, cid.member)
        return raw

    def infos(self, count: int | None = 100) -> list[CheckpointInfo]:
        """The newest ``count`` (None: all) committed checkpoints, newest first (Redis only).

        ``location`` is left empty: the caller knows its storage and locates them
        (``CheckpointReader.list``); the dashboard reads the recorded ones (``take_infos``).
        """
        if count is not None:
            count = check_int("count", count, low=1, high=1_000_000)
        client, job_id = self.context.client, self.context.job_id
        members = client.zrange(self._ids, 0, -1 if count is None else count - 1, desc=True)
        if not members:
            return []
        out = []
        for member, raw in zip(members, client.hmget(self._info, members), strict=True):
            try:
                out.append(decode_metadata(raw or b"", job_id, CheckpointId.from_member(member)))
            except ValueError as exc:
                log.warning("checkpoint %s: bad index entry (%s); rebuild_index() fixes it",
                            member, exc)  # fmt: skip
        return out

    def replace(
        self,
        found: dict[CheckpointId, bytes],
        stale: list[CheckpointId],
        locations: dict[CheckpointId, str] | None = None,
    ) -> None:
        """Add ``found`` (id -> encoded metadata) with their ``locations`` (id -> where it
        lives), drop ``stale``, mark the index built."""
        with self.context.client.pipeline(transaction=True) as pipe:
            if found:
                pipe.zadd(self._ids, {c.member: 0 for c in found})
                pipe.hset(self._info, mapping={c.member: raw for c, raw in found.items()})
            if locations:
                pipe.hset(self._where, mapping={c.member: w for c, w in locations.items()})
            if stale:
                pipe.zrem(self._ids, *(c.member for c in stale))
                pipe.hdel(self._info, *(c.member for c in stale))
                pipe.hdel(self._where, *(c.member for c in stale))
            pipe.set(self._built, int(time.time() * 1000))
            pipe.execute()

    def drop(self, cid: CheckpointId) -> None:
        """Remove ``cid`` from the index (retention, before its files are deleted)."""
        with self.context.client.pipeline(transaction=True) as pipe:
            pipe.zrem(self._ids, cid.member)
            pipe.hdel(self._info, cid.member)
            pipe.hdel(self._where, cid.member)
            pipe.execute()


# -- batched reads of the index (connection.py: the queue/take convention) -------------------
def queue_newest_steps(pipe: Any, job_id: str, count: int) -> None:
    """Queue a read of the newest ``count`` committed checkpoints of the index."""
    pipe.zrange(Keys(job_id).checkpoints, 0, count - 1, desc=True)


def take_newest_steps(replies: Replies) -> list[CheckpointId]:
    """The committed checkpoints ``queue_newest_steps`` read, newest first in (run, epoch,
    step) order."""
    return _parse(take_reply(replies))


def queue_infos(pipe: Any, job_id: str, ids: Sequence[CheckpointId]) -> None:
    """Queue a read of the indexed metadata and locations of committed checkpoints ``ids``
    (nothing if none)."""
    if ids:
        k = Keys(job_id)
        pipe.hmget(k.checkpoint_info, [c.member for c in ids])
        pipe.hmget(k.checkpoint_locations, [c.member for c in ids])


def take_infos(
    replies: Replies, job_id: str, ids: Sequence[CheckpointId]
) -> dict[CheckpointId, CheckpointInfo | None]:
    """Id -> its ``CheckpointInfo`` (``location`` as recorded with the commit, else empty),
    as ``queue_infos`` read them; None for a checkpoint no longer indexed or whose entry is
    bad (logged)."""
    if not ids:
        return {}
    out: dict[CheckpointId, CheckpointInfo | None] = {}
    raws, wheres = take_reply(replies), take_reply(replies)
    for cid, raw, where in zip(ids, raws, wheres, strict=True):
        out[cid] = None
        if raw is not None:
            try:
                info = decode_metadata(raw, job_id, cid)
                out[cid] = replace(info, location=where or "")
            except ValueError as exc:
                log.warning("checkpoint %s: bad index entry (%s); rebuild_index() fixes it",
                            cid.label, exc)  # fmt: skip
    return out


def _parse(members: list[str]) -> list[CheckpointId]:
    out = []
    for member in members:
        try:
            out.append(CheckpointId.from_member(member))
        except ValueError:
            log.warning("checkpoint index: %r is not a checkpoint member; skipped", member)
    return out

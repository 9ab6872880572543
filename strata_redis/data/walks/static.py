"""The ``static`` walk: this worker's shards of the round's assignment, no leases.

The plan of the epoch's start is kept: a failed worker's shards are not redone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..sharding import I64Array, assignment

if TYPE_CHECKING:
    from ..position import Position
    from ..stream import ShardStream, StreamHost

__all__ = ["static_walk"]


def _nothing() -> None:
    """A shard end with nothing to record in Redis."""


def static_walk(stream: ShardStream, host: StreamHost, position: Position) -> Iterator[I64Array]:
    """This worker's shards of the round's assignment not yet done, in batches."""
    plan = assignment(stream.params, list(host.round.members))
    done = set(position.base)
    for shard in plan.shards(host.worker_id, position.epoch):
        if shard.shard_id in done:
            continue
        indices = shard.indices()
        stream.trained_before(shard.shard_id)
        for offset in range(stream.starts.get(shard.shard_id, 0), len(indices), stream.batch_size):
            if host.interrupted():
                host.guard()
            batch = indices[offset : offset + stream.batch_size]
            stream.handed([(shard.shard_id, offset + len(batch))])
            yield batch
        stream.shard_end(shard.shard_id, _nothing)

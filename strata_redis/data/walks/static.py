"""The ``static`` walk: this worker's shards of the round's assignment, no leases.

The plan of the epoch's start is kept: a failed worker's shards are not redone.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..sharding import assignment
from .base import Batch, Ledger, WalkHost, WalkSpec

__all__ = ["static_walk"]


def _nothing() -> None:
    """A shard end with nothing to record in Redis."""


def static_walk(spec: WalkSpec, ledger: Ledger, host: WalkHost) -> Iterator[Batch]:
    """This worker's shards of the round's assignment not yet done, in batches."""
    plan = assignment(spec.params, list(host.round.members))
    for shard in plan.shards(host.worker_id, spec.epoch):
        if shard.shard_id in spec.base:
            continue
        indices = shard.indices()
        ledger.trained_before(shard.shard_id)
        for offset in range(spec.starts.get(shard.shard_id, 0), len(indices), spec.batch_size):
            if host.interrupted():
                host.guard()
            batch = indices[offset : offset + spec.batch_size]
            ledger.handed([(shard.shard_id, offset + len(batch))])
            yield batch
        ledger.shard_end(shard.shard_id, _nothing)

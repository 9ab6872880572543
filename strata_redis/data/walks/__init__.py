"""The walks of an epoch, one module each, behind one table: which shards a worker trains,
in which batches.

A walk is a generator ``walk(stream, host, position)``: it yields batches (numpy arrays of
sample indices) and tells the stream what each batch holds (``stream.handed``) and when a
shard's batches are all out (``stream.shard_end``); the stream keeps the data position.

- ``leases``: fenced shard leases, own shards first, then others' unstarted ones; every
  shard once per epoch whoever fails (``leases.py``);
- ``lockstep``: leases, but every member of the round gets the same number of full batches
  (DDP), a quota agreed once per (round, epoch) (``lockstep.py``);
- ``static``: this worker's shards of the round's assignment, no leases (``static.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

from ..sharding import I64Array
from .leases import leases_walk
from .lockstep import lockstep_walk
from .static import static_walk

if TYPE_CHECKING:
    from ...data.position import Position
    from ..stream import ShardStream, StreamHost

__all__ = ["WALKS", "Batch", "Walk"]

#: one batch: sample indices in the epoch's order
Batch = I64Array
#: a walk: ``walk(stream, host, position)`` yields the stream's batches of one epoch
Walk = Callable[["ShardStream", "StreamHost", "Position"], Iterator[Batch]]

WALKS: Final[dict[str, Walk]] = {
    "leases": leases_walk,
    "lockstep": lockstep_walk,
    "static": static_walk,
}

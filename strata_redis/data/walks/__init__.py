"""The walks of an epoch, one module each, behind one table: which shards a worker trains,
in which batches.

A walk is called as ``walk(spec, ledger, host)`` (``base.py``): it reads the epoch it walks
(``WalkSpec``), yields batches (numpy arrays of sample indices) and reports what each holds
to the ledger (``Ledger.handed``), and when a shard's batches are all out
(``Ledger.shard_end``); the stream that runs it keeps the data position and is never seen
by the walk. ``WALKS`` makes a stream's walk once, so a walk's state between iterations
(lockstep's quota) is its own.

- ``leases``: fenced shard leases, own shards first, then others' unstarted ones; every
  shard once per epoch whoever fails (``leases.py``);
- ``lockstep``: leases, but every member of the round gets the same number of full batches
  (DDP), a quota agreed once per (round, epoch) (``lockstep.py``);
- ``static``: this worker's shards of the round's assignment, no leases (``static.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from .base import Batch, Ledger, Walk, WalkHost, WalkSpec
from .leases import leases_walk
from .lockstep import LockstepWalk
from .static import static_walk

__all__ = ["WALKS", "Batch", "Ledger", "LockstepWalk", "Walk", "WalkHost", "WalkSpec"]


def _stateless(walk: Walk) -> Callable[[], Walk]:
    """A walk that keeps nothing between iterations: the same function for every stream."""
    return lambda: walk


#: walk name -> a new walk for a stream (made once per stream)
WALKS: Final[dict[str, Callable[[], Walk]]] = {
    "leases": _stateless(leases_walk),
    "lockstep": LockstepWalk,
    "static": _stateless(static_walk),
}

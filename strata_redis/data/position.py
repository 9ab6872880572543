"""The data position: where one rank stands in a dataset's epoch, saved inside every
checkpoint, and putting an epoch's lease pool back to the position a checkpoint recorded.

A rank's position is the shards its model has consumed in the epoch: the shards done when
it (re)joined the epoch in its round (``base``: in data-parallel training every rank's model
holds them), the shards it completed since (``own``), and, for the shard in progress, how
many samples it yielded (``partial``), and, for the shards the epoch's last restore put
back part-way, their restored offsets until they are finished (carried by every member of
every round of that epoch, read from the epoch's record: ``data/stream.py``; a round smaller
than the checkpoint's keeps the half-read shards of the ranks that left). The union over a
checkpoint's ranks is what the saved model trained on; restoring marks exactly that done, so
every sample of the epoch is trained once relative to the restored model, with any number of
workers after the restore and any number after the next.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from ..context import JobContext
from .record import epoch_keys
from .sharding import DatasetParams

__all__ = ["POSITION_PART", "Position", "merge_positions", "restore_position"]

#: the checkpoint part each rank's positions are saved in (JSON)
POSITION_PART = "strata-position.json"


@dataclass
class Position:
    """One rank's place in one dataset's epoch.

    Attributes:
        dataset: the dataset's name.
        epoch: the job's epoch.
        num_shards: the dataset's shard count.
        base: shards done when this rank (re)joined the epoch in its current round.
        own: shards this rank completed since it started the epoch.
        partial: shard in progress -> samples of it yielded so far (in this epoch's order).
    """

    dataset: str
    epoch: int
    num_shards: int
    base: set[int] = field(default_factory=set)
    own: set[int] = field(default_factory=set)
    partial: dict[int, int] = field(default_factory=dict)

    def done(self) -> set[int]:
        """The shards the model has consumed in full."""
        return self.base | self.own

    def to_json(self) -> dict[str, Any]:
        """A JSON-able record: done shards as a bitmap (``num_shards / 8`` bytes)."""
        bits = np.zeros(self.num_shards, dtype=bool)
        done = self.done()
        if done:
            bits[np.fromiter(done, dtype=np.int64, count=len(done))] = True
        return {
            "dataset": self.dataset,
            "epoch": self.epoch,
            "num_shards": self.num_shards,
            "done": base64.b64encode(np.packbits(bits).tobytes()).decode(),
            "partial": {str(k): v for k, v in self.partial.items()},
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Position:
        """The position a ``to_json`` record holds (its done shards as ``own``)."""
        n = int(raw["num_shards"])
        bits = np.unpackbits(np.frombuffer(base64.b64decode(raw["done"]), dtype=np.uint8))[:n]
        return cls(
            dataset=str(raw["dataset"]),
            epoch=int(raw["epoch"]),
            num_shards=n,
            own=set(np.flatnonzero(bits).tolist()),
            partial={int(k): int(v) for k, v in raw["partial"].items()},
        )


def encode_positions(positions: Iterable[Position], meta: dict[str, Any]) -> bytes:
    """One rank's checkpoint part: its positions in every dataset it iterates, and ``meta``."""
    return orjson.dumps({**meta, "positions": [p.to_json() for p in positions]})


def decode_positions(raw: bytes) -> tuple[list[Position], dict[str, Any]]:
    """The positions and the other fields of a part written by ``encode_positions``."""
    record = orjson.loads(raw)
    positions = [Position.from_json(p) for p in record.pop("positions")]
    return positions, record


def merge_positions(positions: Iterable[Position]) -> tuple[set[int], dict[int, int]]:
    """What a checkpoint's ranks together consumed of one dataset's epoch.

    Returns:
        The shards done (the union over the ranks) and, for shards consumed in part, the
        samples consumed (a shard done by any rank has no offset).
    """
    done: set[int] = set()
    offsets: dict[int, int] = {}
    for position in positions:
        done |= position.done()
        for shard, offset in position.partial.items():
            offsets[shard] = max(offset, offsets.get(shard, 0))
    return done, {s: o for s, o in offsets.items() if s not in done and o > 0}


#: the most entries (a done shard or an offset) one restore call carries (two SETBITs per
#: done shard, an HSET per offset: about a millisecond)
RESTORE_CHUNK = 512


def restore_position(
    ctx: JobContext,
    params: DatasetParams,
    epoch: int,
    done: set[int],
    offsets: dict[int, int],
    *,
    workers: list[str],
    mark: int,
    later_epochs: int,
) -> bool:
    """Put ``params``' lease pool for ``epoch`` back to a checkpoint's position, once per mark.

    The pools of the ``later_epochs`` epochs after it are deleted. The job's epoch is not
    this module's: the caller puts it back first (``coordination.epochs.restore_epoch``, with
    the same mark; ``resume.py`` composes the two). In chunks of ``RESTORE_CHUNK`` entries:
    every caller with the same inputs cuts the same chunks and the script applies only the
    next one, so members of the restoring round can call it together, and one that dies
    half-way leaves the rest to the others.

    Args:
        ctx: the job.
        params: the dataset.
        epoch: the checkpoint's epoch.
        done: shards the checkpoint's model consumed in full.
        offsets: shard -> samples consumed, for shards consumed in part.
        workers: the members of the restoring round (unused: the pool has no order now).
        mark: the restoring round: the first calls with a mark restore, the rest do nothing.
        later_epochs: how many epochs after ``epoch`` may have pools to delete.

    Returns:
        Whether this call applied part of the restore (False: others did it all).
    """
    keys, chunk = restore_chunks(ctx, params, epoch, done, offsets, workers, mark, later_epochs)
    applied, k = False, 0
    while True:
        complete, k, mine = ctx.scripts.run(
            "restore_position", keys, chunk(k), {"job_id": ctx.job_id, "dataset": params.name}
        )
        applied = applied or bool(mine)
        if int(complete):
            return applied
        k = int(k)


def restore_chunks(
    ctx: JobContext,
    params: DatasetParams,
    epoch: int,
    done: set[int],
    offsets: dict[int, int],
    workers: list[str],
    mark: int,
    later_epochs: int,
) -> tuple[list[str], Callable[[int], list[Any]]]:
    """The keys of a restore and a function giving chunk k's arguments (``restore_position``).

    The entries — done shards, then offsets, each sorted — are cut into chunks of
    ``RESTORE_CHUNK``: the same for every caller with the same inputs. (``workers``: the
    restoring round's members; the pool has no order of its own now, so it is unused.)
    """
    del workers
    done_ids = np.fromiter(sorted(done), dtype=np.int64, count=len(done))
    partial = np.array(sorted(offsets.items()), dtype=np.int64).reshape(-1, 2)
    k = ctx.keys
    own = epoch_keys(ctx, params, epoch)
    keys = [k.restores, *own]
    for e in range(epoch + 1, epoch + later_epochs + 1):
        keys += epoch_keys(ctx, params, e)
    sections = (done_ids, partial)
    bounds = np.cumsum([0, *map(len, sections)])
    size = RESTORE_CHUNK
    count = max(1, -(-int(bounds[-1]) // size))

    def chunk(c: int) -> list[Any]:
        low, high = c * size, (c + 1) * size
        parts = [
            section[max(0, low - start) : max(0, high - start)]
            for section, start in zip(sections, bounds[:-1].tolist(), strict=True)
        ]
        args: list[Any] = [f"restored:{params.name}", mark, params.num_shards, c, count]
        args += [len(parts[0]), *parts[0].tolist()]
        args += [len(parts[1]), *parts[1].ravel().tolist()]
        return args

    return keys, chunk

"""The epoch record: what a (dataset, epoch)'s leases left in Redis, read.

The lease protocol (``leases.py``, with its scripts) writes a (dataset, epoch)'s record: the
done and taken bitmaps, the lease hash, the offsets of shards handed back part-way (and,
apart, the offsets a checkpoint restore put back: ``restore_position``), the
per-shard completion record (fencing token and completer, in segments), the epoch's meta
(counts, and its summary once closed), and the dataset's lifetime totals. This module reads
it: where a walk begins (``epoch_record``), how far an epoch is (``EpochProgress``), who
holds and who completed what, and, in the queue/take pairs (``connection.py``), what the
dashboard batches into one round trip. It also holds the record's layout (its keys, its
segments) and how many finished epochs keep their per-shard record (``keep_whole``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..connection import Replies, hash_items, run_read, take_reply
from ..context import JobContext
from ..keys import Keys
from ..validate import check_id, check_int
from .sharding import DatasetParams

__all__ = [
    "RECORD_BYTES", "RECORD_SEGMENT", "EpochProgress", "LeaseHolder", "LeaseTotals",
    "completed_by", "completions", "done_count", "done_shards", "epoch_keys", "epoch_record",
    "holders", "keep_whole", "kept_whole", "lease_totals", "progress", "queue_completed_by",
    "queue_holders", "queue_lease_grants", "queue_lease_totals", "queue_progress",
    "restored_offsets", "segments",
    "take_completed_by", "take_holders", "take_lease_grants", "take_lease_totals",
    "take_progress",
]  # fmt: skip

#: shards per record segment (``LeaseKeys.record``; acquire_shard.lua's ``SEG``): a segment
#: is created whole by its first completion, 65,535 x 12 bytes + the string's header: just
#: the allocator's 768 KiB size class (65,536 would take the next, 896 KiB)
RECORD_SEGMENT = 65535
#: bytes of one shard's completion record: fencing token (i64), completer's index (u32)
RECORD_BYTES = 12
#: bytes per GETRANGE step when a bitmap or record segment is read
READ_STEP = 1 << 18

_RECORD = np.dtype([("token", ">i8"), ("worker", ">u4")])


def segments(num_shards: int) -> int:
    """How many record segments an epoch of ``num_shards`` shards has."""
    return max(1, -(-num_shards // RECORD_SEGMENT))


def epoch_keys(ctx: JobContext, params: DatasetParams, epoch: int) -> list[str]:
    """Every key of a (dataset, epoch)'s leases: meta, taken, holders, expiry, done,
    offsets, restored, workers, then the record segments (the lockstep quota hash is
    ``walks/lockstep.py``'s)."""
    k = ctx.keys.lease_keys(params.name, epoch)
    keys = [k.meta, k.taken, k.holders, k.expiry, k.done, k.offsets, k.restored, k.workers]
    return keys + [k.record(i) for i in range(segments(params.num_shards))]


def _read_string(client: Any, key: str, size: int) -> bytes:
    """The first ``size`` bytes of a STRING (zeros past its end), in ``GETRANGE`` steps."""
    parts = []
    for start in range(0, size, READ_STEP):
        end = min(size, start + READ_STEP) - 1  # (bytes: the client decodes the rest)
        parts.append(client.execute_command("GETRANGE", key, start, end, NEVER_DECODE=True))
    raw = b"".join(parts)
    return raw + bytes(size - len(raw))


def _bits(client: Any, key: str, num_shards: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The ids of the bits set in a bitmap of ``num_shards`` bits."""
    raw = _read_string(client, key, -(-num_shards // 8))
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8))[:num_shards]
    return np.flatnonzero(bits)


def epoch_record(
    ctx: JobContext, params: DatasetParams, epoch: int
) -> tuple[set[int], dict[int, int]]:
    """A (dataset, epoch)'s record as a walk begins: the shards done (its done bitmap, read
    in ``GETRANGE`` steps), and shard -> samples already trained of the shards restored
    part-way. A closed epoch has every shard done."""
    k = ctx.keys.lease_keys(params.name, epoch)
    done = done_shards(ctx, params, epoch)
    if len(done) == params.num_shards:
        return done, {}
    return done, {int(s): int(o) for s, o in hash_items(ctx.client, k.offsets).items()}


def restored_offsets(ctx: JobContext, params: DatasetParams, epoch: int) -> dict[int, int]:
    """Shard -> samples already trained, of the shards the epoch's last checkpoint restore
    put back part-way (``LeaseKeys.restored``: the restore's own offsets, which no hand-back
    changes): what every member's data position carries until those shards are done."""
    restored = ctx.keys.lease_keys(params.name, epoch).restored
    return {int(s): int(o) for s, o in hash_items(ctx.client, restored).items()}


def done_shards(ctx: JobContext, params: DatasetParams, epoch: int) -> set[int]:
    """The shards completed in a (dataset, epoch) (its done bitmap, ``num_shards / 8`` bytes
    read in ``GETRANGE`` steps). Every shard of a closed epoch (``init_epoch.lua``: nothing
    of it is trained any more)."""
    k = ctx.keys.lease_keys(params.name, epoch)
    if ctx.client.hget(k.meta, "closed_ms") is not None:
        return set(range(params.num_shards))
    return set(_bits(ctx.client, k.done, params.num_shards).tolist())


def done_count(ctx: JobContext, params: DatasetParams, epoch: int) -> int:
    """How many shards of a (dataset, epoch) are completed (one ``HGET`` of its meta, open or
    closed)."""
    return int(ctx.client.hget(ctx.keys.lease_keys(params.name, epoch).meta, "done") or 0)


def keep_whole(ctx: JobContext, dataset: str, epochs: int) -> None:
    """Keep the per-shard record (``ShardLeases.completions``) of the ``epochs`` finished
    epochs before the newest whole, for a dataset of the job (default 0: an epoch is closed
    into its summary when the next epoch's pool is built). For tools that check records after
    the fact (the demo); each kept epoch costs its per-shard record until it closes."""
    check_id("dataset", dataset)
    check_int("epochs", epochs, low=0, high=2**31)
    ctx.client.set(ctx.keys.epochs_kept_whole(dataset), epochs)


def kept_whole(ctx: JobContext, dataset: str) -> int:
    """How many finished epochs before the newest keep their per-shard record (``keep_whole``;
    0 unless set)."""
    return int(ctx.client.get(ctx.keys.epochs_kept_whole(dataset)) or 0)


@dataclass(frozen=True)
class EpochProgress:
    """Where a (dataset, epoch) stands: shards done, leased now, and not yet leased.

    ``steals`` counts the grants taken from the shared pool once a worker's own shards that
    it asked for were gone (another worker's unstarted shard, as a rule), in this epoch
    (``LeaseTotals.steals``: over the job's life). ``initialized``:
    whether the epoch's pool was created (before, ``todo`` is 0: no shard is in it yet).
    """

    total: int
    done: int
    leased: int
    todo: int
    steals: int = 0
    initialized: bool = True

    @property
    def finished(self) -> bool:
        return self.done == self.total


# -- reads of one (dataset, epoch) ---------------------------------------------------------------
def progress(ctx: JobContext, params: DatasetParams, epoch: int) -> EpochProgress:
    """Shards done, leased and waiting in a (dataset, epoch) (one transaction)."""
    with ctx.client.pipeline(transaction=True) as pipe:
        queue_progress(pipe, ctx.job_id, params.name, epoch)
        replies = iter(pipe.execute())
    return take_progress(replies, params.num_shards)


def holders(ctx: JobContext, params: DatasetParams, epoch: int) -> dict[int, LeaseHolder]:
    """The leases held now in a (dataset, epoch): shard id -> its holder."""
    return run_read(
        ctx.client, lambda pipe: queue_holders(pipe, ctx.job_id, params.name, epoch), take_holders
    )


def completed_by(ctx: JobContext, params: DatasetParams, epoch: int) -> Counter[str]:
    """Worker id -> shards it completed in a (dataset, epoch), open or closed."""
    return run_read(
        ctx.client,
        lambda pipe: queue_completed_by(pipe, ctx.job_id, params.name, epoch),
        take_completed_by,
    )


def completions(ctx: JobContext, params: DatasetParams, epoch: int) -> dict[int, tuple[str, int]]:
    """A (dataset, epoch)'s completion record: shard id -> (worker id, fencing token); a shard
    restored done from a checkpoint reads ("restored", 0). Empty once the epoch is closed
    (``init_epoch.lua``): its summary keeps ``completed_by`` and ``progress`` only. Reads the
    done bitmap and the record segments holding done shards (12 bytes a shard), in
    ``GETRANGE`` steps."""
    client, total = ctx.client, params.num_shards
    k = ctx.keys.lease_keys(params.name, epoch)
    done = _bits(client, k.done, total)
    if len(done) == 0:
        return {}
    indexed = client.hgetall(k.workers)
    names = {int(f[2:]): v for f, v in indexed.items() if f.startswith("i:")}
    names[0] = "restored"
    out: dict[int, tuple[str, int]] = {}
    for segment in np.unique(done // RECORD_SEGMENT).tolist():
        low = segment * RECORD_SEGMENT
        size = min(RECORD_SEGMENT, total - low)
        raw = _read_string(client, k.record(segment), size * RECORD_BYTES)
        record = np.frombuffer(raw, dtype=_RECORD)
        mine = done[(done >= low) & (done < low + size)]
        for shard, token, worker in zip(
            mine.tolist(),
            record["token"][mine - low].tolist(),
            record["worker"][mine - low].tolist(),
            strict=True,
        ):
            out[shard] = (names.get(worker, str(worker)), token)
    return out


# -- batched reads of a (dataset, epoch)'s record (connection.py: the queue/take convention) --
class LeaseHolder(NamedTuple):
    """A lease held now, as the epoch's lease hash records it (a tuple: a document of the
    dashboard makes one per live worker).

    Attributes:
        shard_id: the leased shard.
        token: the grant's fencing token.
        expires_ms: when it expires unless renewed, ms on Redis' clock.
        grant: the grant's id (``Lease.grant``).
        worker_id: the worker holding it.
    """

    shard_id: int
    token: int
    expires_ms: int
    grant: str
    worker_id: str


def _holder(shard: str, value: str) -> LeaseHolder:
    token, expires, grant, worker = value.split(" ", 3)
    return LeaseHolder(int(shard), int(token), int(expires), grant, worker)


def queue_progress(pipe: Any, job_id: str, dataset: str, epoch: int) -> None:
    """Queue the counts of a (dataset, epoch): shards done, leased, waiting; steals; whether
    its pool was created (``ShardLeases.progress`` runs it in a transaction of its own)."""
    k = Keys(job_id).lease_keys(dataset, epoch)
    pipe.hlen(k.holders)
    pipe.hmget(k.meta, ["created_ms", "steals", "closed_ms", "done"])


def take_progress(replies: Replies, num_shards: int) -> EpochProgress:
    """The progress ``queue_progress`` read, of an epoch of ``num_shards`` shards (waiting:
    the shards neither done nor leased; a closed epoch: nothing leased or waiting)."""
    leased = int(take_reply(replies))
    created, steals, closed, done_field = take_reply(replies)
    done = int(done_field or 0)
    todo = max(0, num_shards - done - leased) if created is not None else 0
    if closed is not None:
        leased, todo = 0, 0
    return EpochProgress(num_shards, done, leased, todo, int(steals or 0), created is not None)


def queue_holders(pipe: Any, job_id: str, dataset: str, epoch: int) -> None:
    """Queue a read of the leases held now in a (dataset, epoch) (one per shard at most:
    the caller bounds the epoch's size)."""
    pipe.hgetall(Keys(job_id).lease_keys(dataset, epoch).holders)


def take_holders(replies: Replies) -> dict[int, LeaseHolder]:
    """Shard id -> its holder, as ``queue_holders`` read them."""
    return {int(s): _holder(s, v) for s, v in take_reply(replies).items()}


def queue_completed_by(pipe: Any, job_id: str, dataset: str, epoch: int) -> None:
    """Queue a read of how many shards each worker completed in a (dataset, epoch) (the
    epoch meta's counts: one field per worker that completed any, open or closed)."""
    pipe.hgetall(Keys(job_id).lease_keys(dataset, epoch).meta)


def take_completed_by(replies: Replies) -> Counter[str]:
    """Worker id -> shards it completed, as ``queue_completed_by`` read them."""
    meta = take_reply(replies)
    return Counter({f[3:]: int(v) for f, v in meta.items() if f.startswith("by:")})


@dataclass(frozen=True)
class LeaseTotals:
    """A dataset's lease counts over the job's life (``Keys.lease_totals``): never reset at a
    new epoch, expired with the job.

    Attributes:
        steals: grants from the shared pool (the epochs' ``EpochProgress.steals`` summed).
        samples: samples trained: a completed lease counts its shard's samples from the
            lease's start; a hand-back with an offset, the part up to the offset.
        by_worker: worker id -> its part of ``samples`` (the workers asked for only).
    """

    steals: int = 0
    samples: int = 0
    by_worker: dict[str, int] = field(default_factory=dict)


def lease_totals(
    ctx: JobContext, dataset: str, workers: Sequence[str] | None = None
) -> LeaseTotals:
    """A dataset's ``LeaseTotals``, with ``by_worker`` for ``workers`` (None: every worker
    that trained any, one ``HGETALL`` bounded by the job's workers)."""
    return run_read(
        ctx.client,
        lambda pipe: queue_lease_totals(pipe, ctx.job_id, dataset, workers),
        lambda replies: take_lease_totals(replies, workers),
    )


def queue_lease_totals(
    pipe: Any, job_id: str, dataset: str, workers: Sequence[str] | None = None
) -> None:
    """Queue a read of a dataset's lifetime lease counts: steals, samples, and the samples of
    ``workers`` (one ``HMGET``; None: the whole hash, every worker that trained any)."""
    key = Keys(job_id).lease_totals(dataset)
    if workers is None:
        pipe.hgetall(key)
    else:
        pipe.hmget(key, ["steals", "samples", *(f"w:{w}" for w in workers)])


def take_lease_totals(replies: Replies, workers: Sequence[str] | None = None) -> LeaseTotals:
    """The ``LeaseTotals`` ``queue_lease_totals`` read (``workers`` as given to it; a worker
    that trained nothing is left out of ``by_worker``)."""
    reply = take_reply(replies)
    if workers is None:
        by = {f[2:]: int(v) for f, v in reply.items() if f.startswith("w:")}
        return LeaseTotals(int(reply.get("steals") or 0), int(reply.get("samples") or 0), by)
    steals, samples, *mine = reply
    by = {w: int(v) for w, v in zip(workers, mine, strict=True) if v is not None}
    return LeaseTotals(int(steals or 0), int(samples or 0), by)


def queue_lease_grants(pipe: Any, job_id: str) -> None:
    """Queue a read of the job's fencing-token counter: lease grants so far."""
    pipe.get(Keys(job_id).fence)


def take_lease_grants(replies: Replies) -> int:
    """The lease grants ``queue_lease_grants`` read."""
    return int(take_reply(replies) or 0)

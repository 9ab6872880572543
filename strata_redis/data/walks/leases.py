"""The ``leases`` walk: fenced shard leases, own shards first, then others' unstarted ones.

One Redis round trip per shard and none per batch: a shard's completion leases the next one.
With ``WalkSpec.ahead``, the round trips leave the loop's thread: a lease thread keeps that
many shards leased ahead and sends the completions (``ShardLeases.later``), and a checkpoint
waits for them to land first (``ShardLeases.settle``).
Every shard is trained once per epoch whoever fails: a lease taken back (its holder was
declared failed, or it expired) is trained by whoever holds it now.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from ...errors import LeaseLostError
from ..leases import Lease, ShardLeases
from .base import Batch, Ledger, WalkHost, WalkSpec

__all__ = ["completer", "leases_walk"]

log = logging.getLogger("strata_redis.data")


def completer(
    host: WalkHost, leases: ShardLeases, lease: Lease, *, prefetch: bool = True
) -> Callable[[], None]:
    """The completion of ``lease``, to run once its last batch is consumed (``prefetch``:
    it also leases the next shard in the same round trip), on the leases' own thread when
    they have one (``ShardLeases.later``)."""

    def complete() -> None:
        try:
            host.retry(leases.complete, lease, prefetch=prefetch)
        except LeaseLostError as exc:
            log.warning("worker %r: %s", host.worker_id, exc)

    return lambda: leases.later(complete)


def leases_walk(spec: WalkSpec, ledger: Ledger, host: WalkHost) -> Iterator[Batch]:
    """Lease, train, complete, until the epoch is done (or, without ``wait_for_others``,
    until nothing can be leased now)."""
    size = spec.batch_size
    leases = ShardLeases(host.context, spec.params, spec.epoch, host.worker_id,
                         ttl=host.lease_ttl, ahead=spec.ahead)  # fmt: skip
    ledger.drains(leases)
    with leases.draining():
        last_id = "$"
        while True:
            host.guard()
            lease = host.retry(leases.acquire)
            if lease is None:
                if ledger.finish_now():  # the tail: complete what was handed out, again
                    continue
                if leases.drained:
                    host.retry(leases.keep_record)
                    return
                if not spec.wait_for_others:
                    return  # the rest is held by others: they finish it before the barrier
                last_id = host.retry(leases.wait_for_work, last_id)
                continue
            shard = lease.shard_id
            indices = lease.indices()
            ledger.trained_before(shard)
            for offset in range(lease.start, len(indices), size):
                if lease.lost or host.interrupted():
                    host.guard()
                    if lease.lost is not None:
                        break  # taken back: whoever has it now trains it
                batch = indices[offset : offset + size]
                ledger.handed([(shard, offset + len(batch))])
                yield batch
            if lease.lost is not None:
                ledger.dropped(shard)
                continue
            ledger.shard_end(shard, completer(host, leases, lease))

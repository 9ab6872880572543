"""The ``lockstep`` walk: every member of the round gets the same number of full batches.

For loops whose members meet in a collective every step (DDP without ``Join``). The quota —
``remaining // (world_size * batch_size)`` batches per rank, or rounded up with padding
(``drop_last=False``) — is agreed once per (round, epoch): the first member to begin the walk
computes it from the epoch's record and writes it (``HSETNX``) into the epoch's quota hash,
which this module owns. A rank keeps of each lease what its quota still needs and hands the
rest back at once, so the pool always holds what the others need and nobody waits on a rank
that is blocked in a collective.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import numpy as np

from ...errors import EpochUnfinishedError
from ..leases import RECORD_TTL_S, Lease, ShardLeases
from .base import Batch, Ledger, WalkHost, WalkSpec
from .leases import completer

__all__ = ["LockstepWalk", "agree_quota"]

log = logging.getLogger("strata_redis.data")


def agree_quota(spec: WalkSpec, host: WalkHost) -> int:
    """Batches per rank for this (round, epoch): from the samples left when the first
    member began its walk (it reads the record before anyone of the round takes any)."""
    params = spec.params
    sizes = np.full(params.num_shards, params.samples_per_shard, dtype=np.int64)
    sizes[-1] = params.total_samples - params.samples_per_shard * (params.num_shards - 1)
    done = np.fromiter(spec.base, dtype=np.int64, count=len(spec.base))
    left = int(sizes.sum() - sizes[done].sum())
    left -= sum(o for s, o in spec.starts.items() if s not in spec.base)
    per_round = host.round.world_size * spec.batch_size
    quota = left // per_round if spec.drop_last else -(-left // per_round)
    field = f"{host.round.number}" if spec.drop_last else f"{host.round.number}:pad"
    key = host.context.keys.lease_keys(params.name, spec.epoch).lockstep
    with host.context.client.pipeline(transaction=True) as pipe:
        pipe.hsetnx(key, field, quota)
        pipe.expire(key, RECORD_TTL_S)
        pipe.hget(key, field)
        _, _, agreed = pipe.execute()
    return int(agreed)


class LockstepWalk:
    """The lockstep walk of one stream; its state lasts from one iteration to the next.

    Attributes:
        quota: the batches each member gets in the epoch last walked (None before a walk).
        quota_met: whether the last walk handed out its whole quota (what is left of the
            epoch is the others', or dropped by design).
        taken: (epoch, round) -> samples taken so far: a walk again in the same (epoch,
            round) takes only what is left of its quota.
    """

    def __init__(self) -> None:
        self.quota: int | None = None
        self.quota_met = False
        self.taken: dict[tuple[int, int], int] = {}

    def __call__(self, spec: WalkSpec, ledger: Ledger, host: WalkHost) -> Iterator[Batch]:
        """Exactly ``quota`` full batches: take of each lease what the quota still needs
        and hand the rest back (its offset moves)."""
        size, walk_round = spec.batch_size, host.round.number
        leases = ShardLeases(
            host.context, spec.params, spec.epoch, host.worker_id, ttl=host.lease_ttl
        )
        ledger.drains(leases)
        self.quota = quota = host.retry(agree_quota, spec, host)
        self.quota_met = False
        walk = (spec.epoch, walk_round)
        need = quota * size - self.taken.get(walk, 0)  # (a walk again: what is left of it)
        carry: list[Batch] = []
        pieces: list[tuple[int, int]] = []
        ends: list[tuple[int, Callable[[], None]]] = []  # shards ending in the carry
        seen: list[Batch] = []  # padding's source

        def finisher(lease: Lease) -> Callable[[], None]:
            # (completions made as batches are consumed must not lease a shard the walk has not
            # asked for: another rank may need it while this one is in a step)
            return completer(host, leases, lease, prefetch=False)

        def cut(indices: Batch, at: int, stop: int, lease: Lease | None) -> Iterator[Batch]:
            """Full batches of ``indices[at:stop]`` after what the carry holds (``lease``: the
            shard they come from; None for padding, which moves no position)."""
            nonlocal carry, pieces, ends
            while at < stop:
                n = min(size - sum(map(len, carry)), stop - at)
                carry.append(indices[at : at + n])
                at += n
                if lease is not None:
                    pieces.append((lease.shard_id, at))
                    if at == len(indices):
                        ends.append((lease.shard_id, finisher(lease)))
                if sum(map(len, carry)) < size:
                    continue
                if host.interrupted():
                    host.guard()
                batch = carry[0] if len(carry) == 1 else np.concatenate(carry)
                ledger.handed(pieces)
                for ended, finish in ends:
                    ledger.shard_end(ended, finish)
                carry, pieces, ends = [], [], []
                yield batch

        with leases.draining():
            last_id, empty = "$", 0
            while need > 0:
                host.guard()
                if host.round.number != walk_round:
                    log.warning("worker %r: the round changed mid-epoch: the lockstep walk of "
                                "round %d ends", host.worker_id, walk_round)  # fmt: skip
                    return
                lease = host.retry(leases.acquire)
                if lease is None:
                    if ledger.finish_now():
                        continue
                    if not spec.drop_last and (leases.drained or empty):
                        # the pool stayed empty (a hand-back takes one script call): pad with
                        # samples this walk had (or the first shard's, if it had none)
                        source = np.concatenate(seen) if seen else spec.params.shard(
                            0, spec.epoch).indices()  # fmt: skip
                        fill, need = np.resize(source, need), 0
                        yield from cut(fill, 0, len(fill), None)
                        break
                    if leases.drained:
                        raise EpochUnfinishedError(
                            f"lockstep epoch {spec.epoch} of {spec.params.name!r}: the pool "
                            f"is done with {need} samples of this rank's quota unmet (the epoch "
                            "was changed by another walk)", job_id=host.context.job_id,
                            dataset=spec.params.name, epoch=spec.epoch, remaining=0,
                        )  # fmt: skip
                    last_id = host.retry(leases.wait_for_work, last_id)  # a hand-back in flight
                    empty += 1
                    continue
                empty = 0
                shard, indices = lease.shard_id, lease.indices()
                ledger.trained_before(shard)
                stop = min(len(indices), lease.start + need)
                if stop < len(indices):
                    host.retry(leases.release, lease, stop)  # the rest is the others'
                need -= stop - lease.start
                self.taken[walk] = self.taken.get(walk, 0) + stop - lease.start
                if sum(map(len, seen)) < size:
                    seen.append(indices[lease.start : stop])
                yield from cut(indices, lease.start, stop, lease)
            ledger.finish_now()  # leases still held: nothing more will be asked of this walk
            self.quota_met = True
            host.retry(leases.keep_record)

"""Shard leases: dynamic, exactly-once draining of a dataset epoch, fenced and resumable.

Each shard of a (dataset, epoch) is a lease target. A worker leases its own shards (from the
static assignment) first, then steals other workers' unstarted shards. Every grant carries
a fencing token from a counter that never goes back; renewals keep it, a new grant raises
it, and ``complete`` with a stale token is refused (``LeaseLostError``). A lease is held
until it is taken back: by the next ``acquire`` of any worker once it has expired, or once
its worker is no longer live. The completion record lives in Redis, so a job restarted with
any number of workers resumes the epoch with no shard recorded twice and none skipped.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import redis

from ..connection import Replies, hash_items, run_read, take_reply
from ..context import JobContext, as_context
from ..coordination.registry import live_workers, reap
from ..errors import LeaseLostError
from ..keys import Keys
from ..scripts import check
from ..status import Acquire, Status
from ..validate import check_id, check_int, check_seconds
from .sharding import DatasetParams, Shard, assignment

log = logging.getLogger("strata_redis.leases")

#: own candidates sent per acquire (bounds the script's arguments)
CANDIDATES = 8
#: shards per init_epoch call: one chunk (a ZADD of this many) holds Redis for a few ms
INIT_CHUNK = 1024
#: pools of more shards than this get chunks of a quarter the size: inserting into a sorted
#: set of millions misses the CPU caches (1,024 members took 10-20 ms into a pool of 10^7)
BIG_POOL = 1_000_000


def chunk_size(num_shards: int, base: int | None = None) -> int:
    """Entries per call when an epoch of ``num_shards`` is built or restored (``base``:
    ``INIT_CHUNK`` by default): a function of the epoch alone, so every caller cuts the same
    chunks."""
    base = INIT_CHUNK if base is None else base
    return base if num_shards <= BIG_POOL else max(1, base // 4)


#: how long a (dataset, epoch)'s record is kept in Redis
RECORD_TTL_S = 30 * 86400


def steal_priority(
    ids: np.ndarray[Any, np.dtype[np.int64]], owners: np.ndarray[Any, np.dtype[np.intp]]
) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Each shard's steal priority (indexed by shard id), from ``Assignment.grouped``.

    Steal priority = a shard's position in its owner's order: thieves take the shards their
    owners would reach last.
    """
    positions = np.arange(len(ids)) - np.searchsorted(owners, owners)
    priority = np.empty(len(ids), dtype=np.int64)
    priority[ids] = positions
    return priority


@dataclass
class Lease:
    """A leased shard. ``complete()`` it when its samples are processed.

    Attributes:
        shard: the shard (ids, range, ``indices()`` in this epoch's order).
        token: the fencing token of this grant.
        start: samples of the shard already trained (a restored position, or a part
            another worker took): train ``indices()[start:]``.
        lost: set (and the owner's ``on_lost`` called) when a renewal finds the lease gone.
    """

    shard: Shard
    token: int
    expires_ms: int
    owner: ShardLeases = field(repr=False)
    lost: LeaseLostError | None = None
    finished: bool = False
    #: samples of the shard (in this epoch's order) already trained: start there
    start: int = 0

    @property
    def shard_id(self) -> int:
        return self.shard.shard_id

    def indices(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """This shard's sample indices, in this epoch's order."""
        return self.shard.indices()

    def complete(self) -> bool:
        """Record the shard as done, exactly once.

        Returns:
            Whether this call recorded it (False for a repeat with the same token).

        Raises:
            LeaseLostError: the lease was taken back or re-granted; someone else will do it.
        """
        return self.owner.complete(self)

    def release(self, offset: int | None = None) -> None:
        """Give the shard back to the pool without completing it (``offset``: samples of it,
        from the start, that are taken care of: the next grant starts there)."""
        self.owner.release(self, offset)


def epoch_record(
    ctx: JobContext, params: DatasetParams, epoch: int
) -> tuple[set[int], dict[int, int]]:
    """A (dataset, epoch)'s record as a walk begins: the shards done, and shard -> samples
    already trained of the shards restored part-way (read in ``HSCAN`` steps: an epoch of
    10^7 shards has a record of 10^7 fields). A closed epoch has every shard done."""
    k = ctx.keys.lease_keys(params.name, epoch)
    done = done_shards(ctx, params, epoch)
    if len(done) == params.num_shards:
        return done, {}
    return done, {int(s): int(o) for s, o in hash_items(ctx.client, k.offsets).items()}


def _closed(ctx: JobContext, params: DatasetParams, epoch: int) -> int | None:
    """How many shards a closed (dataset, epoch) had done when it closed; None: not closed."""
    meta = ctx.keys.lease_keys(params.name, epoch).meta
    closed, done = ctx.client.hmget(meta, ["closed_ms", "done"])
    return None if closed is None else int(done or 0)


def done_shards(ctx: JobContext, params: DatasetParams, epoch: int) -> set[int]:
    """The shards completed in a (dataset, epoch), read in ``HSCAN`` steps. Every shard of a
    closed epoch (``init_epoch.lua``: nothing of it is trained any more)."""
    found = {int(s) for s in hash_items(ctx.client, ctx.keys.lease_keys(params.name, epoch).done)}
    if not found and _closed(ctx, params, epoch) is not None:
        return set(range(params.num_shards))
    return found


def done_count(ctx: JobContext, params: DatasetParams, epoch: int) -> int:
    """How many shards of a (dataset, epoch) are completed (one ``HLEN``; a closed epoch's
    summary holds the count it closed with)."""
    count = int(ctx.client.hlen(ctx.keys.lease_keys(params.name, epoch).done))
    if count == 0:
        count = _closed(ctx, params, epoch) or 0
    return count


def keep_whole(ctx: JobContext, dataset: str, epochs: int) -> None:
    """Keep the per-shard record (``ShardLeases.completions``) of the ``epochs`` finished
    epochs before the newest whole, for a dataset of the job (default 0: an epoch is closed
    into its summary when the next epoch's pool is built). For tools that check records after
    the fact (the demo); each kept epoch costs its per-shard record until it closes."""
    check_id("dataset", dataset)
    check_int("epochs", epochs, low=0, high=2**31)
    ctx.client.set(ctx.keys.epochs_kept_whole(dataset), epochs)


@dataclass(frozen=True)
class EpochProgress:
    """Where a (dataset, epoch) stands: shards done, leased now, and not yet leased.

    ``steals`` counts the grants taken from the shared pool once a worker's own shards that
    it asked for were gone (another worker's unstarted shard, as a rule). ``initialized``:
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


class ShardLeases:
    """One worker's leases on one (dataset, epoch). Iterate it to drain the epoch.

    Args:
        ctx: the job's context (``Job.leases`` passes its own).
        params: the dataset.
        epoch: the epoch (0..2**31).
        worker_id: a live registered worker of the job.
        ttl: lease time-to-live in seconds; the background renewer renews at ``ttl / 3``.
        steal: lease other workers' unstarted shards once this worker's own run out.
        on_lost: called (from the renewer thread) with the error when a lease is lost.
    """

    def __init__(
        self,
        ctx: JobContext,
        params: DatasetParams,
        epoch: int,
        worker_id: str,
        *,
        ttl: float = 30.0,
        steal: bool = True,
        on_lost: Callable[[LeaseLostError], None] | None = None,
    ) -> None:
        self.context = ctx
        self.params = params
        self.epoch = check_int("epoch", epoch, low=0, high=2**31)
        self.worker_id = check_id("worker_id", worker_id)
        self.ttl = check_seconds("ttl", ttl, high=86400)
        self.steal = steal
        self.on_lost = on_lost
        self.keys = k = ctx.keys.lease_keys(params.name, self.epoch)
        jk = ctx.keys
        self._acquire_keys = [k.meta, k.todo, k.holders, k.expiry, k.done, jk.fence,
                              jk.heartbeats, jk.status, jk.generation, k.offsets]  # fmt: skip
        self._acquire_args = [self.worker_id, int(self.ttl * 1000), "1" if steal else "0"]
        self._prepared = False
        self._own: list[int] = []
        self._held: dict[int, Lease] = {}
        self._next: Lease | None = None  # leased by the last complete(), for acquire()
        self._done = -1  # shards done, as the last acquire that found nothing to lease saw
        self._iterating = False
        # Serializes renewals (renewer thread) with completions and releases (the loop),
        # so a lease completed a moment ago is never reported lost by its renewal.
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _context(self, shard_id: int = -1, token: int = 0) -> dict[str, Any]:
        return {
            "job_id": self.context.job_id, "worker_id": self.worker_id, "dataset": self.params.name,
            "epoch": self.epoch, "shard_id": shard_id, "token": token,
        }  # fmt: skip

    # -- setup ---------------------------------------------------------------------------
    def prepare(self) -> None:
        """Compute this worker's own shard order and create the epoch's pool if it is missing.

        The first ``acquire`` does it; call it first to keep that work out of a timed loop.
        """
        workers = live_workers(self.context)
        if self.worker_id not in workers:
            workers = sorted([*workers, self.worker_id])  # acquire will refuse it clearly
        plan = assignment(self.params, workers)
        ids, owners = plan.grouped(self.epoch)
        self._own = ids[owners == plan.index(self.worker_id)].tolist()
        kept = int(self.context.client.get(self.context.keys.epochs_kept_whole(self.params.name))
                   or 0)  # fmt: skip
        self._init_pool(steal_priority(ids, owners), self.epoch - 1 - kept)
        self._prepared = True

    def _init_pool(self, priority: np.ndarray, close: int) -> None:
        """Create the epoch's pool in chunks of ``chunk_size`` shards (ids in order), and
        close epoch ``close`` (negative: none) if it is finished or the job is past it.

        Every caller cuts the same chunks, and the script adds only the next one, so racing
        callers and a caller that died half-way neither double nor miss a shard; a caller
        that finds chunks added by others goes on from where they are.
        """
        total = self.params.num_shards
        k = self.keys
        keys = [k.meta, k.todo, k.done, self.context.keys.epoch]
        if close >= 0:
            c = self.context.keys.lease_keys(self.params.name, close)
            keys += [c.meta, c.todo, c.holders, c.expiry, c.done, c.offsets]
        head = [total, 0, close if close >= 0 else "", RECORD_TTL_S]
        offset = 0
        while True:
            end = min(offset + chunk_size(total), total)
            pairs = np.empty(2 * (end - offset), dtype=np.int64)
            pairs[0::2] = priority[offset:end]
            pairs[1::2] = np.arange(offset, end)
            head[1] = offset
            complete, loaded = self.context.scripts.run(
                "init_epoch", keys, [*head, *pairs.tolist()], self._context()
            )
            if int(complete):
                return
            offset = int(loaded)

    # -- the four lease calls --------------------------------------------------------------
    def acquire(self) -> Lease | None:
        """Lease the next shard: own shards first, then (if ``steal``) others' unstarted ones.

        Inside iteration, the previous ``complete()`` already leased it in the same round
        trip; it is returned without another.

        Returns:
            The lease, or None when nothing can be leased now (all done, or all leased).

        Raises:
            WorkerNotRegisteredError, WorkerFailedError, WorkerLeftError: not a live worker.
        """
        with self._lock:
            lease, self._next = self._next, None
        if lease is not None and lease.lost is None and not lease.finished:
            return lease
        if not self._prepared:
            self.prepare()
        args = [*self._acquire_args, "", "", *self._own[:CANDIDATES]]
        reply = self.context.scripts.run("acquire_shard", self._acquire_keys, args, self._context)
        if int(reply[0]) == Acquire.NO_POOL:  # the pool was removed (expired record): again
            self._prepared = False
            return self.acquire()
        return self._granted(reply)

    def _granted(self, reply: list[Any]) -> Lease | None:
        """The lease in an acquire reply (shard, token, expires, offset, consumed), if any.

        In place of a shard id: ``Acquire.NOTHING`` (nothing to lease now), ``NO_POOL``
        (``acquire`` creates it) or ``REFUSED`` (not a live worker).
        """
        shard_id = int(reply[0])
        if shard_id >= Acquire.NOTHING:  # the own candidates the script looked at are spent
            del self._own[: int(reply[-1])]
        if shard_id == Acquire.NOTHING:
            self._done = int(reply[1])
        if shard_id < 0:
            return None
        lease = Lease(
            self.params.shard(shard_id, self.epoch), int(reply[1]), int(reply[2]), self,
            start=int(reply[3]),
        )  # fmt: skip
        with self._lock:
            self._held[shard_id] = lease
        return lease

    def renew(self, lease: Lease) -> None:
        """Extend ``lease`` by ``ttl`` (the background renewer does this for you).

        Raises:
            LeaseLostError: it was taken back or re-granted; ``lease.lost`` is set too.
        """
        try:
            (expires,) = self.context.scripts.run(
                "renew_shard", [self.keys.holders, self.keys.expiry],
                [lease.shard_id, lease.token, int(self.ttl * 1000)],
                lambda: self._context(lease.shard_id, lease.token),
            )  # fmt: skip
        except LeaseLostError as exc:
            self._forget(lease, lost=exc)
            raise
        lease.expires_ms = int(expires)

    def complete(self, lease: Lease, *, prefetch: bool = True) -> bool:
        """Record ``lease``'s shard as done. Returns whether this call recorded it (False for
        a repeated call with the same token, which records nothing twice).

        Inside iteration, the same round trip also leases the next shard (the loop's next
        ``acquire`` then costs nothing), even when this completion is refused; not with
        ``prefetch=False`` (a completion made away from the loop, which must not hold a
        shard the loop has not asked for).

        Raises:
            LeaseLostError: stale token; the shard is someone else's now.
        """
        if lease.lost is not None:
            raise lease.lost
        with self._lock:
            prefetch = prefetch and self._iterating and self._next is None and self._prepared
            if prefetch:
                args = [*self._acquire_args, lease.shard_id, lease.token,
                        *self._own[:CANDIDATES]]  # fmt: skip
            else:
                args = [self.worker_id, 0, "", lease.shard_id, lease.token]

            def context() -> dict[str, Any]:
                return self._context(lease.shard_id, lease.token)

            try:
                reply = self.context.scripts.run("acquire_shard", self._acquire_keys, args, context)
                if prefetch:
                    self._next = self._granted(reply[1:])
                    if int(reply[0]) < 0:  # refused, but the next lease is ours
                        check([Status.LEASE_LOST], context)  # raises LeaseLostError
            except LeaseLostError as exc:
                self._forget(lease, lost=exc)
                raise
            self._forget(lease)
        return int(reply[0]) == 1

    def release(self, lease: Lease, offset: int | None = None) -> None:
        """Give ``lease``'s shard back to the pool, not completed.

        Args:
            lease: the lease.
            offset: samples of the shard (from its start, in this epoch's order) taken care
                of: the next grant starts there. None keeps the shard's offset as it is.

        Raises:
            LeaseLostError: the caller no longer holds it.
            ValueError: ``offset`` is not within the shard.
        """
        if offset is not None:
            check_int("offset", offset, low=lease.start, high=len(lease.shard) - 1)
        k = self.keys
        with self._lock:
            try:
                self.context.scripts.run(
                    "release_shard", [k.holders, k.expiry, k.todo, k.offsets],
                    [lease.shard_id, lease.token, "" if offset is None else offset],
                    lambda: self._context(lease.shard_id, lease.token),
                )  # fmt: skip
            finally:
                self._forget(lease)

    def _forget(self, lease: Lease, lost: LeaseLostError | None = None) -> None:
        lease.finished = True
        if lost is not None and lease.lost is None:
            lease.lost = lost
        with self._lock:
            self._held.pop(lease.shard_id, None)

    # -- reading the record ----------------------------------------------------------------
    def progress(self) -> EpochProgress:
        """Shards done, leased and waiting in this (dataset, epoch)."""
        with self.context.client.pipeline(transaction=True) as pipe:
            queue_progress(pipe, self.context.job_id, self.params.name, self.epoch)
            replies = iter(pipe.execute())
        return take_progress(replies, self.params.num_shards)

    def keep_record(self) -> None:
        """Keep a finished epoch's record ``RECORD_TTL_S`` more, then let it expire."""
        # A finished epoch's record is kept RECORD_TTL_S more; an unfinished one stays
        # until it is finished (a restarted job resumes from it).
        with self.context.client.pipeline(transaction=False) as pipe:
            pipe.expire(self.keys.done, RECORD_TTL_S)
            pipe.expire(self.keys.meta, RECORD_TTL_S)
            pipe.expire(self.keys.offsets, RECORD_TTL_S)
            pipe.expire(self.keys.todo, RECORD_TTL_S)  # a lockstep epoch leaves what it dropped
            pipe.execute()

    def holders(self) -> dict[int, LeaseHolder]:
        """The leases held now in this (dataset, epoch): shard id -> its holder."""
        ctx = self.context
        return run_read(
            ctx.client,
            lambda pipe: queue_holders(pipe, ctx.job_id, self.params.name, self.epoch),
            take_holders,
        )

    def completed_by(self) -> Counter[str]:
        """Worker id -> shards it completed in this (dataset, epoch), open or closed."""
        ctx = self.context
        return run_read(
            ctx.client,
            lambda pipe: queue_completed_by(pipe, ctx.job_id, self.params.name, self.epoch),
            take_completed_by,
        )

    def completions(self) -> dict[int, tuple[str, int]]:
        """The completion record: shard id -> (worker id, fencing token). Empty once the
        epoch is closed (``init_epoch.lua``): its summary keeps ``completed_by`` and
        ``progress`` only."""
        done = hash_items(self.context.client, self.keys.done)
        return {int(shard): _completion(value) for shard, value in done.items()}

    # -- iteration ---------------------------------------------------------------------------
    @property
    def drained(self) -> bool:
        """Whether the last acquire that found nothing to lease saw every shard done."""
        return self._done == self.params.num_shards

    def __iter__(self) -> Iterator[Lease]:
        """Lease shards until the epoch is done, renewing held leases in the background.

        A lease neither completed nor released when the next one is asked for is released
        back to the pool, with a warning. Leaving the loop early releases what is held.
        """
        with self.draining():
            last_id = "$"
            previous: Lease | None = None
            while True:
                if previous is not None and not previous.finished:
                    warnings.warn(
                        f"shard {previous.shard_id} was neither completed nor released: "
                        "releasing it back to the pool", RuntimeWarning, stacklevel=2,
                    )  # fmt: skip
                    self.release(previous)
                lease = self.acquire()
                if lease is not None:
                    previous = lease
                    yield lease
                    continue
                previous = None
                if self.drained:
                    self.keep_record()
                    return
                last_id = self.wait_for_work(last_id)

    def wait_for_work(self, last_id: str = "$") -> str:
        """Wait a little when others hold the remaining leases: for a membership event (a
        failure frees leases), or a short while for expiries and completions. It reaps, as
        a waiting caller may. Returns the events stream id to pass next time."""
        wait_ms = max(
            10, min(1000, int(self.ttl * 250), int(as_context(self.context).max_block * 1000))
        )
        reap(self.context)
        reply = self.context.client.xread({self.context.keys.events: last_id}, block=wait_ms)
        return str(reply[0][1][-1][0]) if reply else last_id

    @contextmanager
    def draining(self) -> Iterator[ShardLeases]:
        """Drain by hand: inside, ``complete`` also leases the next shard (one round trip per
        shard) and held leases are renewed in the background; leaving releases what is held.

        ``__iter__`` is built on it; use it to drive ``acquire``/``complete`` yourself.
        """
        self._start_renewer()
        self._iterating = True
        try:
            yield self
        finally:
            self._stop_renewer()
            with self._lock:
                self._iterating = False
                self._next = None
                held = list(self._held.values())
            for lease in held:
                try:
                    self.release(lease)
                except (LeaseLostError, redis.RedisError) as exc:
                    log.warning("could not release shard %s: %s", lease.shard_id, exc)

    def _start_renewer(self) -> None:
        self._stop.clear()
        self._renewer = threading.Thread(
            target=self._renew_loop, name=f"strata-lease-renewer-{self.worker_id}", daemon=True
        )
        self._renewer.start()

    def _stop_renewer(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(5)
        self._renewer = None

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            with self._lock:
                held = list(self._held.values())
            for lease in held:
                try:
                    with self._lock:
                        if lease.finished:
                            continue
                        self.renew(lease)
                except LeaseLostError as exc:
                    log.warning("worker %r lost its lease on shard %s: %s",
                                self.worker_id, lease.shard_id, exc)  # fmt: skip
                    if self.on_lost is not None:
                        self.on_lost(exc)
                except redis.RedisError as exc:
                    log.warning("lease renewal of shard %s failed, retrying: %s",
                                lease.shard_id, exc)  # fmt: skip


# -- batched reads of a (dataset, epoch)'s record (connection.py: the queue/take convention) --
class LeaseHolder(NamedTuple):
    """A lease held now, as the epoch's lease hash records it (a tuple: a document of the
    dashboard makes one per live worker).

    Attributes:
        shard_id: the leased shard.
        token: the grant's fencing token.
        expires_ms: when it expires unless renewed, ms on Redis' clock.
        priority: the shard's steal priority.
        worker_id: the worker holding it.
    """

    shard_id: int
    token: int
    expires_ms: int
    priority: int
    worker_id: str


def _holder(shard: str, value: str) -> LeaseHolder:
    token, expires, priority, worker = value.split(" ", 3)
    return LeaseHolder(int(shard), int(token), int(expires), int(priority), worker)


def _completion(value: str) -> tuple[str, int]:
    """A completion record's value: (worker id, fencing token)."""
    token, worker = value.split(" ", 1)
    return worker, int(token)


def queue_progress(pipe: Any, job_id: str, dataset: str, epoch: int) -> None:
    """Queue the counts of a (dataset, epoch): shards done, leased, waiting; steals; whether
    its pool was created (``ShardLeases.progress`` runs it in a transaction of its own)."""
    k = Keys(job_id).lease_keys(dataset, epoch)
    pipe.hlen(k.done)
    pipe.hlen(k.holders)
    pipe.zcard(k.todo)
    pipe.hmget(k.meta, ["created_ms", "steals", "closed_ms", "done"])


def take_progress(replies: Replies, num_shards: int) -> EpochProgress:
    """The progress ``queue_progress`` read, of an epoch of ``num_shards`` shards (a closed
    epoch: from its summary, nothing leased or waiting)."""
    done, leased, todo = (int(take_reply(replies)) for _ in range(3))
    created, steals, closed, summary_done = take_reply(replies)
    if closed is not None:
        done, leased, todo = int(summary_done or 0), 0, 0
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


def queue_lease_grants(pipe: Any, job_id: str) -> None:
    """Queue a read of the job's fencing-token counter: lease grants so far."""
    pipe.get(Keys(job_id).fence)


def take_lease_grants(replies: Replies) -> int:
    """The lease grants ``queue_lease_grants`` read."""
    return int(take_reply(replies) or 0)

"""Shard leases: dynamic, exactly-once draining of a dataset epoch, fenced and resumable.

Each shard of a (dataset, epoch) is a lease target. A worker leases its own shards (from the
static assignment) first, then steals other workers' unstarted shards. Every grant carries
a fencing token from a counter that never goes back within an era, and a grant id the
acquiring call chose at random; renewals keep both, and ``complete``, ``renew`` and
``release`` name both: another grant (a stale token, or the same number issued again after a
rollback) is refused (``LeaseLostError``). Fencing is by holder, not by number. A lease is held
until it is taken back: by the next ``acquire`` of any worker once it has expired, or once
its worker is no longer live. The completion record lives in Redis, so a job restarted with
any number of workers resumes the epoch with no shard recorded twice and none skipped.
What the protocol leaves in Redis is read through ``record.py``.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis

from ..context import JobContext
from ..coordination.registry import live_workers, reap
from ..errors import LeaseLostError, NotReplicatedError
from ..outage import ride_out, riding_out
from ..scripts import check
from ..status import Acquire, Status, guard
from ..validate import check_id, check_int, check_seconds
from . import record
from .record import RECORD_SEGMENT, EpochProgress, LeaseHolder, epoch_keys
from .sharding import DatasetParams, Shard, assignment

__all__ = [
    "CANDIDATES", "CLOSE_STEP", "CLOSE_TTL_S", "RECORD_TTL_S", "Lease", "ShardLeases", "new_grant",
]  # fmt: skip

log = logging.getLogger("strata_redis.leases")

#: own candidates sent per acquire (bounds the script's arguments)
CANDIDATES = 8
#: record segments one call UNLINKs when an epoch is closed (init_epoch.lua's UNLINK_NOW;
#: freeing a 768 KiB string takes up to 0.1 ms)
CLOSE_STEP = 8
#: seconds to live of the segments of a closed epoch left to UNLINK (if the closer dies)
CLOSE_TTL_S = 600

#: how long a (dataset, epoch)'s record is kept in Redis
RECORD_TTL_S = 30 * 86400


@dataclass
class Lease:
    """A leased shard. ``complete()`` it when its samples are processed.

    Attributes:
        shard: the shard (ids, range, ``indices()`` in this epoch's order).
        token: the fencing token of this grant.
        grant: the grant's id (random, chosen by the call that leased it): with the token,
            what the calls that end or renew it name.
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
    grant: str = ""

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
        ahead: inside ``draining``, leases held ready beyond those handed out (0..4): a
            thread of this object's own leases them and runs ``later``'s completions, so
            the loop's ``acquire`` takes a ready lease with no round trip. 0 (default): every
            call runs on the caller's thread (a completion still leases the next shard in
            its round trip).
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
        ahead: int = 0,
    ) -> None:
        self.context = ctx
        self.params = params
        self.epoch = check_int("epoch", epoch, low=0, high=2**31)
        self.worker_id = check_id("worker_id", worker_id)
        self.ttl = check_seconds("ttl", ttl, high=86400)
        self.steal = steal
        self.on_lost = on_lost
        self.ahead = check_int("ahead", ahead, low=0, high=4)
        self.keys = k = ctx.keys.lease_keys(params.name, self.epoch)
        jk = ctx.keys
        self._acquire_keys = [k.meta, k.taken, k.holders, k.expiry, k.done, jk.fence,
                              jk.heartbeats, jk.status, jk.generation, k.offsets]  # fmt: skip
        self._totals = jk.lease_totals(params.name)
        self._acquire_args = [self.worker_id, int(self.ttl * 1000), "1" if steal else "0"]
        self._prepared = False
        self._own: list[int] = []
        self._held: dict[int, Lease] = {}
        # leased ahead (by a completion's round trip, or by the lease thread), for acquire()
        self._ready: deque[Lease] = deque()
        # the lease thread (``ahead``, inside ``draining``) and its calls not yet waited for
        self._thread: ThreadPoolExecutor | None = None
        self._queued: deque[Future[None]] = deque()
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
    @riding_out
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
        kept = record.kept_whole(self.context, self.params.name)
        self._init_pool(self.epoch - 1 - kept)
        self._prepared = True

    def _init_pool(self, close: int) -> None:
        """Open the epoch's pool (one O(1) call: the pool is the taken bitmap's zeros), and
        close epoch ``close`` (negative: none) if it is finished or the job is past it: the
        script UNLINKs its first ``CLOSE_STEP`` record segments, this the rest in steps."""
        keys = [self.keys.meta, self.context.keys.epoch, self.keys.taken, self.keys.done]
        if close >= 0:
            keys += epoch_keys(self.context, self.params, close)
        _, _, closed = self.context.scripts.run(
            "init_epoch", keys,
            [self.params.num_shards, close if close >= 0 else "", RECORD_TTL_S, CLOSE_TTL_S],
            self._context(),
        )  # fmt: skip
        # past this epoch's 4 keys, the closed epoch's 8 before its segments, and the segments
        # the script unlinked
        rest = keys[4 + 8 + CLOSE_STEP :] if int(closed) else []
        for start in range(0, len(rest), CLOSE_STEP):
            self.context.client.unlink(*rest[start : start + CLOSE_STEP])

    # -- the four lease calls --------------------------------------------------------------
    def _handoff_keys(self, shard: int = 0) -> list[str]:
        """``acquire_shard``'s KEYS: the pool's, the completion record's segment holding
        ``shard`` (the first when nothing is completed), the worker index, the lifetime totals,
        the restored offsets (checked only)."""
        segment = self.keys.record(shard // RECORD_SEGMENT)
        return [*self._acquire_keys, segment, self.keys.workers, self._totals, self.keys.restored]

    def acquire(self) -> Lease | None:
        """Lease the next shard: own shards first, then (if ``steal``) others' unstarted ones.

        Inside iteration, one leased ahead (by the previous ``complete()``'s round trip, or
        by the lease thread with ``ahead``) is returned without another.

        Returns:
            The lease, or None when nothing can be leased now (all done, or all leased).

        Raises:
            WorkerNotRegisteredError, WorkerFailedError, WorkerLeftError: not a live worker.
            Exception: what a call of the lease thread raised (``later``), once.
        """
        self._raise_failed()
        lease = self._take_ready()
        if lease is None and self._queued:
            self.settle()  # the calls under way may lease one (and must land first)
            lease = self._take_ready()
        if lease is None:
            lease = self._acquire_now()
        if lease is not None:
            self._top_up()
        return lease

    def _acquire_now(self) -> Lease | None:
        """One ``acquire_shard`` round trip: a lease, or None (nothing to lease now)."""
        if not self._prepared:
            self.prepare()
        grant = new_grant()
        args = [*self._acquire_args, "", "", "", "", grant, *self._own[:CANDIDATES]]
        reply = self._run("acquire_shard", self._handoff_keys(), args, self._context)
        if int(reply[0]) == Acquire.NO_POOL:  # the pool was removed (expired record): again
            self._prepared = False
            return self._acquire_now()
        return self._granted(reply, grant)

    def _take_ready(self) -> Lease | None:
        """The oldest lease held ready and still good (one lost meanwhile is dropped)."""
        while True:
            try:
                lease = self._ready.popleft()
            except IndexError:
                return None
            if lease.lost is None and not lease.finished:
                return lease

    # -- the lease thread (``ahead``) ------------------------------------------------------
    def later(self, call: Callable[[], None]) -> None:
        """Run ``call`` (a completion: ``complete`` wrapped by the caller) on the lease
        thread, after the calls before it; without one (``ahead=0``, or outside
        ``draining``), now. What it raises comes out of the next ``acquire`` or ``settle``."""
        thread = self._thread
        if thread is None:
            call()
            return
        self._queued.append(thread.submit(call))

    def settle(self) -> None:
        """Wait until every call given to the lease thread has landed (a checkpoint's data
        position then agrees with the completion record). Raises the first one's error."""
        failed: BaseException | None = None
        while self._queued:
            error = self._queued.popleft().exception()
            failed = failed or error
        if failed is not None:
            raise failed

    def _raise_failed(self) -> None:
        """Raise the error of a call of the lease thread that has ended (those ended fine
        are forgotten)."""
        while self._queued and self._queued[0].done():
            error = self._queued.popleft().exception()
            if error is not None:
                raise error

    def _top_up(self) -> None:
        """Ask the lease thread to hold ``ahead`` leases ready once fewer than ``ahead - 1``
        are (at least one): above that, the completions' round trips lease the next ones."""
        if self._thread is not None and len(self._ready) < max(1, self.ahead - 1):
            self._queued.append(self._thread.submit(self._fill))

    def _fill(self) -> None:
        # (on the lease thread)
        while self._iterating and len(self._ready) < self.ahead:
            lease = self._acquire_now()
            if lease is None:
                return
            self._ready.append(lease)

    def _granted(self, reply: list[Any], grant: str) -> Lease | None:
        """The lease in an acquire reply (shard, token, expires, offset, consumed), if any,
        granted under the id ``grant``.

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
            start=int(reply[3]), grant=grant,
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
            (expires,) = self._run(
                "renew_shard", [self.keys.holders, self.keys.expiry],
                [lease.shard_id, lease.token, int(self.ttl * 1000), lease.grant],
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
            NotReplicatedError: ``durability="replicated"`` and no replica confirmed it: not
                done (the lease is still held; a call again is acknowledged once one does).
        """
        if lease.lost is not None and guard("fencing"):  # (off: the fault checker's proof)
            raise lease.lost
        with self._lock:
            prefetch = (
                prefetch
                and self._iterating
                and self._prepared
                and len(self._ready) < max(1, self.ahead)
            )
            trained = len(lease.shard) - lease.start  # counted once, if this call records it
            if prefetch:
                grant = new_grant()  # the next lease's
                args = [*self._acquire_args, lease.shard_id, lease.token, trained, lease.grant,
                        grant, *self._own[:CANDIDATES]]  # fmt: skip
            else:
                args = [self.worker_id, 0, "", lease.shard_id, lease.token, trained,
                        lease.grant, ""]  # fmt: skip

            def context() -> dict[str, Any]:
                return self._context(lease.shard_id, lease.token)

            try:
                keys = self._handoff_keys(lease.shard_id)
                reply = self._run("acquire_shard", keys, args, context)
                if prefetch:
                    following = self._granted(reply[1:], grant)
                    if following is not None:
                        self._ready.append(following)
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
                of: the next grant starts there, and the samples from the lease's start to
                it count as trained by this worker (``LeaseTotals``). None keeps the shard's
                offset as it is (and counts nothing).

        Raises:
            LeaseLostError: the caller no longer holds it.
            ValueError: ``offset`` is not within the shard.
        """
        if offset is not None:
            check_int("offset", offset, low=lease.start, high=len(lease.shard) - 1)
        k = self.keys
        with self._lock:
            try:
                self._run(
                    "release_shard",
                    [k.holders, k.expiry, k.taken, k.offsets, self._totals, k.meta],
                    [lease.shard_id, lease.token, "" if offset is None else offset,
                     "" if offset is None else offset - lease.start, lease.grant],
                    lambda: self._context(lease.shard_id, lease.token),
                )  # fmt: skip
            finally:
                self._forget(lease)

    def _run(
        self, name: str, keys: list[str], args: list[Any], context: Callable[[], dict[str, Any]]
    ) -> list[Any]:
        """Run one lease script, riding out a Redis restart or failover shorter than the
        job's ``redis_retry`` (``outage.ride_out``). Each is safe to send again: a completion
        sent again is a retry of itself (recorded once), a renewal extends the same lease, and
        a grant whose reply was lost is never used: it expires after ``ttl``."""
        what = f"lease call {name} of worker {self.worker_id!r}"
        ctx = self.context
        return ride_out(ctx, what, ctx.scripts.run, name, keys, args, context)

    def _forget(self, lease: Lease, lost: LeaseLostError | None = None) -> None:
        lease.finished = True
        if lost is not None and lease.lost is None:
            lease.lost = lost
        with self._lock:
            self._held.pop(lease.shard_id, None)

    def held(self) -> list[Lease]:
        """The leases this worker holds now (granted, neither completed nor released)."""
        with self._lock:
            return list(self._held.values())

    # -- reading the record (record.py) ----------------------------------------------------
    @riding_out
    def progress(self) -> EpochProgress:
        """Shards done, leased and waiting in this (dataset, epoch)."""
        return record.progress(self.context, self.params, self.epoch)

    @riding_out
    def keep_record(self) -> None:
        """Keep a finished epoch's record ``RECORD_TTL_S`` more, then let it expire (unless
        the next epoch's pool closes it first)."""
        # A finished epoch's record is kept RECORD_TTL_S more; an unfinished one stays
        # until it is finished (a restarted job resumes from it).
        with self.context.client.pipeline(transaction=False) as pipe:
            for key in epoch_keys(self.context, self.params, self.epoch):
                pipe.expire(key, RECORD_TTL_S)
            pipe.execute()

    @riding_out
    def holders(self) -> dict[int, LeaseHolder]:
        """The leases held now in this (dataset, epoch): shard id -> its holder."""
        return record.holders(self.context, self.params, self.epoch)

    @riding_out
    def completed_by(self) -> Counter[str]:
        """Worker id -> shards it completed in this (dataset, epoch), open or closed."""
        return record.completed_by(self.context, self.params, self.epoch)

    @riding_out
    def completions(self) -> dict[int, tuple[str, int]]:
        """The completion record: shard id -> (worker id, fencing token); a shard restored
        done from a checkpoint reads ("restored", 0). Empty once the epoch is closed
        (``init_epoch.lua``): its summary keeps ``completed_by`` and ``progress`` only."""
        return record.completions(self.context, self.params, self.epoch)

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

    @riding_out
    def wait_for_work(self, last_id: str = "$") -> str:
        """Wait a little when others hold the remaining leases: for a membership event (a
        failure frees leases), or a short while for expiries and completions. It reaps, as
        a waiting caller may. Returns the events stream id to pass next time."""
        wait_ms = max(10, min(1000, int(self.ttl * 250), int(self.context.max_block * 1000)))
        reap(self.context)
        reply = self.context.client.xread({self.context.keys.events: last_id}, block=wait_ms)
        return str(reply[0][1][-1][0]) if reply else last_id

    @contextmanager
    def draining(self) -> Iterator[ShardLeases]:
        """Drain by hand: inside, ``complete`` also leases the next shard (one round trip per
        shard), held leases are renewed in the background and, with ``ahead``, the lease
        thread keeps leases ready and runs ``later``'s completions; leaving waits for those
        (``settle``) and releases what is held, the ready leases included.

        ``__iter__`` is built on it; use it to drive ``acquire``/``complete`` yourself.
        """
        self._start_renewer()
        self._iterating = True
        if self.ahead:
            self._thread = ThreadPoolExecutor(
                1, thread_name_prefix=f"strata-leases-{self.worker_id}"
            )
        try:
            yield self
        finally:
            thread, self._thread = self._thread, None
            self._iterating = False  # (no lease is held ready from here)
            try:
                self.settle()
            except Exception as exc:  # (the loop left already: its completions are logged)
                log.warning("worker %r: a completion did not land: %s", self.worker_id, exc)
            if thread is not None:
                thread.shutdown(wait=True)
            self._stop_renewer()
            with self._lock:
                self._ready.clear()
                held = list(self._held.values())
            for lease in held:
                try:
                    self.release(lease)
                except (LeaseLostError, NotReplicatedError, redis.RedisError) as exc:
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
                except (redis.RedisError, NotReplicatedError) as exc:
                    log.warning("lease renewal of shard %s failed, retrying: %s",
                                lease.shard_id, exc)  # fmt: skip


def new_grant() -> str:
    """A fresh grant id: 16 random hex digits (no rollback of the token counter can issue
    the same pair of token and grant id twice)."""
    return os.urandom(8).hex()

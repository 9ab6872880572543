"""Fakes at the project's own seams, for the unit tier.

- ``MemoryStorage``: a ``Storage`` (``storage/base.py``) in a dict, with a switch to fail writes.
- ``FakeHost``: a ``StreamHost`` (``data/stream.py``; a walk sees its ``WalkHost`` part,
  ``data/walks/base.py``): the walks' whole view of the process that runs them. Its
  ``retry`` is the seam the stream calls Redis through: the reads of the epoch's record
  (``epoch_record``, ``restored_offsets``, ``done_shards``, ``done_count``) are answered from
  the fake lease pool.
- ``RecordingLedger``: a walk's ``Ledger`` (``data/walks/base.py``) that records what the
  walk reports, to drive a walk without a stream.
- ``LeasePool`` and ``FakeShardLeases``: the lease protocol a walk drives (acquire,
  complete, release, wait, keep the record), in memory, shared by the ranks of one test.
- ``CommitGroup`` and ``FakeProtocol``: the commit protocol's side the save pipeline drives
  (``begin``, ``ack``, ``wait``, ``commit``, ``abort``): the ack of the last rank leads the
  commit, the others wait for it, as ``commit.py`` with its scripts.
- ``RecordingPipe``: a pipeline that records the commands a ``queue_*`` function queues.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import fakeredis

from strata_redis.checkpoint.commit import Acked
from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.checkpoint.manifest import (
    METADATA,
    CheckpointInfo,
    FileEntry,
    checkpoint_dir,
    encode_metadata,
)
from strata_redis.coordination.rendezvous import Round
from strata_redis.data import record as record_module
from strata_redis.data.leases import Lease
from strata_redis.data.sharding import DatasetParams
from strata_redis.errors import (
    CheckpointAbortedError,
    LeaseLostError,
    RoundBrokenError,
    StorageError,
    StorageExistsError,
    StorageNotFoundError,
)
from strata_redis.keys import Keys
from strata_redis.storage import Storage, as_byte_view, check_path
from strata_redis.storage.base import check_prefix

JOB = "unit-job"


# -- storage ---------------------------------------------------------------------------------
class MemoryStorage(Storage):
    """Objects in a dict; ``fail_writes`` makes every write raise ``StorageError``."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.fail_writes: str | None = None  # a path substring whose writes fail
        self.writes: list[str] = []
        self._lock = threading.Lock()

    def _check_write(self, path: str) -> None:
        check_path(path)
        if self.fail_writes is not None and self.fail_writes in path:
            raise StorageError(f"write of {path!r} failed (fake)", backend=self.describe(),
                               path=path)  # fmt: skip

    def write(self, path: str, data: object) -> None:
        self._check_write(path)
        raw = bytes(as_byte_view(data))
        with self._lock:
            self.objects[path] = raw
            self.writes.append(path)

    def write_if_absent(self, path: str, data: object) -> None:
        self._check_write(path)
        raw = bytes(as_byte_view(data))
        with self._lock:
            if path in self.objects:
                raise StorageExistsError(f"{path!r} exists", backend=self.describe(), path=path)
            self.objects[path] = raw
            self.writes.append(path)

    def read(self, path: str) -> bytes:
        check_path(path)
        with self._lock:
            if path not in self.objects:
                raise StorageNotFoundError(f"no {path!r}", backend=self.describe(), path=path)
            return self.objects[path]

    def exists(self, path: str) -> bool:
        check_path(path)
        with self._lock:
            return path in self.objects

    def delete(self, path: str) -> None:
        check_path(path)
        with self._lock:
            self.objects.pop(path, None)

    def list(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        with self._lock:
            return sorted(p for p in self.objects if p.startswith(prefix))

    def describe(self) -> str:
        return "memory://fake"


# -- the walks' host and lease pool ------------------------------------------------------------
def make_round(members: tuple[str, ...], me: str, number: int = 1) -> Round:
    """A closed round of ``members`` (in rank order) as ``me`` sees it."""
    return Round(number=number, rank=members.index(me), world_size=len(members),
                 members=members, fresh=number == 1, generation=number,
                 failure_restarts=0, growth_restarts=0)  # fmt: skip


def fake_context(client: Any | None = None) -> Any:
    """What a walk reads of the job context: its id, its keys and a client (fakeredis: the
    lockstep quota is agreed with plain commands, no script)."""
    return SimpleNamespace(
        job_id=JOB,
        keys=Keys(JOB),
        client=client if client is not None else fakeredis.FakeRedis(decode_responses=True),
    )


class LeasePool:
    """One (dataset, epoch)'s shards as the lease scripts keep them: to do (shard -> the
    offset a lease starts at), held (shard -> lease) and done; shared by every rank."""

    def __init__(
        self,
        params: DatasetParams,
        epoch: int = 0,
        *,
        done: set[int] | None = None,
        offsets: dict[int, int] | None = None,
        restored: dict[int, int] | None = None,
        restored_epoch: int | None = None,
    ) -> None:
        self.params, self.epoch = params, epoch
        #: the offsets the last checkpoint restore wrote (unchanged until the next one), and
        #: the epoch whose record holds them (default: this pool's)
        self.restored: dict[int, int] = dict(restored or {})
        self.restored_epoch = epoch if restored_epoch is None else restored_epoch
        self.done: set[int] = set(done or ())
        self.todo: dict[int, int] = {
            s: (offsets or {}).get(s, 0) for s in range(params.num_shards) if s not in self.done
        }
        self.held: dict[int, Lease] = {}
        self.completed: list[tuple[str, int, bool]] = []  # (worker, shard, prefetch)
        self.released: list[tuple[str, int, int | None]] = []  # (worker, shard, offset)
        self.kept = 0
        self.token = 0
        #: called by ``wait_for_work`` (what another rank does meanwhile); None: nothing
        self.on_wait: Callable[[str], None] | None = None
        self.waits = 0

    def record(self) -> tuple[set[int], dict[int, int]]:
        """``epoch_record``'s answer: the done shards, and the offsets of started ones."""
        return set(self.done), {s: o for s, o in self.todo.items() if o > 0}

    def take_back(self, shard: int) -> None:
        """The holder of ``shard`` was declared failed: its lease is lost, the shard (from
        its recorded offset) is in the pool again."""
        lease = self.held.pop(shard)
        lease.lost = LeaseLostError(
            f"shard {shard} taken back (fake)", job_id=JOB, dataset=self.params.name,
            epoch=self.epoch, shard_id=shard,
        )  # fmt: skip
        self.todo[shard] = lease.start


class FakeShardLeases:
    """A rank's ``ShardLeases`` over a ``LeasePool`` (what the walks call of it)."""

    def __init__(self, pool: LeasePool, worker_id: str) -> None:
        self.pool, self.worker_id = pool, worker_id
        self.params = pool.params

    def acquire(self) -> Lease | None:
        pool = self.pool
        if not pool.todo:
            return None
        shard = next(iter(pool.todo))
        start = pool.todo.pop(shard)
        pool.token += 1
        lease = Lease(shard=self.params.shard(shard, pool.epoch), token=pool.token,
                      expires_ms=0, owner=self, start=start)  # type: ignore[arg-type]  # fmt: skip
        pool.held[shard] = lease
        return lease

    def complete(self, lease: Lease, *, prefetch: bool = True) -> bool:
        pool = self.pool
        if pool.held.get(lease.shard_id) is not lease:
            raise LeaseLostError(
                f"shard {lease.shard_id} is not held (fake)", job_id=JOB,
                dataset=self.params.name, epoch=pool.epoch, shard_id=lease.shard_id,
            )  # fmt: skip
        del pool.held[lease.shard_id]
        pool.done.add(lease.shard_id)
        lease.finished = True
        pool.completed.append((self.worker_id, lease.shard_id, prefetch))
        return True

    def release(self, lease: Lease, offset: int | None = None) -> None:
        pool = self.pool
        if pool.held.get(lease.shard_id) is lease:
            del pool.held[lease.shard_id]
            pool.todo[lease.shard_id] = lease.start if offset is None else offset
        pool.released.append((self.worker_id, lease.shard_id, offset))

    def later(self, call: Callable[[], None]) -> None:
        call()  # (no lease thread: now, as ShardLeases without ``ahead``)

    def settle(self) -> None:
        pass

    def wait_for_work(self, last_id: str = "$") -> str:
        pool = self.pool
        pool.waits += 1
        if pool.waits > 1000:
            raise AssertionError("a walk waits for work forever")
        if pool.on_wait is not None:
            pool.on_wait(self.worker_id)
        return f"{pool.waits}-0"

    def keep_record(self) -> None:
        self.pool.kept += 1

    @property
    def drained(self) -> bool:
        return len(self.pool.done) == self.params.num_shards

    @contextlib.contextmanager
    def draining(self) -> Iterator[FakeShardLeases]:
        try:
            yield self
        finally:  # leaving releases what this rank holds, as ShardLeases.draining
            for lease in [x for x in self.pool.held.values() if x.owner is self]:
                self.release(lease)


def use_pool(monkeypatch: Any, pool: LeasePool) -> dict[str, FakeShardLeases]:
    """Make the walks lease from ``pool``; returns worker id -> its fake ``ShardLeases``."""
    made: dict[str, FakeShardLeases] = {}

    def factory(ctx: Any, params: DatasetParams, epoch: int, worker_id: str,
                ttl: float = 0.0, ahead: int = 0) -> FakeShardLeases:  # fmt: skip
        assert params is pool.params and epoch == pool.epoch
        made[worker_id] = FakeShardLeases(pool, worker_id)
        return made[worker_id]

    from strata_redis.data.walks import leases as leases_walk
    from strata_redis.data.walks import lockstep as lockstep_walk

    monkeypatch.setattr(leases_walk, "ShardLeases", factory)
    monkeypatch.setattr(lockstep_walk, "ShardLeases", factory)
    return made


@dataclass
class FakeHost:
    """A ``StreamHost``: the worker, its round, the per-batch flag and the retry seam."""

    pool: LeasePool
    worker_id: str = "w0"
    members: tuple[str, ...] = ("w0",)
    context: Any = field(default_factory=fake_context)
    lease_ttl: float = 10.0
    epoch: int = 0
    round_number: int = 1
    #: set: the next ``interrupted`` is True, and ``guard`` raises it
    broken: Exception | None = None
    statuses: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    guards: int = 0
    #: dataset -> (epoch, shards done, shard -> offset): what the fresh round resumed from
    restored: dict[str, tuple[int, set[int], dict[int, int]]] = field(default_factory=dict)

    @property
    def round(self) -> Round:
        return make_round(self.members, self.worker_id, self.round_number)

    def interrupted(self) -> bool:
        return self.broken is not None

    def guard(self) -> None:
        self.guards += 1
        if self.broken is not None:
            raise self.broken

    def retry(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.retried.append(getattr(fn, "__name__", repr(fn)))
        pool = self.pool
        if fn is record_module.epoch_record:
            return pool.record()
        if fn is record_module.restored_offsets:  # (ctx, params, epoch): the pool's epoch's
            return dict(pool.restored) if args[2] == pool.restored_epoch else {}
        if fn is record_module.done_shards:
            return set(pool.done)
        if fn is record_module.done_count:
            return len(pool.done)
        return fn(*args, **kwargs)

    def set_status(self, status: str) -> None:
        self.statuses.append(status)

    def begin_epoch(self) -> int:
        return self.epoch

    def resumed(self, dataset: str) -> tuple[int, set[int], dict[int, int]] | None:
        return self.restored.get(dataset)

    def break_round(self, culprit: str = "w9") -> None:
        """The round broke (a member failed): the next check raises."""
        self.broken = RoundBrokenError.because(JOB, self.round_number, culprit, "failed")


class RecordingLedger:
    """A walk's ``Ledger`` (``data/walks/base.py``) that records what the walk reports:
    ``calls`` as (method, argument). A shard's completion runs at its end, or, with
    ``hold``, only when the walk calls ``finish_now`` (as a stream's whose trainer has not
    consumed the shard's last batch yet)."""

    def __init__(self, *, hold: bool = False) -> None:
        self.hold = hold
        self.calls: list[tuple[str, Any]] = []
        self.held: dict[int, Callable[[], None]] = {}

    def trained_before(self, shard: int) -> None:
        self.calls.append(("trained_before", shard))

    def drains(self, leases: Any) -> None:
        pass

    def handed(self, pieces: list[tuple[int, int]]) -> None:
        self.calls.append(("handed", list(pieces)))

    def dropped(self, shard: int) -> None:
        self.calls.append(("dropped", shard))

    def shard_end(self, shard: int, finish: Callable[[], None]) -> None:
        self.calls.append(("shard_end", shard))
        if self.hold:
            self.held[shard] = finish
        else:
            finish()

    def finish_now(self) -> bool:
        held, self.held = list(self.held.values()), {}
        for finish in held:
            finish()
        self.calls.append(("finish_now", bool(held)))
        return bool(held)

    def of(self, method: str) -> list[Any]:
        """The arguments of every call of ``method``, in order."""
        return [arg for name, arg in self.calls if name == method]


# -- the commit protocol ----------------------------------------------------------------------
class CommitGroup:
    """The ranks of one checkpoint commit in memory: the last ack leads, the rest wait."""

    def __init__(self, world_size: int, storage: MemoryStorage) -> None:
        self.world_size, self.storage = world_size, storage
        self.lock = threading.Condition()
        self.begun: list[tuple[int, CheckpointId]] = []
        self.acks: dict[CheckpointId, dict[int, dict[str, Any]]] = {}
        self.committed: dict[CheckpointId, CheckpointInfo] = {}
        self.aborted: dict[CheckpointId, tuple[int, str]] = {}
        self.order: list[tuple[int, CheckpointId]] = []  # acks as they came


class FakeProtocol:
    """One rank's ``StepProtocol`` over a ``CommitGroup``."""

    def __init__(self, group: CommitGroup, rank: int, worker_id: str | None = None) -> None:
        self.group, self.rank = group, rank
        self.world_size = group.world_size
        self.worker_id = worker_id or f"w{rank}"

    def begin(self, cid: CheckpointId) -> None:
        with self.group.lock:
            if cid in self.group.aborted:
                raise CheckpointAbortedError.by(JOB, cid, "w?", self.group.aborted[cid][1])
            self.group.begun.append((self.rank, cid))

    def ack(self, cid: CheckpointId, files: dict[str, FileEntry], nbytes: int, seconds: float
            ) -> tuple[Acked, dict[int, dict[str, Any]]] | None:  # fmt: skip
        g = self.group
        with g.lock:
            g.order.append((self.rank, cid))
            g.lock.notify_all()
            acks = g.acks.setdefault(cid, {})
            acks[self.rank] = {"worker": self.worker_id, "files": {
                p: {"name": f.name, "size": f.size, "checksum": f.checksum}
                for p, f in files.items()}}  # fmt: skip
            if len(acks) < g.world_size:
                return None
            return Acked(ms=1000 + len(g.committed), clock=0), dict(acks)

    def commit(self, cid: CheckpointId, acked: Acked, acks: dict[int, dict[str, Any]]
               ) -> CheckpointInfo:  # fmt: skip
        files = {p: FileEntry(p, str(f["name"]), rank, int(f["size"]), str(f["checksum"]))
                 for rank, a in sorted(acks.items()) for p, f in a["files"].items()}  # fmt: skip
        info = CheckpointInfo(JOB, cid.step, cid.epoch, len(acks),
                              {r: str(a["worker"]) for r, a in acks.items()}, files,
                              acked.ms, run=cid.run)  # fmt: skip
        self.group.storage.write_if_absent(f"{checkpoint_dir(JOB, cid)}/{METADATA}",
                                           encode_metadata(info))  # fmt: skip
        with self.group.lock:
            self.group.committed[cid] = info
            self.group.lock.notify_all()
        return info

    def wait(self, cid: CheckpointId, timeout: float) -> CheckpointInfo:
        g = self.group
        with g.lock:
            if not g.lock.wait_for(lambda: cid in g.committed or cid in g.aborted, timeout):
                raise CheckpointAbortedError.by(JOB, cid, self.worker_id, "timed out (fake)")
            if cid in g.aborted:
                rank, reason = g.aborted[cid]
                raise CheckpointAbortedError.by(JOB, cid, f"w{rank}", reason)
            return g.committed[cid]

    def abort(self, cid: CheckpointId, reason: str, nbytes: int = 0, seconds: float = 0.0) -> bool:
        g = self.group
        with g.lock:
            if cid in g.committed or cid in g.aborted:
                return False
            g.aborted[cid] = (self.rank, reason)
            g.lock.notify_all()
            return True


# -- the queue/take convention -----------------------------------------------------------------
class RecordingPipe:
    """A pipeline that records what is queued on it: ``calls`` as (command, args)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Callable[..., RecordingPipe]:
        def queue(*args: Any, **kwargs: Any) -> RecordingPipe:
            self.calls.append((name, args, kwargs))
            return self

        return queue

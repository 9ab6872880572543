"""The all-or-nothing commit of one checkpoint: begin, ack, lead or wait, commit or abort.

A checkpoint is named by its ``CheckpointId`` (the loop's epoch and step, the job's run):
its Redis keys end with its label, the index holds its member (``ids.py``). Each
participant (rank) of a checkpoint runs ``begin`` (Lua: it must go forward in (run, epoch,
step) order and be open), uploads its parts, then ``ack``\\ s them with their sizes and
checksums (Lua). The ack that brings it to ``world_size`` acks makes its sender the one
leader: it writes ``metadata.json`` with a create-only write — the commit point in storage —
and then marks the checkpoint committed in Redis (Lua), waking every waiter. A participant
whose upload fails aborts it (Lua): its waiters block on one list per checkpoint, so the
abort wakes them at once, and it never becomes visible. A waiter also aborts a checkpoint
whose missing participant the registry declared failed, or that outlived its timeout; a
committing one whose leader vanished is finished by a waiter (the metadata is the same
bytes either way). Each script call rides out a Redis restart, failover or memory pause
shorter than the job's ``redis_retry`` (``outage.ride_out``): an ack in flight is sent
again, and its step goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import orjson

from ..connection import Replies, take_reply
from ..context import JobContext, as_context
from ..errors import (
    CheckpointAbortedError,
    CheckpointError,
    StorageError,
    StorageExistsError,
    StorageNotFoundError,
)
from ..keys import Keys
from ..outage import RIDDEN, Outage, ride_out
from ..storage import Storage
from .ids import CheckpointId
from .index import CheckpointIndex
from .manifest import (
    METADATA,
    CheckpointInfo,
    FileEntry,
    checkpoint_dir,
    decode_metadata,
    encode_metadata,
    located,
)

__all__ = ["StepProtocol"]

log = logging.getLogger("strata_redis.checkpoint")

#: a step's Redis keys live this long after their last use (ms); the index never expires
STEP_TTL_MS = 86_400_000
#: a finished (committed) step's keys linger this long for late waiters (ms)
DONE_TTL_MS = 3_600_000
#: save records kept in the capped stream (approximately)
RECORDS_CAP = 10_000
#: a waiter looks at the step (failed participants, its timeout) this often (seconds)
CHECK_EVERY_S = 1.0


class StepProtocol:
    """One participant's side of the commit protocol, for every step it saves.

    Args:
        ctx: the job (Redis client, keys, scripts).
        storage: where the parts and metadata.json go.
        worker_id: this participant's worker id.
        rank: its rank in ``[0, world_size)``.
        world_size: how many ranks must ack a step before it commits.
    """

    def __init__(
        self, ctx: JobContext, storage: Storage, *, worker_id: str, rank: int, world_size: int
    ) -> None:
        self.context = ctx
        self.index = CheckpointIndex(ctx)
        self.storage = storage
        self.worker_id = worker_id
        self.rank = rank
        self.world_size = world_size

    # -- the scripts -------------------------------------------------------------------------
    def _run(self, name: str, cid: CheckpointId, keys: list[str], args: list[Any]) -> list[Any]:
        # every script of the protocol may be sent again: a begin, an ack (ack_checkpoint.lua
        # records a repeated ack once), a commit and an abort each repeat as themselves, and
        # a script Redis refused at its memory limit applied nothing
        what = f"checkpoint {cid} {name} of {self.worker_id!r}"
        return ride_out(self.context, what, self._send, name, cid, keys, args)

    def _send(self, name: str, cid: CheckpointId, keys: list[str], args: list[Any]) -> list[Any]:
        """Run one script of the protocol once (``_run`` rides out an outage around it)."""

        def context() -> dict[str, Any]:
            return {
                "job_id": self.context.job_id, "step": cid.step, "epoch": cid.epoch,
                "checkpoint": cid, "worker_id": self.worker_id, "rank": self.rank,
                "world_size": self.world_size, "parse": CheckpointId.from_member,
            }  # fmt: skip

        return self.context.scripts.run(name, keys, args, context)

    def begin(self, cid: CheckpointId) -> None:
        """Open (or join) checkpoint ``cid`` as this rank's worker.

        Raises:
            CheckpointError: it is committed, not after the newest committed checkpoint, was
                opened with another world size, or the rank is another worker's.
            CheckpointAbortedError: another participant already aborted it.
        """
        k = self.context.keys
        self._run(
            "begin_checkpoint", cid, [k.checkpoint_step(cid.label), self.index.keys[0]],
            [cid.member, *_numbers(cid), self.world_size, self.rank, self.worker_id, STEP_TTL_MS],
        )  # fmt: skip

    def ack(
        self, cid: CheckpointId, files: dict[str, FileEntry], nbytes: int, seconds: float
    ) -> tuple[Acked, dict[int, dict[str, Any]]] | None:
        """Ack this rank's uploaded ``files``; also records the save (bytes, seconds, MB/s).

        Returns:
            ``(when the last rank acked, every rank's ack)`` if this call made the caller the
            leader, else None.

        Raises:
            CheckpointError, CheckpointAbortedError: as ``begin``, or the step was superseded.
        """
        k = self.context.keys
        doc = {
            "worker": self.worker_id,
            "files": {p: {"name": f.name, "size": f.size, "checksum": f.checksum}
                      for p, f in files.items()},
        }  # fmt: skip
        mb_s = nbytes / 1e6 / seconds if seconds > 0 else 0.0
        label = cid.label
        reply = self._run(
            "ack_checkpoint", cid,
            [k.checkpoint_step(label), k.checkpoint_acks(label), k.checkpoint_wake(label),
             self.index.keys[0], k.checkpoint_records, k.checkpoint_totals],
            [cid.member, *_numbers(cid), self.rank, self.worker_id, orjson.dumps(doc),
             STEP_TTL_MS, RECORDS_CAP, nbytes, f"{seconds:.6f}", f"{mb_s:.3f}"],
        )  # fmt: skip
        if int(reply[0]) != 1:
            return None
        return Acked(int(reply[1]), int(reply[2])), _acks(reply[3:])

    def abort(self, cid: CheckpointId, reason: str, nbytes: int = 0, seconds: float = 0.0) -> bool:
        """Abort checkpoint ``cid`` naming this worker as the culprit; wake its waiters at once.

        Returns:
            Whether it is aborted now (False: it committed or is being committed).
        """
        k = self.context.keys
        try:
            self._run(
                "abort_checkpoint", cid,
                [k.checkpoint_step(cid.label), k.checkpoint_wake(cid.label), k.checkpoint_records,
                 k.checkpoint_totals],
                [*_numbers(cid), self.worker_id, reason[:1000], self.rank, self.world_size,
                 STEP_TTL_MS, RECORDS_CAP, nbytes, f"{seconds:.6f}"],
            )  # fmt: skip
        except CheckpointError as exc:
            log.warning("could not abort checkpoint %s: %s", cid, exc)
            return False
        return True

    # -- leading -----------------------------------------------------------------------------
    def commit(
        self, cid: CheckpointId, acked: Acked, acks: dict[int, dict[str, Any]],
        *, takeover: bool = False,
    ) -> CheckpointInfo:  # fmt: skip
        """Write metadata.json (create-only), then mark ``cid`` committed in Redis.

        Raises:
            CheckpointAbortedError: metadata.json could not be written (it is not there); the
                checkpoint is aborted.
            CheckpointError: a different metadata.json is already there (never overwritten);
                or its write failed and reading it back failed too: whether it landed is not
                known, so the checkpoint is not aborted (an aborted step must never be
                visible): it stays committing, for a waiting rank's takeover to finish.
        """
        job_id = self.context.job_id
        info = located(build_info(self.context, cid, acked, acks), self.storage)
        raw = encode_metadata(info)
        path = f"{checkpoint_dir(job_id, cid)}/{METADATA}"
        try:
            self.storage.write_if_absent(path, raw)
        except StorageExistsError:
            if self.storage.read(path) != raw:
                self.abort(cid, f"{path} already exists with other contents")
                raise CheckpointError(
                    f"checkpoint {cid} of job {job_id!r}: {self.storage.describe()}/{path} "
                    "already exists with other contents; it was not overwritten",
                    job_id=job_id, step=cid.step, epoch=cid.epoch,
                ) from None  # fmt: skip
            # The same bytes: an earlier leader (or our own earlier try) wrote it.
        except StorageError as exc:
            landed = self._written(path, raw)
            if landed is None:
                raise CheckpointError(
                    f"checkpoint {cid} of job {job_id!r}: writing {path} failed ({exc}) and "
                    "reading it back failed too: not aborted, since it may have landed; it "
                    "stays committing (a waiting rank finishes it, or its state expires)",
                    job_id=job_id, step=cid.step, epoch=cid.epoch,
                ) from exc  # fmt: skip
            if not landed:
                reason = f"writing {METADATA} failed: {exc}"
                self.abort(cid, reason)
                raise CheckpointAbortedError.by(job_id, cid, self.worker_id, reason) from exc
        k = self.context.keys
        label = cid.label
        self._run(
            "commit_checkpoint", cid,
            [k.checkpoint_step(label), k.checkpoint_acks(label), k.checkpoint_wake(label),
             *self.index.keys],
            [cid.member, self.worker_id, raw, "1" if takeover else "0", DONE_TTL_MS,
             info.location],
        )  # fmt: skip
        return info

    def _written(self, path: str, raw: bytes) -> bool | None:
        """After a failed write: did it land anyway (a lost reply)? None: not known (the
        read failed too, and not because the object is missing)."""
        try:
            return self.storage.read(path) == raw
        except StorageNotFoundError:
            return False
        except StorageError:
            return None

    # -- waiting -----------------------------------------------------------------------------
    def wait(self, cid: CheckpointId, timeout: float) -> CheckpointInfo:
        """Wait until ``cid`` commits (return its info) or aborts (raise), at most ``timeout``.

        Raises:
            CheckpointAbortedError: a participant aborted it, failed before acking, or the
                wait timed out while acks were missing (then this waiter aborted it).
            CheckpointError: its keys expired, or it stayed committing past the timeout and
                could not be finished here.
            RedisUnavailableError: Redis stayed unreachable past the job's ``redis_retry``
                (a shorter outage is ridden out).
        """
        wake = self.context.keys.checkpoint_wake(cid.label)
        deadline = time.monotonic() + timeout
        outage = Outage(self.context, f"checkpoint {cid} wait of {self.worker_id!r}")
        while True:
            remaining = deadline - time.monotonic()
            block = max(0.001, min(CHECK_EVERY_S, as_context(self.context).max_block, remaining))
            try:
                popped = self.context.client.blpop([wake], timeout=block)
                if popped is not None and popped[1] == "committed":  # final: no check needed
                    return self._committed_info(cid)
                timed_out = popped is None and remaining <= CHECK_EVERY_S
                state, who, reason = self._check(cid, timed_out)
            except RIDDEN as exc:
                paused = time.monotonic()
                outage.failed(exc)  # Redis answers again: look again (the reads repeat)
                # the outage does not count against the other ranks: none could ack in it
                deadline += time.monotonic() - paused
                continue
            if state == "committed":
                return self._committed_info(cid)
            if state == "aborted":
                raise CheckpointAbortedError.by(self.context.job_id, cid, who, reason)
            if state == "missing":
                raise CheckpointError(
                    f"checkpoint {cid} of job {self.context.job_id!r} has no state in Redis any "
                    "more (its keys expired or Redis lost them)", job_id=self.context.job_id,
                    step=cid.step, epoch=cid.epoch,
                )  # fmt: skip
            if state == "committing" and timed_out:
                log.warning("checkpoint %s: leader %r did not finish committing; finishing it",
                            cid, who)  # fmt: skip
                return self._take_over(cid)

    def _check(self, cid: CheckpointId, timed_out: bool) -> tuple[str, str, str]:
        k = self.context.keys
        label = cid.label
        # sent once: ``wait`` rides out an outage itself, moving its deadline by the pause
        state, who, reason = self._send(
            "check_checkpoint", cid,
            [k.checkpoint_step(label), k.checkpoint_acks(label), k.checkpoint_wake(label),
             k.heartbeats, k.status],
            ["1" if timed_out else "0", self.worker_id, STEP_TTL_MS],
        )  # fmt: skip
        return str(state), str(who), str(reason)

    def _acks(self, cid: CheckpointId) -> tuple[Acked, dict[int, dict[str, Any]]]:
        k = self.context.keys
        with self.context.client.pipeline(transaction=True) as pipe:
            pipe.hmget(k.checkpoint_step(cid.label), "acked_ms", "acked_clock")
            pipe.hgetall(k.checkpoint_acks(cid.label))
            (acked_ms, clock), raw_acks = pipe.execute()
        acked = Acked(int(acked_ms or 0), int(clock or 0))
        return acked, {int(r): orjson.loads(v) for r, v in raw_acks.items()}

    def _take_over(self, cid: CheckpointId) -> CheckpointInfo:
        acked, acks = self._acks(cid)
        return self.commit(cid, acked, acks, takeover=True)

    def _committed_info(self, cid: CheckpointId) -> CheckpointInfo:
        try:
            return self.info(cid)
        except CheckpointError:
            # Retention already dropped it from the index (a newer checkpoint committed and
            # keep_count is small): the acks say the same as its metadata.json did.
            acked, acks = self._acks(cid)
            return located(build_info(self.context, cid, acked, acks), self.storage)

    def info(self, cid: CheckpointId) -> CheckpointInfo:
        """The committed checkpoint ``cid``'s info from the Redis index.

        Raises:
            CheckpointError: ``cid`` is not in the index.
        """
        raw = self.index.metadata(cid)
        if raw is None:
            raise CheckpointError(
                f"checkpoint {cid} of job {self.context.job_id!r} is not in the index",
                job_id=self.context.job_id, step=cid.step, epoch=cid.epoch,
            )  # fmt: skip
        return located(decode_metadata(raw, self.context.job_id, cid), self.storage)


@dataclass(frozen=True)
class Acked:
    """When a checkpoint's last rank acked: ``ms`` on Redis' clock, and the job's ``clock``
    then (``era.py``; 0 for a step acked before the clock existed)."""

    ms: int
    clock: int


def build_info(
    ctx: JobContext, cid: CheckpointId, acked: Acked, acks: dict[int, dict[str, Any]]
) -> CheckpointInfo:
    """The checkpoint's info from every rank's ack: what metadata.json will say (the same
    for every leader: the era and the clock are the job's, read from the step's record)."""
    files: dict[str, FileEntry] = {}
    workers: dict[int, str] = {}
    for rank, ack in sorted(acks.items()):
        workers[rank] = str(ack["worker"])
        for path, f in ack["files"].items():
            files[path] = FileEntry(path, str(f["name"]), rank, int(f["size"]), str(f["checksum"]))
    return CheckpointInfo(
        ctx.job_id, cid.step, cid.epoch, len(acks), workers, files, acked.ms, run=cid.run,
        era=ctx.era.value() if acked.clock else "", clock=acked.clock,
    )  # fmt: skip


def step_workers(ctx: JobContext, cid: CheckpointId) -> tuple[set[str], set[str]]:
    """The workers that began their part of checkpoint ``cid``, and those that acked it (one
    round trip; for tools that watch a save)."""
    k = ctx.keys
    with ctx.client.pipeline(transaction=False) as pipe:
        pipe.hgetall(k.checkpoint_step(cid.label))
        pipe.hgetall(k.checkpoint_acks(cid.label))
        state, acks = pipe.execute()
    began = {str(w) for f, w in state.items() if str(f).startswith("r:")}
    return began, {str(orjson.loads(v)["worker"]) for v in acks.values()}


#: the states of a checkpoint whose ranks (or leader) may still be writing to storage
IN_FLIGHT: Final = frozenset({"open", "committing"})


def step_states(ctx: JobContext, steps: Iterable[CheckpointId]) -> dict[CheckpointId, str | None]:
    """Each checkpoint's state (``open``, ``committing``, ``committed``, ``aborted``; None:
    no state: never opened here, or its keys expired), in one round trip (for retention)."""
    ordered = list(dict.fromkeys(steps))
    if not ordered:
        return {}
    k = ctx.keys
    with ctx.client.pipeline(transaction=False) as pipe:
        for step in ordered:
            pipe.hget(k.checkpoint_step(step.label), "state")
        states = pipe.execute()
    return {s: None if v is None else str(v) for s, v in zip(ordered, states, strict=True)}


def _numbers(cid: CheckpointId) -> list[Any]:
    """(run, epoch or "", step): how the scripts take a checkpoint's numbers."""
    return [cid.run, "" if cid.epoch is None else cid.epoch, cid.step]


def _acks(flat: list[Any]) -> dict[int, dict[str, Any]]:
    return {int(flat[i]): orjson.loads(flat[i + 1]) for i in range(0, len(flat), 2)}


# -- batched reads of a step's state (connection.py: the queue/take convention) ---------------
_STEP_FIELDS: Final = (
    "state", "world_size", "epoch", "opened_ms", "leader", "acked_ms", "committed_ms",
    "aborted_ms", "culprit", "reason", "run", "step",
)  # fmt: skip


@dataclass(frozen=True)
class StepState:
    """A checkpoint's state hash as the commit protocol left it (None: a field not set).

    Attributes:
        state: ``open``, ``committing``, ``committed`` or ``aborted`` (None: no state: it
            was never opened, or its keys expired).
        world_size, epoch: what it was opened with (the epoch None also when it has none).
        opened_ms, acked_ms, committed_ms, aborted_ms: when it moved, ms on Redis' clock.
        leader: the worker that leads its commit.
        culprit, reason: who aborted it and why.
        run, step: its run and step (None: it has no state).
    """

    state: str | None = None
    world_size: int | None = None
    epoch: int | None = None
    opened_ms: int | None = None
    leader: str | None = None
    acked_ms: int | None = None
    committed_ms: int | None = None
    aborted_ms: int | None = None
    culprit: str | None = None
    reason: str | None = None
    run: int | None = None
    step: int | None = None


def queue_step_state(pipe: Any, job_id: str, step: CheckpointId) -> None:
    """Queue a read of checkpoint ``step``'s state hash."""
    pipe.hmget(Keys(job_id).checkpoint_step(step.label), _STEP_FIELDS)


def take_step_state(replies: Replies) -> StepState:
    """The state ``queue_step_state`` read."""
    f = dict(zip(_STEP_FIELDS, take_reply(replies), strict=True))

    def number(name: str) -> int | None:
        return int(f[name]) if f[name] else None

    return StepState(
        state=f["state"] or None, world_size=number("world_size"), epoch=number("epoch"),
        opened_ms=number("opened_ms"), leader=f["leader"], acked_ms=number("acked_ms"),
        committed_ms=number("committed_ms"), aborted_ms=number("aborted_ms"),
        culprit=f["culprit"], reason=f["reason"], run=number("run"), step=number("step"),
    )  # fmt: skip

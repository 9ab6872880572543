"""Save records: one entry per checkpoint save (bytes, seconds, MB/s), in a capped stream.

An entry's fields (``keys.checkpoint_records``; written by ``ack_checkpoint.lua`` and
``abort_checkpoint.lua``): ``step``, ``epoch`` (empty when none), ``run`` — the checkpoint's
numbers as the loop gave them — and ``rank``, ``worker``, ``bytes``, ``seconds``, ``mb_s``,
``outcome`` (``uploaded`` or ``aborted``), ``at_ms``. ``decode_record`` is the one parser,
and ``checkpoint_throughput`` the one definition of a checkpoint's MB/s.
The same scripts count the job's checkpoint totals (``keys.checkpoint_totals``), which the
capped stream cannot give: ``take_totals`` reads them (``/metrics``' counters).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..connection import (
    Replies,
    StreamPage,
    queue_stream_page,
    take_reply,
    take_stream_page,
)
from ..context import JobContext
from ..keys import Keys
from ..validate import check_int
from .ids import CheckpointId

__all__ = [
    "MB_S_DEFINITION",
    "CheckpointThroughput",
    "CheckpointTotals",
    "SaveRecord",
    "checkpoint_throughput",
    "decode_record",
    "save_records",
]


@dataclass(frozen=True)
class SaveRecord:
    """One rank's save of one checkpoint, as recorded in Redis for dashboards.

    Attributes:
        step: the loop's step of the checkpoint.
        rank: the rank that saved.
        worker_id: its worker id.
        nbytes: bytes it uploaded.
        seconds: from taking the snapshot to the end of its upload.
        mb_s: ``nbytes`` / ``seconds``, in MB (10^6 bytes) per second.
        outcome: ``"uploaded"`` (acked) or ``"aborted"`` (its upload failed).
        at_ms: when it was recorded, ms on Redis' clock.
        epoch: the checkpoint's epoch (None if it has none).
        run: the checkpoint's run (``ids.py``).
    """

    step: int
    rank: int
    worker_id: str
    nbytes: int
    seconds: float
    mb_s: float
    outcome: str
    at_ms: int
    epoch: int | None = None
    run: int = 0

    @cached_property
    def checkpoint(self) -> CheckpointId:
        """The checkpoint it saved (built once: a dashboard document asks it per record)."""
        return CheckpointId(self.step, self.epoch, self.run)


def decode_record(f: Mapping[str, str]) -> SaveRecord:
    """A save record from its stream entry's fields.

    Raises:
        KeyError, ValueError: not a save record.
    """
    epoch = f.get("epoch", "")
    return SaveRecord(
        step=int(f["step"]),
        rank=int(f["rank"]),
        worker_id=f["worker"],
        nbytes=int(f["bytes"]),
        seconds=float(f["seconds"]),
        mb_s=float(f["mb_s"]),
        outcome=f["outcome"],
        at_ms=int(f["at_ms"]),
        epoch=int(epoch) if epoch else None,
        run=int(f.get("run", 0)),
    )


def save_records(ctx: JobContext, count: int = 100) -> list[SaveRecord]:
    """The newest ``count`` save records of the job, oldest first.

    Raises:
        TypeError, ValueError: ``count`` is not an int in ``[1, 100000]``.
    """
    count = check_int("count", count, low=1, high=100_000)
    entries = ctx.client.xrevrange(ctx.keys.checkpoint_records, count=count)
    return [decode_record(f) for _id, f in reversed(entries)]


#: a checkpoint's MB/s in words, as pages and help texts say it
MB_S_DEFINITION = "all ranks' bytes ÷ the slowest rank's save seconds"


@dataclass(frozen=True)
class CheckpointThroughput:
    """How fast one checkpoint was saved: the one definition of a checkpoint's MB/s.

    MB/s is every rank's uploaded bytes over the slowest rank's seconds (from taking its
    snapshot to the end of its upload). The ranks save in parallel, so the checkpoint is in
    storage when its slowest rank is done; each rank times itself on its own clock, so no
    two machines' clocks are compared; and the figure is what the table beside it shows
    (size ÷ seconds). A rank's own ``SaveRecord.mb_s`` is its part only.

    Attributes:
        ranks: ranks whose upload is recorded (``uploaded``).
        nbytes: the bytes they uploaded.
        seconds: the slowest of them, seconds (0.0 when none).
        mb_s: ``nbytes`` / ``seconds`` in MB (10^6 bytes) per second; None when no rank
            uploaded (or took no measurable time).
        at_ms: when the newest of them was recorded, ms on Redis' clock (None: none).
    """

    ranks: int
    nbytes: int
    seconds: float
    mb_s: float | None
    at_ms: int | None


def checkpoint_throughput(saves: Iterable[SaveRecord]) -> CheckpointThroughput:
    """The throughput of one checkpoint from its save records (see ``CheckpointThroughput``);
    records of other outcomes than ``uploaded`` are left out."""
    uploaded = [r for r in saves if r.outcome == "uploaded"]
    nbytes = sum(r.nbytes for r in uploaded)
    seconds = max((r.seconds for r in uploaded), default=0.0)
    return CheckpointThroughput(
        ranks=len(uploaded),
        nbytes=nbytes,
        seconds=seconds,
        mb_s=nbytes / 1e6 / seconds if seconds > 0 else None,
        at_ms=max((r.at_ms for r in uploaded), default=None),
    )


# -- batched reads (connection.py: the queue/take convention) ---------------------------------
def _record(_entry_id: str, f: dict[str, str]) -> SaveRecord:
    return decode_record(f)


def queue_save_records(pipe: Any, job_id: str, count: int, after: str | None = None) -> None:
    """Queue a read of the newest ``count`` save records (those after entry ``after``) and
    the stream's length."""
    queue_stream_page(pipe, Keys(job_id).checkpoint_records, count, after)


def take_save_records(replies: Replies) -> StreamPage[SaveRecord]:
    """The records ``queue_save_records`` read, newest first, and the stream's length."""
    return take_stream_page(replies, _record)


@dataclass(frozen=True)
class CheckpointTotals:
    """The job's checkpoint totals over its life (``keys.checkpoint_totals``); never reset.

    Attributes:
        saves: ranks' saves acked (uploaded).
        saved_bytes: bytes those saves uploaded.
        save_seconds: seconds those saves took, summed over ranks (counted in whole ms:
            ``HINCRBYFLOAT`` is not in the docs' worker ACL rule).
        aborted_steps: checkpoints that became aborted.
        aborted_saves: failed saves recorded with an abort.
    """

    saves: int = 0
    saved_bytes: int = 0
    save_seconds: float = 0.0
    aborted_steps: int = 0
    aborted_saves: int = 0


_TOTALS = ("saves", "saved_bytes", "save_ms", "aborted_steps", "aborted_saves")


def queue_totals(pipe: Any, job_id: str) -> None:
    """Queue a read of the job's checkpoint totals (one ``HMGET``)."""
    pipe.hmget(Keys(job_id).checkpoint_totals, list(_TOTALS))


def take_totals(replies: Replies) -> CheckpointTotals:
    """The totals ``queue_totals`` read (zeros where none was counted yet)."""
    saves, nbytes, ms, steps, aborted = take_reply(replies)
    return CheckpointTotals(
        saves=int(saves or 0),
        saved_bytes=int(nbytes or 0),
        save_seconds=int(ms or 0) / 1000,
        aborted_steps=int(steps or 0),
        aborted_saves=int(aborted or 0),
    )

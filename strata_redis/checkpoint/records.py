"""Save records: one entry per checkpoint save (bytes, seconds, MB/s), in a capped stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..connection import Replies, StreamPage, queue_stream_page, take_stream_page
from ..context import JobContext
from ..keys import Keys
from ..validate import check_int

__all__ = ["SaveRecord", "save_records"]


@dataclass(frozen=True)
class SaveRecord:
    """One rank's save of one step, as recorded in Redis for dashboards.

    Attributes:
        step: the step.
        rank: the rank that saved.
        worker_id: its worker id.
        nbytes: bytes it uploaded.
        seconds: from taking the snapshot to the end of its upload.
        mb_s: ``nbytes`` / ``seconds``, in MB (10^6 bytes) per second.
        outcome: ``"uploaded"`` (acked) or ``"aborted"`` (its upload failed).
        at_ms: when it was recorded, ms on Redis' clock.
    """

    step: int
    rank: int
    worker_id: str
    nbytes: int
    seconds: float
    mb_s: float
    outcome: str
    at_ms: int


def save_records(ctx: JobContext, count: int = 100) -> list[SaveRecord]:
    """The newest ``count`` save records of the job, oldest first.

    Raises:
        TypeError, ValueError: ``count`` is not an int in ``[1, 100000]``.
    """
    count = check_int("count", count, low=1, high=100_000)
    entries = ctx.client.xrevrange(ctx.keys.checkpoint_records, count=count)
    return [
        SaveRecord(
            step=int(f["step"]),
            rank=int(f["rank"]),
            worker_id=f["worker"],
            nbytes=int(f["bytes"]),
            seconds=float(f["seconds"]),
            mb_s=float(f["mb_s"]),
            outcome=f["outcome"],
            at_ms=int(f["at_ms"]),
        )
        for _id, f in reversed(entries)
    ]


# -- batched reads (connection.py: the queue/take convention) ---------------------------------
def _record(_entry_id: str, f: dict[str, str]) -> SaveRecord:
    return SaveRecord(
        step=int(f["step"]),
        rank=int(f["rank"]),
        worker_id=f["worker"],
        nbytes=int(f["bytes"]),
        seconds=float(f["seconds"]),
        mb_s=float(f["mb_s"]),
        outcome=f["outcome"],
        at_ms=int(f["at_ms"]),
    )


def queue_save_records(pipe: Any, job_id: str, count: int, after: str | None = None) -> None:
    """Queue a read of the newest ``count`` save records (those after entry ``after``) and
    the stream's length."""
    queue_stream_page(pipe, Keys(job_id).checkpoint_records, count, after)


def take_save_records(replies: Replies) -> StreamPage[SaveRecord]:
    """The records ``queue_save_records`` read, newest first, and the stream's length."""
    return take_stream_page(replies, _record)

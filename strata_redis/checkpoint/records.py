"""Save records: one entry per checkpoint save (bytes, seconds, MB/s), in a capped stream."""

from __future__ import annotations

from dataclasses import dataclass

from ..context import JobContext
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

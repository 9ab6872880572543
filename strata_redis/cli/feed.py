"""A job's event feed (``strata events``): its membership, rendezvous and checkpoint events,
merged in time order, read through their owners (``registry``, ``rendezvous``,
``checkpoint.records``) in one round trip per look.

Each stream is capped, so the feed shows the newest events and, followed, what comes after
them: a reader keeps the last entry id it saw of each stream and asks only for newer ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Final

from strata_redis.checkpoint.records import SaveRecord, queue_save_records, take_save_records
from strata_redis.connection import run_read
from strata_redis.coordination.registry import MembershipEvent, queue_events, take_events
from strata_redis.coordination.rendezvous import (
    RoundEvent,
    queue_round_events,
    take_round_events,
)

__all__ = ["KINDS", "Event", "Feed"]

#: the feed's sources, in the order a tie in time is shown
KINDS: Final = ("membership", "rendezvous", "checkpoint")
#: the most entries one look reads of each stream
PAGE: Final = 200


@dataclass(frozen=True)
class Event:
    """One event of the feed.

    Attributes:
        kind: its source (``KINDS``).
        id: its stream entry id (``<ms>-<seq>``: the feed's order within a source).
        ms: when it happened, ms on Redis' clock.
        text: what happened, in a few words.
        fields: the event's facts, for ``--json``.
    """

    kind: str
    id: str
    ms: int
    text: str
    fields: dict[str, Any]

    def line(self) -> str:
        """The event as one line: local time, source, what happened."""
        clock = time.strftime("%H:%M:%S", time.localtime(self.ms / 1000))
        return f"{clock}.{self.ms % 1000:03d}  {self.kind:<10}  {self.text}"

    def doc(self) -> dict[str, Any]:
        """The event as a JSON object."""
        return {"kind": self.kind, "id": self.id, "ms": self.ms, "text": self.text, **self.fields}


def _membership(entry_id: str, e: MembershipEvent) -> Event:
    text = f"{e.type} {e.worker_id} (generation {e.generation})"
    facts = {"type": e.type, "worker_id": e.worker_id, "generation": e.generation}
    return Event("membership", entry_id, e.ms, text, facts)


def _round_text(e: RoundEvent) -> str:
    if e.type == "open":
        return f"round {e.round} opened ({e.detail.get('reason', '')})"
    if e.type == "close":
        return f"round {e.round} closed: world size {e.detail.get('world_size', '?')}"
    if e.type == "broken":
        worker, reason = e.detail.get("worker", "?"), e.detail.get("reason", "")
        return f"round {e.round} broken by {worker}: {reason}"
    if e.type == "end":
        return "the rendezvous ended"
    return f"{e.type} round {e.round}"


def _rendezvous(entry_id: str, e: RoundEvent) -> Event:
    facts: dict[str, Any] = {"type": e.type, "round": e.round, **e.detail}
    return Event("rendezvous", entry_id, e.ms, _round_text(e), facts)


def _checkpoint(entry_id: str, r: SaveRecord) -> Event:
    at = f"epoch {r.epoch} step {r.step}" if r.epoch is not None else f"step {r.step}"
    if r.run:  # a relaunch's checkpoints are told from the first launch's of the same step
        at = f"run {r.run} {at}"
    text = (
        f"{at}: rank {r.rank} ({r.worker_id}) {r.outcome} {r.nbytes / 1e6:.1f} MB "
        f"in {r.seconds:.2f} s"
    )
    facts = {"step": r.step, "epoch": r.epoch, "run": r.run, "rank": r.rank,
             "worker_id": r.worker_id, "outcome": r.outcome, "bytes": r.nbytes}  # fmt: skip
    return Event("checkpoint", entry_id, r.at_ms, text, facts)


class Feed:
    """One job's events, read newest first at the start, then only what is new.

    Args:
        client: the Redis client.
        job_id: the job.
    """

    def __init__(self, client: Any, job_id: str) -> None:
        self._client = client
        self.job_id = job_id
        self._after: dict[str, str | None] = dict.fromkeys(KINDS)

    def _read(self, count: int) -> list[Event]:
        job, after = self.job_id, self._after

        def queue(pipe: Any) -> None:
            queue_events(pipe, job, count, after["membership"])
            queue_round_events(pipe, job, count, after["rendezvous"])
            queue_save_records(pipe, job, count, after["checkpoint"])

        def take(replies: Any) -> list[Event]:
            found = [_membership(i, e) for i, e in take_events(replies).entries]
            found += [_rendezvous(i, e) for i, e in take_round_events(replies).entries]
            found += [_checkpoint(i, r) for i, r in take_save_records(replies).entries]
            return found

        events = run_read(self._client, queue, take)
        for event in events:  # each page is newest first: keep the newest id of each source
            last = self._after[event.kind]
            if last is None or _order(event.id) > _order(last):
                self._after[event.kind] = event.id
        return sorted(events, key=lambda e: (e.ms, KINDS.index(e.kind), _order(e.id)))

    def newest(self, count: int = 20) -> list[Event]:
        """The newest ``count`` events of the job (of each source, then merged), oldest
        first; later ``new`` calls return only what comes after them."""
        return self._read(count)[-count:]

    def new(self) -> list[Event]:
        """The events recorded since the last read, oldest first."""
        return self._read(PAGE)


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)

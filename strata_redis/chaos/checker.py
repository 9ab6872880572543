"""The checker: the whole history of a fault run against the promise, one line a violation."""

from __future__ import annotations

import signal
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from .worker import FINISHED, STOPPED

__all__ = ["Report", "check"]


@dataclass
class Report:
    """What the checker found: violations (one line each), and what it looked at."""

    violations: list[str] = field(default_factory=list)
    operations: int = 0
    grants: int = 0
    completions: int = 0
    lost: bool = False  # some process stopped with a StateLostError-family error

    @property
    def ok(self) -> bool:
        return not self.violations


def check(
    events: list[dict[str, Any]],
    record: dict[int, dict[int, tuple[str, int]]] | None,
    shards: int,
    epochs: int,
    exits: dict[str, int | None],
) -> Report:
    """Check a run's history.

    Args:
        events: every process's events, in time order (``history.read_history``).
        record: the final completion record read from Redis, epoch -> shard -> (worker,
            token); None when the job's state was lost (nothing to read).
        shards, epochs: the dataset's shards per epoch, and the epochs each worker drains.
        exits: each process's exit code (None: still running at the deadline: a hang).

    The rules:
        - exactly once, or a clear error: unless some process stopped with a
          StateLostError-family error, each shard of each epoch has exactly one completion
          that reported ``recorded``, and the record in Redis agrees (its worker and token);
        - fencing by holder: a recorded completion ends a grant its process was given
          (same epoch, shard, token and grant id); within an era no token number is granted
          twice unless the state was lost (a rollback is then reported);
        - liveness: every process finished or stopped with a named error (no hang, no
          bare connection error through a fault shorter than ``redis_retry``).
    """
    report = Report(operations=len(events))
    granted: set[tuple[str, int, int, int, str]] = set()
    tokens: Counter[int] = Counter()
    recorded: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for ev in events:
        kind = ev["ev"]
        if kind == "grant":
            report.grants += 1
            granted.add((ev["who"], ev["epoch"], ev["shard"], ev["token"], ev["grant"]))
            tokens[int(ev["token"])] += 1
        elif kind == "complete":
            report.completions += 1
            # "repeat": a completion sent again after its reply was lost (recorded once)
            if ev["outcome"] in ("recorded", "repeat"):
                same = [e for e in recorded[(ev["epoch"], ev["shard"])]
                        if (e["who"], e["grant"]) == (ev["who"], ev["grant"])]  # fmt: skip
                if not same:
                    recorded[(ev["epoch"], ev["shard"])].append(ev)
                key = (ev["who"], ev["epoch"], ev["shard"], ev["token"], ev["grant"])
                if key not in granted:
                    report.violations.append(
                        f"fencing: {ev['who']} recorded epoch {ev['epoch']} shard {ev['shard']} "
                        f"under token {ev['token']}, a grant it was not given"
                    )
        elif kind == "stopped" and ev.get("family") == "state-lost":
            report.lost = True
        elif kind == "crashed":
            report.violations.append(
                f"liveness: {ev['who']} crashed with a bare {ev['error']}: {ev['message']}"
            )
    for who, code in sorted(exits.items()):
        if code is None:
            report.violations.append(f"liveness: {who} still running at the deadline (a hang)")
        elif code not in (FINISHED, STOPPED, -signal.SIGKILL):  # (SIGKILL: the schedule's)
            report.violations.append(f"liveness: {who} exited {code} (a bare traceback)")
    if report.lost:
        return report  # the run ended with a clear error: nothing more is promised
    for token, n in sorted(tokens.items()):
        if n > 1:
            report.violations.append(
                f"fencing: token {token} granted {n} times in one era with no loss reported"
            )
    for epoch in range(epochs):
        for shard in range(shards):
            done = recorded.get((epoch, shard), [])
            if len(done) != 1:
                who = ", ".join(f"{e['who']} (token {e['token']})" for e in done) or "nobody"
                report.violations.append(
                    f"exactly once: epoch {epoch} shard {shard} recorded {len(done)} times "
                    f"by {who}, with no StateLostError"
                )
                continue
            if record is None:
                continue
            held = record.get(epoch, {}).get(shard)
            ev = done[0]
            if held is None or held != (ev["who"], int(ev["token"])):
                report.violations.append(
                    f"record: epoch {epoch} shard {shard} is {held} in Redis, but "
                    f"{ev['who']} (token {ev['token']}) recorded it"
                )
    return report

"""The checker: the whole history of a fault run against the promise, one line a violation."""

from __future__ import annotations

import signal
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from strata_redis.data.sharding import DatasetParams

from .worker import DATASET, FINISHED, STOPPED

__all__ = ["Report", "check", "check_loop"]


@dataclass
class Report:
    """What the checker found: violations (one line each), and what it looked at."""

    violations: list[str] = field(default_factory=list)
    operations: int = 0
    grants: int = 0
    completions: int = 0
    batches: int = 0
    checkpoints: int = 0  # committed checkpoints verified (the loop workload)
    lost: bool = False  # some process stopped with a StateLostError-family error
    recovered: bool = False  # the documented recovery was played and checked
    stopped: Counter[str] = field(default_factory=Counter)  # named errors processes ended on

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        """What was checked, in a few words."""
        if self.batches:
            return f"batches {self.batches}, checkpoints verified {self.checkpoints}"
        return f"grants {self.grants}, completions {self.completions}"


def _ends(report: Report, events: Iterable[dict[str, Any]], exits: dict[str, int | None]) -> None:
    """The liveness rules, shared by both workloads: every process finished or stopped with
    a named error (counted in ``report.stopped``), none hung or crashed."""
    for ev in events:
        if ev["ev"] == "stopped":
            report.stopped[ev["error"]] += 1
            if ev.get("family") == "state-lost":
                report.lost = True
        elif ev["ev"] == "crashed":
            report.violations.append(
                f"liveness: {ev['who']} crashed with a bare {ev['error']}: {ev['message']}"
            )
    for who, code in sorted(exits.items()):
        if code is None:
            report.violations.append(f"liveness: {who} still running at the deadline (a hang)")
        elif code not in (FINISHED, STOPPED, -signal.SIGKILL):  # (SIGKILL: the schedule's)
            report.violations.append(f"liveness: {who} exited {code} (a bare traceback)")


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
          bare connection error through a fault shorter than ``redis_retry``); a shard
          nobody recorded is excused only in an epoch nobody drained, when a process stopped
          with a named error (an evicting policy stops the job with ``RedisConfigError``).
    """
    report = Report(operations=len(events))
    _ends(report, events, exits)
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
    if report.lost:
        return report  # the run ended with a clear error: nothing more is promised
    for token, n in sorted(tokens.items()):
        if n > 1:
            report.violations.append(
                f"fencing: token {token} granted {n} times in one era with no loss reported"
            )
    unseen = _unseen_completions(events)
    # an epoch some process drained (the lease iterator ends only when every shard is done)
    drained = {int(ev["epoch"]) for ev in events if ev["ev"] == "epoch-done"}
    for epoch in range(epochs):
        for shard in range(shards):
            done = recorded.get((epoch, shard), [])
            if not done and report.stopped and epoch not in drained:
                continue  # the job stopped with a named error before the epoch was done
            if not done and record is not None:
                held = record.get(epoch, {}).get(shard)
                if held is not None and (epoch, shard, *held) in unseen:
                    continue  # its completion applied as its process was killed (the record's)
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


def _unseen_completions(events: list[dict[str, Any]]) -> set[tuple[int, int, str, int]]:
    """The grants whose completion may have applied unseen: the process trained the shard
    and was killed before it wrote the outcome (its last event is the ``trained`` one). Such a
    completion is indeterminate (sent, or not): the record in Redis decides, and it counts as
    the shard's one completion only when the record names that grant's worker and token.
    (epoch, shard, worker, token) each."""
    last: dict[int, dict[str, Any]] = {}
    tokens: dict[tuple[int, str], int] = {}
    for ev in events:
        last[ev["pid"]] = ev
        if ev["ev"] == "grant":
            tokens[(ev["pid"], ev["grant"])] = int(ev["token"])
    return {
        (ev["epoch"], ev["shard"], ev["who"], tokens[(pid, ev["grant"])])
        for pid, ev in last.items()
        if ev["ev"] == "trained" and (pid, ev["grant"]) in tokens
    }


def _samples(
    params: DatasetParams, epoch: int, done: Iterable[int], offsets: dict[int, int]
) -> Counter[int]:
    """The samples a data position says were trained: its done shards whole, and the first
    ``offset`` samples (in the epoch's order) of each shard part-way."""
    out: Counter[int] = Counter()
    for shard in done:
        out.update(params.shard(shard, epoch).indices().tolist())
    for shard, n in offsets.items():
        out.update(params.shard(shard, epoch).indices()[:n].tolist())
    return out


def check_loop(
    events: list[dict[str, Any]],
    params: DatasetParams,
    epochs: int,
    exits: dict[str, int | None],
    checkpoints: tuple[set[str], list[str]],
    recovered: bool,
) -> Report:
    """Check a loop run's history (the README loop with checkpoints).

    Args:
        events: every process's events, in time order; the controller's ``recovery`` event
            starts the relaunch after the documented recovery.
        params: the dataset.
        exits: each process's exit code (None: a hang).
        checkpoints: the labels of the committed checkpoints after the run, and each one
            that did not verify or whose data position did not decode.
        recovered: the recovery was played.

    A fresh round (the whole job started again: the relaunch after the recovery, or a
    worker that comes back after every other one ended) resumes from the newest checkpoint:
    the model of what came after it is gone, so the promise is relative to it from then on.
    The rules, from the last resume on (from the start when there was none):

        - exactly once relative to the checkpoint kept: the samples its data position says
          were trained (each trained before the resume), plus those trained since, are
          each sample of that epoch at least once (when some process finished since), and
          never twice by processes that finished: a second copy only where a process died
          or stopped part-way through a shard (its lease ended, the shard was trained again
          from its start); each later epoch the same;
        - before it, every epoch before the resumed one was trained whole;
        - a run whose state was lost is checked only through its recovery (none played:
          nothing more is promised), and every relaunched process finishes;
        - every committed checkpoint verifies and decodes its data position, and every save
          a process saw committed is in storage; a save a process saw aborted
          (``CheckpointAbortedError``: a rank's upload failed or stalled past the commit
          timeout) is not in storage, and no process saw it committed;
        - liveness, as ``check``.
    """
    report = Report(operations=len(events), recovered=recovered)
    _ends(report, events, exits)
    labels, failures = checkpoints
    report.checkpoints = len(labels)
    report.violations += [f"checkpoint: {f}" for f in failures]
    seen: dict[str, set[str]] = defaultdict(set)  # label -> "committed", "aborted"
    for ev in events:
        if ev["ev"] == "saved" and ev["error"] is None and ev["label"] not in labels:
            report.violations.append(
                f"checkpoint: {ev['who']} saw {ev['label']} committed; it is not in storage"
            )
        if ev["ev"] == "saved" and ev["error"] in (None, "CheckpointAbortedError"):
            seen[ev["label"]].add("committed" if ev["error"] is None else "aborted")
        report.batches += ev["ev"] == "batch"
    for label, outcomes in sorted(seen.items()):
        if "aborted" not in outcomes:
            continue
        if "committed" in outcomes:
            report.violations.append(
                f"checkpoint: {label} was seen committed by one process and aborted by another"
            )
        elif label in labels:
            report.violations.append(
                f"checkpoint: {label} was aborted (CheckpointAbortedError), yet it is "
                "committed in storage"
            )
    if report.lost and not recovered:
        return report  # the job stopped with a clear error; the recovery was not played
    split = next((float(e["t"]) for e in events if e["ev"] == "recovery"), None)
    if split is not None:
        for ev in events:
            if float(ev["t"]) >= split and ev["ev"] == "stopped":
                report.violations.append(
                    f"recovery: {ev['who']} stopped with {ev['error']} after the recovery"
                )
    # the lineage of the model kept: from the last resume (its earliest event), or from the
    # recovery when the relaunch resumed none
    resumes = [e for e in events if e["ev"] == "resumed"]
    start, first = (split if split is not None else float("-inf")), 0
    kept: Counter[int] = Counter()
    if resumes and (split is None or float(resumes[-1]["t"]) >= split):
        label, first, done, offsets = _resumed(resumes[-1])
        start = min(float(e["t"]) for e in resumes if e["label"] == label)
        kept = _samples(params, first, done, dict(offsets))
        trained = _trained(e for e in events if float(e["t"]) < start)
        untrained = set(kept) - set(trained.get(first, ()))
        if untrained:
            report.violations.append(
                f"resume: {label}'s data position says {len(untrained)} samples of epoch "
                f"{first} were trained that nobody trained before it"
            )
        for epoch in range(first):
            missing = set(range(params.total_samples)) - set(trained.get(epoch, ()))
            if missing:
                report.violations.append(
                    f"exactly once: epoch {epoch} (before the checkpoint kept) never trained "
                    f"{len(missing)} samples"
                )
    since = [e for e in events if float(e["t"]) >= start]
    _lineage_rules(report, since, params, range(first, epochs), first, kept)
    return report


def _lineage_rules(
    report: Report,
    events: list[dict[str, Any]],
    params: DatasetParams,
    epochs: range,
    first: int,
    kept: Counter[int],
) -> None:
    """``check_loop``'s rules for the events since the lineage started (``kept``: the
    samples of epoch ``first`` the resumed checkpoint's data position covers)."""
    finished = {(e["who"], e["pid"]) for e in events if e["ev"] == "finished"}
    trained = _trained(events)
    by_finished = _trained(e for e in events if (e["who"], e["pid"]) in finished)
    for epoch in epochs:
        base: Counter[int] = kept if epoch == first else Counter()
        got: Counter[int] = trained.get(epoch, Counter()) + base
        missing = set(range(params.total_samples)) - set(got)
        if missing and finished:
            report.violations.append(
                f"exactly once: epoch {epoch}: {len(missing)} samples never trained "
                f"(e.g. {sorted(missing)[:5]}), relative to the checkpoint kept"
            )
        mine: Counter[int] = by_finished.get(epoch, Counter()) + base
        twice = sorted(s for s, n in mine.items() if n > 1)
        if twice:
            report.violations.append(
                f"exactly once: epoch {epoch}: {len(twice)} samples trained twice by "
                f"processes that finished (e.g. {twice[:5]}), relative to the checkpoint kept"
            )


def _resumed(ev: dict[str, Any]) -> tuple[Any, ...]:
    """A resumed event as a hashable (label, epoch, done shards, offsets)."""
    epoch, done, offsets = ev["positions"][DATASET]
    return (ev["label"], int(epoch), tuple(done),
            tuple(sorted((int(s), int(n)) for s, n in offsets.items())))  # fmt: skip


def _trained(events: Iterable[dict[str, Any]]) -> dict[int, Counter[int]]:
    """epoch -> how many times each sample was trained, from the batch events."""
    out: dict[int, Counter[int]] = defaultdict(Counter)
    for ev in events:
        if ev["ev"] == "batch":
            out[int(ev["epoch"])].update(ev["samples"])
    return out

"""The fault checker's checkpoint rules on hand-made histories: a save a process saw aborted
must not be committed (in storage, or by another process's account); and the lease rules' case
of a completion in flight when its process was killed."""

from __future__ import annotations

from typing import Any

from strata_redis.chaos.checker import check, check_loop
from strata_redis.data.sharding import DatasetParams

PARAMS = DatasetParams("ds", 20, 5)


def _saved(who: str, label: str, error: str | None, t: float) -> dict[str, Any]:
    return {"ev": "saved", "who": who, "pid": 1, "t": t, "label": label, "error": error}


def _violations(events: list[dict[str, Any]], stored: set[str]) -> list[str]:
    report = check_loop(events, PARAMS, 1, {}, (stored, []), recovered=False)
    return [v for v in report.violations if v.startswith("checkpoint")]


def test_a_save_aborted_and_not_in_storage_is_no_violation() -> None:
    events = [_saved("w0", "epoch_0_step_8", "CheckpointAbortedError", 1.0),
              _saved("w1", "epoch_0_step_8", "StorageError", 1.1)]  # fmt: skip
    assert _violations(events, {"epoch_0_step_0"}) == []


def test_a_save_aborted_yet_committed_in_storage_is_a_violation() -> None:
    events = [_saved("w0", "epoch_0_step_8", "CheckpointAbortedError", 1.0)]
    found = _violations(events, {"epoch_0_step_8"})
    assert len(found) == 1 and "aborted" in found[0] and "epoch_0_step_8" in found[0]


def test_a_save_seen_committed_and_aborted_is_a_violation() -> None:
    events = [_saved("w0", "epoch_0_step_8", None, 1.0),
              _saved("w1", "epoch_0_step_8", "CheckpointAbortedError", 1.1)]  # fmt: skip
    found = _violations(events, {"epoch_0_step_8"})
    assert len(found) == 1 and "committed by one process and aborted by another" in found[0]


# -- the lease rules: a completion in flight when its process was killed -------------------------
def _lease_run(last_of_w2: str) -> list[dict[str, Any]]:
    """w1 drains shards 0-2 of one epoch of 4; w2 is granted shard 3, trains it and is killed:
    before it logs the outcome (``last_of_w2`` "trained"), or after it did ("complete")."""
    events: list[dict[str, Any]] = []
    t = 0.0
    for shard in range(3):
        grant = {"who": "w1", "pid": 1, "epoch": 0, "shard": shard, "token": shard + 1,
                 "grant": f"g{shard}"}  # fmt: skip
        events += [
            {**grant, "ev": "grant", "t": (t := t + 1)},
            {**grant, "ev": "trained", "t": (t := t + 1)},
            {**grant, "ev": "complete", "outcome": "recorded", "t": (t := t + 1)},
        ]
    w2 = {"who": "w2", "pid": 2, "epoch": 0, "shard": 3, "token": 9, "grant": "g3"}
    events += [{**w2, "ev": "grant", "t": 0.5}, {**w2, "ev": "trained", "t": 0.6}]
    if last_of_w2 == "complete":
        events.append({**w2, "ev": "complete", "outcome": "recorded", "t": 0.7})
    events.append({"ev": "epoch-done", "who": "w1", "pid": 1, "t": t + 1, "epoch": 0})
    return sorted(events, key=lambda e: e["t"])


def _lease_violations(events: list[dict[str, Any]], held: tuple[str, int] | None) -> list[str]:
    record = {0: {s: ("w1", s + 1) for s in range(3)}}
    if held is not None:
        record[0][3] = held
    return check(events, record, 4, 1, {"w1": 0, "w2": -9}).violations


def test_a_completion_applied_as_its_process_was_killed_counts_once_by_the_record() -> None:
    # killed between Redis applying the completion and the history's line: the record decides
    assert _lease_violations(_lease_run("trained"), ("w2", 9)) == []


def test_a_completion_the_record_does_not_hold_is_still_a_violation() -> None:
    found = _lease_violations(_lease_run("trained"), None)
    assert len(found) == 1 and "shard 3 recorded 0 times by nobody" in found[0], found
    found = _lease_violations(_lease_run("trained"), ("w2", 8))  # another token: not its grant
    assert len(found) == 1 and "shard 3 recorded 0 times" in found[0], found


def test_a_completion_seen_recorded_is_counted_as_before() -> None:
    assert _lease_violations(_lease_run("complete"), ("w2", 9)) == []

"""The fault checker's checkpoint rules on hand-made histories: a save a process saw aborted
must not be committed (in storage, or by another process's account)."""

from __future__ import annotations

from typing import Any

from strata_redis.chaos.checker import check_loop
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

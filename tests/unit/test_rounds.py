"""``RoundCheckpoints`` (``checkpoint/rounds.py``) through a fake storage, a fake manager and
a Redis-shaped fake for the round's announcements (plain sorted-set commands, no script):
checkpoint ids from the loop's steps, a joiner's base, fill-ins, and ``loop_parts``."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from strata_redis.checkpoint.ids import MAX_NUMBER, CheckpointId
from strata_redis.checkpoint.rounds import RoundCheckpoints, loop_parts

from .fakes import MemoryStorage, fake_context

POS = ("strata-position.json", b"{}")


class FakeManager:
    """What ``RoundCheckpoints`` asks of a round's manager: saves, recorded."""

    def __init__(self, refuse: set[CheckpointId] | None = None) -> None:
        self.saved: list[tuple[CheckpointId, dict[str, Any]]] = []
        self.refuse = refuse or set()

    def save(self, parts: dict[str, Any], *, step: int, epoch: int | None, run: int
             ) -> Future[None]:  # fmt: skip
        cid = CheckpointId(step, epoch, run)
        if cid in self.refuse:
            raise ValueError(f"refused {cid}")
        self.saved.append((cid, parts))
        return Future()


def rounds(run: int = 0, **kw: Any) -> RoundCheckpoints:
    rc = RoundCheckpoints(fake_context(), MemoryStorage(), **kw)  # type: ignore[arg-type]
    rc.run = run
    rc.manager = FakeManager()  # type: ignore[assignment]
    return rc


# -- checkpoint ids from the loop's (epoch, step) ---------------------------------------------
def test_checkpoint_is_the_loops_step_in_this_run() -> None:
    rc = rounds(run=2)
    assert rc.checkpoint(10, 1) == CheckpointId(10, 1, 2)


def test_checkpoint_not_after_the_last_one_is_none() -> None:
    rc = rounds()
    rc.last = CheckpointId(10, 1)
    assert rc.checkpoint(10, 1) is None
    assert rc.checkpoint(5, 1) is None
    assert rc.checkpoint(99, 0) is None
    assert rc.checkpoint(11, 1) == CheckpointId(11, 1)
    assert rc.checkpoint(0, 2) == CheckpointId(0, 2)


def test_a_joiner_counts_from_the_base_in_its_epoch_only() -> None:
    rc = rounds()
    rc.base = rc.last = CheckpointId(300, 4)
    assert rc.checkpoint(0, 4) is None  # its step 0 is the base, saved by the others
    assert rc.checkpoint(100, 4) == CheckpointId(400, 4)
    assert rc.checkpoint(100, 5) == CheckpointId(100, 5)  # the next epoch counts from 0


def test_a_step_past_max_number_from_the_base_is_refused() -> None:
    rc = rounds()
    rc.base = CheckpointId(MAX_NUMBER, 1)
    with pytest.raises(ValueError, match="step must be between 0 and"):
        rc.checkpoint(1, 1)


# -- announcements and fill-ins ----------------------------------------------------------------
def test_missed_lists_this_runs_checkpoints_after_the_last_of_the_finished_epoch() -> None:
    rc = rounds(run=1)
    rc.last = CheckpointId(20, 3, 1)
    for cid, epoch in [
        (CheckpointId(10, 3, 1), 3),  # before this worker's last
        (CheckpointId(40, 3, 1), 3),
        (CheckpointId(30, 3, 1), 3),
        (CheckpointId(50, 3, 0), 3),  # another run's
        (CheckpointId(5, 4, 1), 4),  # opened in a later epoch: not yet
        (CheckpointId(1, 2, 1), 2),  # an older epoch: trimmed
    ]:
        rc.announce(7, cid, epoch)
    rc.context.client.zadd(rc.context.keys.round_checkpoints(7), {"not-a-member": 3})
    assert rc.missed(7, 3) == [CheckpointId(30, 3, 1), CheckpointId(40, 3, 1)]
    left = rc.context.client.zrange(rc.context.keys.round_checkpoints(7), 0, -1)
    assert CheckpointId(1, 2, 1).member not in left  # epochs before the finished one go
    assert CheckpointId(5, 4, 1).member in left


def test_fill_saves_the_last_parts_for_each_missed_checkpoint() -> None:
    rc = rounds()
    first = CheckpointId(1, 0)
    rc.save(3, first, 0, {"model.bin": b"m", POS[0]: POS[1]})
    others = [CheckpointId(2, 0), CheckpointId(3, 0)]
    for cid in others:
        rc.announce(3, cid, 0)
    rc.fill(3, 0, lambda cid: POS)
    manager = rc.manager
    assert isinstance(manager, FakeManager)
    assert [c for c, _ in manager.saved] == [first, *others]
    assert all(parts["model.bin"] == b"m" for _, parts in manager.saved)
    assert rc.last == others[-1]
    rc.fill(3, 0, lambda cid: POS)  # nothing after the last one now
    assert len(manager.saved) == 3


def test_fill_takes_the_providers_state_and_the_position_per_checkpoint() -> None:
    rc = rounds(state_provider=lambda: {"w.bin": b"now"})
    rc.announce(1, CheckpointId(9, 2), 2)
    rc.fill(1, 2, lambda cid: ("strata-position.json", str(cid.step).encode()))
    manager = rc.manager
    assert isinstance(manager, FakeManager)
    ((cid, parts),) = manager.saved
    assert cid == CheckpointId(9, 2)
    assert parts == {"w.bin": b"now", "strata-position.json": b"9"}


def test_a_refused_fill_in_is_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    rc = rounds()
    bad, good = CheckpointId(2, 0), CheckpointId(3, 0)
    rc.manager = FakeManager(refuse={bad})  # type: ignore[assignment]
    for cid in (bad, good):
        rc.announce(1, cid, 0)
    rc.fill(1, 0, lambda cid: POS)
    assert [c for c, _ in rc.manager.saved] == [good]  # type: ignore[attr-defined]
    assert "could not fill checkpoint (epoch 0, step 2): refused" in caplog.text


# -- loop_parts ---------------------------------------------------------------------------------
def test_loop_parts_of_one_buffer_a_mapping_and_none() -> None:
    assert loop_parts(b"abc", POS) == {"model.bin": b"abc", POS[0]: POS[1]}
    arr = np.arange(3, dtype=np.int32)
    parts = loop_parts({"a.bin": arr, "b.bin": bytearray(b"z")}, POS)
    assert parts["a.bin"] == arr.tobytes() and parts["b.bin"] == b"z"
    assert type(parts["b.bin"]) is bytes  # a copy the caller may keep
    assert loop_parts(None, POS) == {POS[0]: POS[1]}


def test_loop_parts_keeps_bytes_without_a_copy() -> None:
    data = b"x" * 100
    assert loop_parts(data, POS)["model.bin"] is data


@pytest.mark.parametrize(
    ("state", "error", "match"),
    [
        ({POS[0]: b"x"}, ValueError, "must not have a part named"),
        ({"metadata.json": b"x"}, ValueError, "reserved for the step's metadata"),
        ({"rank_0/m": b"x"}, ValueError, "rank_<N> directory"),
        ({"/abs": b"x"}, ValueError, "absolute paths are refused"),
        ("text", TypeError, "got str"),
        (np.array([object()]), TypeError, "must hold plain data"),
    ],
)
def test_loop_parts_refuses(state: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        loop_parts(state, POS)

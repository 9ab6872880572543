"""Checkpoint ids (``checkpoint/ids.py``): order, labels and index members, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from strata_redis.checkpoint.ids import MAX_NUMBER, CheckpointId

numbers = st.integers(0, MAX_NUMBER)
ids = st.builds(CheckpointId, numbers, st.none() | numbers, numbers)


@given(ids)
def test_label_round_trips(cid: CheckpointId) -> None:
    assert CheckpointId.from_label(cid.label) == cid


@given(ids)
def test_member_round_trips(cid: CheckpointId) -> None:
    assert CheckpointId.from_member(cid.member) == cid
    assert len(cid.member) == 16 * 3 + 2 - (15 if cid.epoch is None else 0)


@given(ids, ids)
def test_member_bytes_sort_as_the_ids(a: CheckpointId, b: CheckpointId) -> None:
    # the Redis index sorts members by bytes (every score 0): its order must be the ids'
    assert (a.member < b.member) == (a < b)
    assert (a.member == b.member) == (a == b)


@given(ids, ids)
def test_order_is_run_then_epoch_then_step(a: CheckpointId, b: CheckpointId) -> None:
    key = lambda c: (c.run, -1 if c.epoch is None else c.epoch, c.step)  # noqa: E731
    assert (a < b) == (key(a) < key(b)) and (a <= b) == (key(a) <= key(b))
    assert (a > b) == (key(a) > key(b)) and (a >= b) == (key(a) >= key(b))


@pytest.mark.parametrize(
    ("cid", "label", "text"),
    [
        (CheckpointId(200), "step_200", "(step 200)"),
        (CheckpointId(200, 1), "epoch_1_step_200", "(epoch 1, step 200)"),
        (CheckpointId(5, None, 2), "run_2_step_5", "(run 2, step 5)"),
        (CheckpointId(5, 0, 3), "run_3_epoch_0_step_5", "(run 3, epoch 0, step 5)"),
    ],
)
def test_labels_and_text(cid: CheckpointId, label: str, text: str) -> None:
    assert cid.label == label and str(cid) == text
    assert cid.as_dict() == {"run": cid.run, "epoch": cid.epoch, "step": cid.step, "label": label}


def test_an_epoch_of_none_comes_before_epoch_zero() -> None:
    assert CheckpointId(999) < CheckpointId(0, 0) < CheckpointId(0, 0, 1)


@pytest.mark.parametrize(
    "label",
    ["", "step_", "step_01", "run_0_step_1", "epoch_1", "step_1_epoch_1", "epoch_-1_step_1",
     "step_99999999999999999", "step_9007199254740993", "Step_1", "step_1/x"],
)  # fmt: skip
def test_not_labels(label: str) -> None:
    assert CheckpointId.from_label(label) is None


@pytest.mark.parametrize(
    "member",
    ["", "1:2:3", "0000000000000001:-:000000000000000x", "0000000000000000:-:-",
     "0000000000000000::0000000000000001"],
)  # fmt: skip
def test_not_members(member: str) -> None:
    with pytest.raises(ValueError, match="not a checkpoint index member"):
        CheckpointId.from_member(member)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"step": -1}, ValueError), ({"step": MAX_NUMBER + 1}, ValueError),
     ({"step": 1, "epoch": -1}, ValueError), ({"step": 1, "run": -1}, ValueError),
     ({"step": True}, TypeError), ({"step": 1.0}, TypeError)],
)  # fmt: skip
def test_numbers_are_checked(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        CheckpointId(**kwargs)  # type: ignore[arg-type]


def test_matches() -> None:
    cid = CheckpointId(10, 2, 1)
    assert cid.matches(10, 2, 1) and cid.matches(None, None) and cid.matches(10, None, None)
    assert not cid.matches(10, 2, 0) and not cid.matches(11, None)

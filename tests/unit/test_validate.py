"""Argument checks (``validate.py``)."""

from __future__ import annotations

import math

import pytest

from strata_redis.validate import MAX_ID_LENGTH, check_id, check_int, check_seconds


@pytest.mark.parametrize("value", ["a", "worker 1", "ü-{x}:7", "x" * MAX_ID_LENGTH])
def test_good_ids(value: str) -> None:
    assert check_id("id", value) == value


@pytest.mark.parametrize(
    ("value", "job", "error", "match"),
    [(1, False, TypeError, "id must be a str"), ("", False, ValueError, "must not be empty"),
     ("x" * (MAX_ID_LENGTH + 1), False, ValueError, "at most 128"),
     ("a\nb", False, ValueError, "printable"), (" a", False, ValueError, "whitespace"),
     ("a{b", True, ValueError, "hash tag")],
)  # fmt: skip
def test_bad_ids(value: object, job: bool, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        check_id("id", value, job=job)


def test_braces_are_fine_outside_job_ids() -> None:
    assert check_id("worker", "a{b}") == "a{b}"


@pytest.mark.parametrize(("value", "ok"), [(0, True), (10, True), (-1, False), (11, False)])
def test_check_int_bounds_are_inclusive(value: int, ok: bool) -> None:
    if ok:
        assert check_int("n", value, low=0, high=10) == value
    else:
        with pytest.raises(ValueError, match="n must be between 0 and 10"):
            check_int("n", value, low=0, high=10)


@pytest.mark.parametrize("value", [True, 1.0, "1", None])
def test_check_int_types(value: object) -> None:
    with pytest.raises(TypeError, match="n must be an int"):
        check_int("n", value, low=0, high=10)


@pytest.mark.parametrize("value", [0, -1, math.inf, math.nan, 11])
def test_check_seconds_refuses(value: float) -> None:
    with pytest.raises(ValueError, match=r"finite number of seconds in \(0, 10"):
        check_seconds("t", value, high=10)


def test_check_seconds_accepts_ints_and_floats() -> None:
    assert check_seconds("t", 10, high=10) == 10.0 and check_seconds("t", 0.001, high=1) == 0.001
    with pytest.raises(TypeError, match="number of seconds"):
        check_seconds("t", True, high=10)

"""The era key's marks (``era.py`` reads them; ``errors.py`` only formats what it is given)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from strata_redis import era
from strata_redis.errors import JobLayoutError, StateLostError, StateRolledBackError

ERA = "0123456789abcdef.v3"


def test_a_rollback_mark_gives_the_clocks_it_records() -> None:
    exc = era.lost_error("j", ERA, f"{ERA}!rolled-back:7<12")
    assert isinstance(exc, StateRolledBackError)
    assert (exc.clock, exc.seen, exc.found) == (7, 12, f"{ERA}!rolled-back:7<12")
    assert "5 script calls behind the 12" in str(exc)


def test_a_diverged_rollback_mark_says_the_history_is_another() -> None:
    exc = era.lost_error("j", ERA, f"{ERA}!rolled-back:40~12")
    assert isinstance(exc, StateRolledBackError)
    assert (exc.clock, exc.seen) == (40, 12)
    assert "history at tick 12" in str(exc)


def test_a_rollback_mark_without_clocks_still_is_a_rollback() -> None:
    exc = era.lost_error("j", ERA, f"{ERA}!rolled-back:?")
    assert isinstance(exc, StateRolledBackError)
    assert (exc.clock, exc.seen) == (None, None)


def test_a_lost_mark_names_the_key() -> None:
    exc = era.lost_error("j", ERA, f"{ERA}!lost:epoch")
    assert type(exc) is StateLostError
    assert "its epoch key (strata:{j}:epoch) is gone" in str(exc)


@pytest.mark.parametrize(
    ("found", "what"),
    [(None, "Redis holds no state for it now"), ("fedcba9876543210.v3", "started again")],
)
def test_no_era_or_another_era_is_a_loss(found: str | None, what: str) -> None:
    exc = era.lost_error("j", ERA, found)
    assert type(exc) is StateLostError and exc.found == found
    assert what in str(exc)


def test_marked_and_layout_read_past_the_marks() -> None:
    assert not era.marked(ERA)
    assert era.marked(f"{ERA}!lost:fence") and era.marked(f"{ERA}!rolled-back:1<2")
    assert era.layout_of(f"{ERA}!rolled-back:1<2") == 3
    assert isinstance(JobLayoutError.made("j", ERA, 3, 4), StateLostError)


def test_errors_parse_no_era() -> None:
    # one owner of the era key's format: the error classes take its pieces from era.py
    text = (Path(era.__file__).parent / "errors.py").read_text()
    assert not re.search(r"rolled-back:|!lost:|\.partition\(|\.split\(", text)

"""Rendezvous decisions on this side of the scripts (``coordination/rendezvous.py``): the
limits' checks, ``RoundWatch``'s decisions through a fake ``Rendezvous``, and the event
parser. (The rounds themselves are decided in Lua: tests/test_rendezvous.py.)"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from strata_redis.coordination.rendezvous import Rendezvous, RoundWatch, take_round_events
from strata_redis.errors import RoundBrokenError

from .fakes import JOB, make_round


class FakeRendezvous:
    """``check`` raises ``broken`` when set, and counts its calls."""

    def __init__(self) -> None:
        self.checks = 0
        self.broken: Exception | None = None

    def check(self, round_: Any) -> None:
        self.checks += 1
        if self.broken is not None:
            raise self.broken


def watch() -> tuple[RoundWatch, FakeRendezvous, list[Any], threading.Event]:
    rdzv, woken, done = FakeRendezvous(), [], threading.Event()

    def on_broken(round_: Any, exc: RoundBrokenError) -> None:
        woken.append((round_.number, exc))
        done.set()

    return RoundWatch(rdzv, "w0", on_broken), rdzv, woken, done  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"min_workers": 0}, "min_workers must be between 1"),
     ({"min_workers": 3, "max_workers": 2}, "max_workers must be at least min_workers \\(3\\)"),
     ({"last_call": 0}, "last_call must be a finite number"),
     ({"timeout": -1}, "timeout must be a finite number"),
     ({"max_restarts": -1}, "max_restarts must be between 0")],
)  # fmt: skip
def test_rendezvous_limits(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Rendezvous(object(), **kwargs)  # type: ignore[arg-type]


def test_rendezvous_defaults() -> None:
    r = Rendezvous(object())  # type: ignore[arg-type]
    assert (r.min_workers, r.max_workers, r.max_restarts) == (1, 100_000, None)


def test_the_same_generation_is_not_checked_again() -> None:
    w, rdzv, _, _ = watch()
    w.on_generation(5)
    assert rdzv.checks == 0  # nothing watched yet
    w.watch(make_round(("w0", "w1"), "w0", 3))  # generation 3
    w.on_generation(3)
    assert rdzv.checks == 0
    w.on_generation(4)
    w.on_generation(4)
    assert rdzv.checks == 1 and w.broken is None and w.pending() is None


def test_a_broken_round_is_flagged_once_and_its_waiters_woken() -> None:
    w, rdzv, woken, done = watch()
    round_ = make_round(("w0", "w1"), "w0", 2)
    w.watch(round_)
    rdzv.broken = RoundBrokenError.because(JOB, 2, "w1", "failed")
    w.on_generation(9)
    assert done.wait(5)
    assert w.pending() is rdzv.broken and woken == [(2, rdzv.broken)]
    w.on_generation(10)  # flagged already: no more checks
    assert rdzv.checks == 1


def test_a_failed_check_is_logged_and_the_heartbeat_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w, rdzv, woken, _ = watch()
    w.watch(make_round(("w0",), "w0", 1))
    rdzv.broken = ConnectionError("redis went away")
    w.on_generation(2)
    assert w.broken is None and woken == [] and "round check failed" in caplog.text


def test_a_break_of_a_round_already_left_is_dropped() -> None:
    w, _, _, _ = watch()
    old = make_round(("w0", "w1"), "w0", 1)
    w.watch(old)
    w.flag(old, RoundBrokenError.because(JOB, 1, "w1", "left"))
    assert w.pending() is not None
    w.watch(make_round(("w0",), "w0", 2))  # joined the next round: whole
    assert w.pending() is None
    w.flag(old, RoundBrokenError.because(JOB, 1, "w1", "left"))  # not the watched round
    assert w.broken is None


def test_superseded_rounds_say_so() -> None:
    exc = RoundBrokenError.because(JOB, 4, "", "superseded")
    assert "superseded by a newer round" in str(exc) and exc.round == 4


def test_round_events_parse() -> None:
    page = take_round_events(iter([[
        ("1700-0", {"type": "close", "round": "3", "ms": "1700.0", "world_size": "2"}),
        ("1800-0", {"type": "end"}),
    ], 2]))  # fmt: skip
    (_, close), (_, end) = page.entries
    assert (close.type, close.round, close.ms, close.detail) == ("close", 3, 1700, {
        "world_size": "2"})  # fmt: skip
    assert (end.round, end.ms) == (None, 1800)  # no ms field: the entry id's
    assert page.length == 2

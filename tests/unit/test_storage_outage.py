"""``storage.outage.retrying``: a read sent again while the storage fails, not when an object
is missing, and the storage's error once the wait is over."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from strata_redis.errors import StorageError, StorageNotFoundError
from strata_redis.storage import outage


class Flaky:
    """A read that fails ``failures`` times with ``error``, then returns b"ok"."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def read(self, path: str) -> bytes:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return b"ok:" + path.encode()


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pauses of this test's thread, recorded, not slept. (``outage.time`` is the
    ``time`` module: a thread another test left behind sleeps for real, not recorded — it
    spun, recording its pauses here, once.)"""
    slept: list[float] = []
    me, real = threading.get_ident(), time.sleep

    def sleep(seconds: float) -> None:
        if threading.get_ident() == me:
            slept.append(seconds)
        else:
            real(seconds)

    monkeypatch.setattr(outage.time, "sleep", sleep)
    return slept


def test_a_read_is_sent_again_until_the_storage_answers(
    no_sleep: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    flaky = Flaky(5, StorageError("refused", path="p", backend="s3://b"))
    with caplog.at_level(logging.WARNING, logger="strata_redis.storage"):
        assert outage.retrying("resume", 60, flaky.read, "x") == b"ok:x"
    assert flaky.calls == 6
    assert no_sleep == [0.1, 0.2, 0.4, 0.8, 1.6]  # doubling (up to MAX_PAUSE_S)
    assert [r.getMessage().split(": ", 1)[0] for r in caplog.records] == ["resume", "resume"]
    assert "after 5 failure(s)" in caplog.records[-1].getMessage()


def test_a_missing_object_is_an_answer_not_an_outage(no_sleep: list[float]) -> None:
    flaky = Flaky(1, StorageNotFoundError("gone", path="p", backend="s3://b"))
    with pytest.raises(StorageNotFoundError):
        outage.retrying("resume", 60, flaky.read, "x")
    assert flaky.calls == 1 and no_sleep == []


def test_past_the_wait_the_storage_error_is_raised(
    no_sleep: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(outage.time, "monotonic", lambda: now[0])
    no_sleep_advance = no_sleep.append

    def sleep(s: float) -> None:
        no_sleep_advance(s)
        now[0] += s

    monkeypatch.setattr(outage.time, "sleep", sleep)
    flaky = Flaky(10**6, StorageError("refused", path="p", backend="s3://b"))
    with pytest.raises(StorageError, match="refused"):
        outage.retrying("resume", 5.0, flaky.read, "x")
    # 0.1 + ... + 1.6 = 3.1 s slept; the next pause (2 s) would end past the 5 s wait
    assert no_sleep == [0.1, 0.2, 0.4, 0.8, 1.6] and flaky.calls == 6

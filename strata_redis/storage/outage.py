"""Riding out a short storage outage: a read sent again while the storage fails.

A storage backend already retries a request a few times (botocore's standard mode: 5
attempts within seconds); an S3 endpoint or a mounted filesystem that is away for longer
than that makes the request fail with ``StorageError``. What must not fail on such an
outage (a fresh round reading the checkpoint it resumes from) calls ``retrying``: the call is
sent again, with pauses doubling from 0.1 s to 2 s, until it succeeds or ``wait`` seconds
have passed since the first failure; then the storage's last error is raised. A missing
object (``StorageNotFoundError``) is an answer, not an outage: it passes through at once.
One WARNING is logged when the outage starts and one when it ends.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Final, ParamSpec, TypeVar

from ..errors import StorageError, StorageNotFoundError

__all__ = ["retry_call", "retrying"]

log = logging.getLogger("strata_redis.storage")

#: the first pause after a failure, and the longest (pauses double in between)
FIRST_PAUSE_S: Final = 0.1
MAX_PAUSE_S: Final = 2.0

P = ParamSpec("P")
T = TypeVar("T")


def retrying(
    what: str,
    wait: float,
    fn: Callable[P, T],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """``fn(*args, **kwargs)``, sent again while it fails with ``StorageError`` (not
    ``StorageNotFoundError``) for up to ``wait`` seconds; ``what`` names the call in the log.

    Raises:
        StorageError: the storage still failed ``wait`` seconds after its first failure.
    """
    return retry_call(what, wait, functools.partial(fn, *args, **kwargs))


def retry_call(
    what: str,
    wait: float,
    call: Callable[[], T],
    *,
    on_retry: Callable[[], None] | None = None,
    give_up: Callable[[], bool] | None = None,
) -> T:
    """``retrying`` for a call without arguments, with two hooks: ``on_retry`` runs before
    each pause (a counter of retries), and ``give_up`` is asked before each pause whether to
    raise the storage's error at once (the caller is closing).

    Raises:
        StorageError: the storage still failed ``wait`` seconds after its first failure, or
            ``give_up`` said so.
    """
    deadline: float | None = None
    pause = FIRST_PAUSE_S
    failures = 0
    while True:
        try:
            result = call()
        except StorageNotFoundError:
            raise
        except StorageError as exc:
            now = time.monotonic()
            if deadline is None:
                deadline = now + wait
                if wait <= 0:
                    raise
                log.warning("%s: the storage failed (%s); trying again for up to %.0f s",
                            what, exc, wait)  # fmt: skip
            failures += 1
            if now + pause > deadline or (give_up is not None and give_up()):
                raise
            if on_retry is not None:
                on_retry()
            time.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE_S)
            continue
        if failures:
            log.warning("%s: the storage answered again after %d failure(s)", what, failures)
        return result

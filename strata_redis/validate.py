"""Argument checks at the API boundary: ids, names and numbers.

Ids (job ids, worker ids, barrier and dataset names) are 1 to 128 characters of printable
text: letters of any script, digits, punctuation including ``{``, ``}`` and ``:``, and
inner spaces. Refused: control characters, leading or trailing whitespace, and, in a job id
only, ``{`` and ``}`` (the job id is the Redis Cluster hash tag, which a brace would cut).
Every other id sits at the end of its key, after the hash tag, so it cannot break the schema.
"""

from __future__ import annotations

import math

MAX_ID_LENGTH = 128


def check_id(arg: str, value: object, *, job: bool = False) -> str:
    """Return ``value`` if it is a valid id, else raise naming ``arg``.

    Raises:
        TypeError: not a ``str``.
        ValueError: empty, too long, control characters, edge whitespace, or braces in a job id.
    """
    if not isinstance(value, str):
        raise TypeError(f"{arg} must be a str, got {type(value).__name__} {value!r}")
    if not value:
        raise ValueError(f"{arg} must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise ValueError(f"{arg} must be at most {MAX_ID_LENGTH} characters, got {len(value)}")
    if not value.isprintable():
        raise ValueError(f"{arg} must be printable text without control characters, got {value!r}")
    if value != value.strip():
        raise ValueError(f"{arg} must not start or end with whitespace, got {value!r}")
    if job and ("{" in value or "}" in value):
        raise ValueError(
            f"{arg} must not contain '{{' or '}}' (it is the Redis Cluster hash tag), got {value!r}"
        )
    return value


def check_int(arg: str, value: object, *, low: int, high: int) -> int:
    """Return ``value`` if it is an int (not a bool) within ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{arg} must be an int, got {type(value).__name__} {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{arg} must be between {low} and {high}, got {value}")
    return value


def check_seconds(arg: str, value: object, *, high: float) -> float:
    """Return ``value`` as a float if it is a finite number of seconds in ``(0, high]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{arg} must be a number of seconds, got {type(value).__name__} {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or not 0 < seconds <= high:
        raise ValueError(f"{arg} must be a finite number of seconds in (0, {high}], got {value!r}")
    return seconds

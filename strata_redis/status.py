"""The Lua contract's status codes: one Python enum, composed into every script as a prelude.

Scripts cannot ``require`` a shared file, so ``prelude()`` renders these enums as Lua tables
(``S.LEASE_LOST``, ``A.NOTHING``) and ``scripts`` puts them in front of each script's first
line when it loads it (on that line, so Lua's line numbers in errors stay the file's). No
bare number stands for a status in Python or Lua.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ERA_CHECK", "Acquire", "Status", "prelude"]


class Status(IntEnum):
    """The first element of every script's reply: 0 for success, else why it refused.

    ``errors.from_status`` maps each to its exception.
    """

    OK = 0
    # 1-9: the worker registry
    WORKER_NOT_REGISTERED = 1
    WORKER_FAILED = 3
    WORKER_LEFT = 4
    WORKER_EXISTS = 5
    WORKER_REPLACED = 6
    # 10-19: barriers
    BARRIER_MOVED = 10
    BARRIER_MISMATCH = 11
    # 20-29: shard leases
    LEASE_LOST = 20
    EPOCH_MISMATCH = 22
    # 30-39: datasets
    DATASET_CONFLICT = 30
    # 40-49: checkpoints
    STEP_NOT_FORWARD = 40
    STEP_ABORTED = 41
    STEP_MISMATCH = 42
    RANK_NOT_HELD = 43
    STEP_COMMITTED = 44
    STEP_COMMITTING = 45
    # 50-59: the elastic rendezvous
    ROUND_MOVED = 50
    ROUND_BROKEN = 51
    RENDEZVOUS_ENDED = 52
    # 60-69: the job's era (``era.py``): every script checks it first
    STATE_LOST = 60


class Acquire(IntEnum):
    """What ``acquire_shard`` says in place of a shard id when it leased none."""

    NOTHING = -1  # nothing to lease now (the reply carries the epoch's progress)
    NO_POOL = -2  # the epoch's pool does not exist (init_epoch creates it)
    REFUSED = -3  # the worker may not lease (the reply carries its Status)


#: the era check in front of every script (one line): the caller appends the era key to
#: KEYS and the era it works in to ARGV; a script reads ``NKEYS``/``NARGV`` for its own
#: counts. A missing or other era answers ``{S.STATE_LOST, stored era or ""}`` before the
#: script touches anything.
ERA_CHECK = (
    "local NKEYS, NARGV = #KEYS - 1, #ARGV - 1 "
    "local ERA_NOW = redis.call('GET', KEYS[#KEYS]) "
    "if ERA_NOW ~= ARGV[#ARGV] then return {S.STATE_LOST, ERA_NOW or ''} end "
)


def prelude() -> str:
    """The enums as Lua tables and the era check, on one line: ``local S = {...} ...``."""
    tables = []
    for var, enum in (("S", Status), ("A", Acquire)):
        fields = ", ".join(f"{m.name} = {m.value}" for m in enum)
        tables.append(f"local {var} = {{{fields}}}")
    return " ".join(tables) + " " + ERA_CHECK

"""The Lua contract's status codes: one Python enum, composed into every script as a prelude.

Scripts cannot ``require`` a shared file, so ``prelude()`` renders these enums as Lua tables
(``S.LEASE_LOST``, ``A.NOTHING``) and ``scripts`` puts them in front of each script's first
line when it loads it (on that line, so Lua's line numbers in errors stay the file's). No
bare number stands for a status in Python or Lua.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["EPILOGUE", "ERA_CHECK", "Acquire", "Status", "prelude"]


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
    # 60-69: the job's era and clock (``era.py``): every script checks them first
    STATE_LOST = 60
    STATE_ROLLED_BACK = 61


class Acquire(IntEnum):
    """What ``acquire_shard`` says in place of a shard id when it leased none."""

    NOTHING = -1  # nothing to lease now (the reply carries the epoch's progress)
    NO_POOL = -2  # the epoch's pool does not exist (init_epoch creates it)
    REFUSED = -3  # the worker may not lease (the reply carries its Status)


#: the era and clock check in front of every script (one line). The caller appends the era
#: key and the clock key to KEYS, and the era it works in and the highest clock it has seen
#: to ARGV; a script reads ``NKEYS``/``NARGV`` for its own counts. A missing or other era
#: answers ``{0, {S.STATE_LOST, stored era or ""}}`` before the script touches anything. A
#: clock below the caller's means the job's state went back (a failover to a lagging
#: replica, a restart from an older snapshot, an evicted clock): the era is marked rolled
#: back (``<era>!rolled-back:<clock><<seen>``: every other process then sees a lost era) and
#: the answer is ``{0, {S.STATE_ROLLED_BACK, clock}}``. Otherwise the clock ticks
#: (``CLOCK``: this call's tick) and ``EPILOGUE`` answers ``{CLOCK, the script's reply}``.
ERA_CHECK = (
    "local NKEYS, NARGV = #KEYS - 2, #ARGV - 2 "
    "local ERA_NOW = redis.call('GET', KEYS[#KEYS - 1]) "
    "if ERA_NOW ~= ARGV[#ARGV - 1] then return {0, {S.STATE_LOST, ERA_NOW or ''}} end "
    "local CLOCK = tonumber(redis.call('GET', KEYS[#KEYS]) or '0') "
    "if CLOCK < tonumber(ARGV[#ARGV]) then "
    "redis.call('SET', KEYS[#KEYS - 1], ERA_NOW .. '!rolled-back:' .. CLOCK .. '<' .. ARGV[#ARGV]) "
    "return {0, {S.STATE_ROLLED_BACK, CLOCK}} end "
    "CLOCK = redis.call('INCR', KEYS[#KEYS]) "
    "local function BODY() "
)

#: what follows every script's last line: the script's reply, with this call's clock tick
EPILOGUE = " end return {CLOCK, BODY()}"


def prelude() -> str:
    """The enums as Lua tables and the era and clock check, on one line: ``local S = {...}
    ...``; it opens the function the script's body runs in (``EPILOGUE`` closes it)."""
    tables = []
    for var, enum in (("S", Status), ("A", Acquire)):
        fields = ", ".join(f"{m.name} = {m.value}" for m in enum)
        tables.append(f"local {var} = {{{fields}}}")
    return " ".join(tables) + " " + ERA_CHECK

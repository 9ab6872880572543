"""The Lua contract's status codes: one Python enum, composed into every script as a prelude.

Scripts cannot ``require`` a shared file, so scripts name these enums' members as ``S.LEASE_LOST``
and ``A.NOTHING``, and ``inline`` writes each name's number in its place when ``scripts``
loads a script (a table built per call cost Redis ~1.4 us of every script call: perf/
capacity.py). ``prelude()`` (the era and clock check) goes in front of each script's first
line (on that line, so Lua's line numbers in errors stay the file's). No bare number stands
for a status in Python or in a script's file.
"""

from __future__ import annotations

import os
import re
from enum import IntEnum
from functools import cache

__all__ = [
    "ANCHORS",
    "EPILOGUE",
    "ERA_CHECK",
    "GUARDS",
    "GUARDS_ENV",
    "HISTORY_TICKS",
    "Acquire",
    "Status",
    "guard",
    "inline",
    "prelude",
]


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


#: the job's anchors: keys that, once made, exist for as long as the era stands (a job's
#: fencing counter, membership generation, epoch and registered datasets: that HASH keeps a
#: field "" once a dataset was registered, so deleting every dataset leaves it standing);
#: the caller appends them, in this order, before the era key (``era.py``)
ANCHORS = ("fence", "generation", "epoch", "datasets")

#: ticks of the job's history kept (``Keys.history``: 8 bytes each, a 32 KiB string per job):
#: a process whose last call was at most this many ticks ago can tell whether Redis' state
#: continues the one it saw; past that only the height check (and fencing by grant) stand
HISTORY_TICKS = 4096

#: the era, clock, history and anchor check in front of every script (one line). The caller
#: appends the anchor keys, the era key, the clock key and the history key to KEYS, and the
#: era it works in, the highest clock tick it has seen (its mark), the id of the call that
#: took that tick ("": not known) and this call's own id (8 random characters) to ARGV; a
#: script reads ``NKEYS``/``NARGV`` for its own counts. The clock key holds ``tick * 16 +
#: made`` (16: ``2 ** len(ANCHORS)``): ``made``'s bits are the anchors made so far (bit n-1
#: for ``ANCHORS[n]``), so one ``INCRBY 16`` ticks it and reads both. The history key holds,
#: at ``(tick % HISTORY_TICKS) * 8``, the id of the call that took the tick.
#: - A missing or other era answers ``{0, {S.STATE_LOST, stored era or ""}}`` before the
#:   script touches anything.
#: - A tick below the caller's mark means the job's state went back (a failover to a replica
#:   that lagged, a restart from an older snapshot, an evicted clock): the era is marked
#:   rolled back (``<era>!rolled-back:<tick><<seen>``: every other process then sees a lost
#:   era) and the answer is ``{0, {S.STATE_ROLLED_BACK, tick}}``.
#: - A tick at or past the mark whose history at the mark holds another call's id means the
#:   state went back and other callers' ticks raised the clock again since (a height check
#:   alone is masked then): the era is marked ``<era>!rolled-back:<tick>~<seen>`` and the
#:   answer is ``{0, {S.STATE_ROLLED_BACK, tick, seen}}``.
#: - An anchor that was made and is gone means part of the state was lost while the era
#:   stands (evicted, expired or deleted by hand): the era is marked
#:   (``<era>!lost:<anchor>``) and the answer is ``{0, {S.STATE_LOST, marked era}}``.
#: Otherwise the call's id is written at its tick, the script runs (``CLOCK``: this call's
#: tick; a script that finds a key of a structure it relies on gone while the structure stands
#: returns ``LOST(key)``: the era is marked ``<era>!lost:<key after the job's tag>`` and the
#: reply is ``{S.STATE_LOST, marked era}``, guarded by ``G.ANCHORS`` like the anchors), and
#: ``EPILOGUE`` notes anchors made meanwhile and answers ``{CLOCK, the script's reply}``.
#: ``G.HISTORY`` is the history check's switch (``guard``, below: on, except in the fault
#: checker's proof that it matters).
ERA_CHECK = (
    f"local NKEYS, NARGV = #KEYS - {len(ANCHORS) + 3}, #ARGV - 4 "
    "local ERA_NOW = redis.call('GET', KEYS[#KEYS - 2]) "
    "if ERA_NOW ~= ARGV[#ARGV - 3] then return {0, {S.STATE_LOST, ERA_NOW or ''}} end "
    f"local CLOCKED = redis.call('INCRBY', KEYS[#KEYS - 1], {2 ** len(ANCHORS)}) "
    f"local CLOCK, MADE = math.floor(CLOCKED / {2 ** len(ANCHORS)}), "
    f"CLOCKED % {2 ** len(ANCHORS)} "
    "local SEEN = tonumber(ARGV[#ARGV - 2]) "
    "if CLOCK - 1 < SEEN then "
    "redis.call('SET', KEYS[#KEYS - 2], "
    "ERA_NOW .. '!rolled-back:' .. (CLOCK - 1) .. '<' .. SEEN) "
    "return {0, {S.STATE_ROLLED_BACK, CLOCK - 1}} end "
    f"if G.HISTORY and SEEN > 0 and ARGV[#ARGV - 1] ~= '' and CLOCK - 1 - SEEN < {HISTORY_TICKS} "
    f"and redis.call('GETRANGE', KEYS[#KEYS], SEEN % {HISTORY_TICKS} * 8, "
    f"SEEN % {HISTORY_TICKS} * 8 + 7) ~= ARGV[#ARGV - 1] then "
    "redis.call('SET', KEYS[#KEYS - 2], "
    "ERA_NOW .. '!rolled-back:' .. (CLOCK - 1) .. '~' .. SEEN) "
    "return {0, {S.STATE_ROLLED_BACK, CLOCK - 1, SEEN}} end "
    f"redis.call('SETRANGE', KEYS[#KEYS], CLOCK % {HISTORY_TICKS} * 8, ARGV[#ARGV]) "
    # one EXISTS of every anchor against how many were made; the slow path names the lost one
    # (an anchor made and not noted yet hides a lost one for one call, until it is noted)
    "if G.ANCHORS and MADE > 0 and redis.call('EXISTS', "
    + ", ".join(f"KEYS[#KEYS - {len(ANCHORS) + 2 - n}]" for n in range(len(ANCHORS)))
    + ") < ({"
    + ", ".join(str(bin(m).count("1")) for m in range(2 ** len(ANCHORS)))
    + "})[MADE + 1] then "
    f"for n = 1, {len(ANCHORS)} do "
    "if math.floor(MADE / 2 ^ (n - 1)) % 2 == 1 "
    f"and redis.call('EXISTS', KEYS[#KEYS - {len(ANCHORS) + 3} + n]) == 0 then "
    "local lost = ERA_NOW .. '!lost:' .. ({" + ", ".join(f"'{name}'" for name in ANCHORS) + "})[n] "
    "redis.call('SET', KEYS[#KEYS - 2], lost) return {0, {S.STATE_LOST, lost}} end end end "
    # a script that finds a key of a structure gone while the structure stands: the era
    # marked lost naming the key (its part after the job's tag), the reply STATE_LOST
    "local function LOST(key) "
    "local lost = ERA_NOW .. '!lost:' .. string.match(key, '^.-}:(.*)$') "
    "redis.call('SET', KEYS[#KEYS - 2], lost) return {S.STATE_LOST, lost} end "
    "local function BODY() "
)

#: what follows every script's last line: anchors made by this call (or by plain commands
#: since) join ``made``; the reply goes out with this call's clock tick
EPILOGUE = (
    " end local REPLY = BODY() "
    f"if MADE < {2 ** len(ANCHORS) - 1} then local add = 0 "
    f"for n = 1, {len(ANCHORS)} do "
    "if math.floor(MADE / 2 ^ (n - 1)) % 2 == 0 "
    f"and redis.call('EXISTS', KEYS[#KEYS - {len(ANCHORS) + 3} + n]) == 1 then "
    "add = add + 2 ^ (n - 1) end end "
    "if add > 0 then redis.call('INCRBY', KEYS[#KEYS - 1], add) end end "
    "return {CLOCK, REPLY}"
)


#: the guards the exactly-once promise rests on, each a switch a script names as ``G.<NAME>``
#: (and Python reads with ``guard``): ``history`` the rollback check by history (not height),
#: ``fencing`` a completion naming the grant it ends (off: any completion records),
#: ``anchors`` the loss of an anchor, or of a key of a structure that stands, being an error,
#: and ``commit`` a checkpoint committing only once every rank acked (off: the first ack)
GUARDS = ("history", "fencing", "anchors", "commit")
#: test-only: a comma-separated list of ``GUARDS`` to switch off, read when a process first
#: loads the scripts. It exists so the fault checker can prove that each guard matters (with
#: one off, its fixed seeds must report a violation: ``strata_redis.chaos``); never set it
#: in a real job: it gives up exactly once
GUARDS_ENV = "STRATA_UNSAFE_DISABLE_GUARDS"


def guard(name: str) -> bool:
    """Whether the guard ``name`` (one of ``GUARDS``) is on: always, unless ``$GUARDS_ENV``
    switches it off for the fault checker's proof.

    Raises:
        ValueError: ``name`` (or a name in ``$GUARDS_ENV``) is no guard.
    """
    return name not in _off(os.environ.get(GUARDS_ENV, ""), name)


@cache
def _off(raw: str, name: str) -> frozenset[str]:
    """The guards ``raw`` (``$GUARDS_ENV``) switches off, checked once per value (a
    completion asks for every shard)."""
    off = frozenset(part.strip() for part in raw.split(",") if part.strip())
    unknown = sorted((off | {name}) - set(GUARDS))
    if unknown:
        raise ValueError(f"no such guard {unknown[0]!r} (guards: {', '.join(GUARDS)})")
    return off


#: a member of the enums (or a guard switch) as a script names it
_NAMED = re.compile(r"\b([SAG])\.([A-Za-z_]\w*)")


def inline(lua: str) -> str:
    """``lua`` with each ``S.<NAME>`` (``Status``) and ``A.<NAME>`` (``Acquire``) replaced by
    its number (negative ones in parentheses), and each ``G.<NAME>`` by whether that guard
    is on (``guard``: ``true`` or ``false``).

    Raises:
        ValueError: a name no enum has (a typo would otherwise be a runtime error in Redis).
    """

    def number(match: re.Match[str]) -> str:
        if match.group(1) == "G":
            return "true" if guard(match.group(2).lower()) else "false"
        enum = Status if match.group(1) == "S" else Acquire
        try:
            value = int(enum[match.group(2)])
        except KeyError:
            raise ValueError(f"Lua names {match.group(0)!r}: no such {enum.__name__}") from None
        return str(value) if value >= 0 else f"({value})"

    return _NAMED.sub(number, lua)


def prelude() -> str:
    """The era and clock check, on one line, with the codes inlined (``inline``); it opens
    the function the script's body runs in (``EPILOGUE`` closes it)."""
    return inline(ERA_CHECK)

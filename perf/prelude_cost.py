"""Redis CPU per script call of the prelude every script runs behind (``status.ERA_CHECK``):
the heartbeat script with no check, with the era check alone (the prelude before the job's
clock, 392eb16), with the era, clock and anchor check before the history check (ea57689),
with today's era, clock, history and anchor check, and with the same check behind the
status codes as Lua tables built on every call (before ``status.inline``), side by side.

    python perf/prelude_cost.py [--rounds 7] [--calls 4000]

Reads ``usec_per_call`` of ``INFO commandstats`` (Redis' own CPU time per EVALSHA, so the
client and the network are out of it) after each batch, on one private redis-server; the
three variants are interleaved round by round, so the same load drift hits all three. Prints
the median and range over the rounds.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
from pathlib import Path
from typing import Any

import redis

import strata_redis
from strata_redis import scripts, status
from strata_redis.server import RedisServer

#: the era check as it was before the clock (392eb16): a GET of the era key and a compare
ERA_ONLY = (
    "local NKEYS, NARGV = #KEYS - 1, #ARGV - 1 "
    "local ERA_NOW = redis.call('GET', KEYS[#KEYS]) "
    "if ERA_NOW ~= ARGV[#ARGV] then return {S.STATE_LOST, ERA_NOW or ''} end "
)


#: the commit whose prelude had the era, clock and anchor check but no history check
BEFORE_HISTORY = "ea57689"


def before_history() -> tuple[str, str]:
    """The prelude and epilogue of ``BEFORE_HISTORY``'s ``status.py``, inlined."""
    src = subprocess.run(
        ["git", "-C", str(Path(__file__).resolve().parent.parent), "show",
         f"{BEFORE_HISTORY}:strata_redis/status.py"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    space: dict[str, Any] = {"__name__": "old_status"}
    exec(compile(src, "old_status.py", "exec"), space)
    return space["prelude"](), space["inline"](space["EPILOGUE"])


def tables() -> str:
    """The status codes as Lua tables built on every call, as every script began before
    ``status.inline`` (issue 27)."""
    out = []
    for var, enum in (("S", status.Status), ("A", status.Acquire)):
        fields = ", ".join(f"{m.name} = {m.value}" for m in enum)
        out.append(f"local {var} = {{{fields}}}")
    return " ".join(out) + " "


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=4000, help="calls per variant per round")
    args = parser.parse_args()
    with RedisServer() as server:
        job = strata_redis.connect(server.url, "prelude-cost")
        worker = job.register_worker("w", heartbeat_interval=None)
        job.client.set(job.keys.epoch, 0)  # every anchor made: the prelude's full check runs
        job.client.set(job.keys.fence, 0)
        name, keys, args_ = worker.heartbeat_call()
        job.scripts.call(name, keys, args_)  # the anchors are noted
        body = scripts.body(name)
        full_keys, full_args = job.scripts.stamp(keys, args_)
        # the old prelude on a job of its own: its clock steps by 8 over 3 anchors (today's by
        # 16 over 4), so on one job either would read the other's ticks as anchors made
        old_job = strata_redis.connect(server.url, "prelude-cost-ea57689")
        old_worker = old_job.register_worker("w", heartbeat_interval=None)
        _, old_keys, old_args = old_worker.heartbeat_call()
        old_job.client.set(old_job.keys.epoch, 0)
        old_job.client.set(old_job.keys.fence, 0)
        ok = old_job.keys
        old_head, old_tail = before_history()
        variants = {
            "no check": ("local NKEYS, NARGV = #KEYS, #ARGV " + body, keys, args_),
            "era only (392eb16)": (
                status.inline(ERA_ONLY) + body, [*keys, job.keys.era],
                [*args_, job.context.era.value()],
            ),
            "era, clock, anchors (ea57689)": (
                old_head + body + "\n" + old_tail,
                [*old_keys, ok.fence, ok.generation, ok.epoch, ok.era, ok.clock],
                [*old_args, old_job.context.era.value(), 0],
            ),
            "era, clock, history, anchors": (scripts.compiled()[name], full_keys, full_args),
            "the same, codes as tables": (
                tables() + re.sub(r"\bG\.[A-Z_]+", "true",
                                  status.ERA_CHECK + scripts.body(name, inlined=False) + "\n"
                                  + status.EPILOGUE),
                full_keys, full_args,
            ),
        }  # fmt: skip
        raw = redis.Redis.from_url(server.url)
        shas = {label: raw.script_load(code) for label, (code, _, _) in variants.items()}
        per_call: dict[str, list[float]] = {label: [] for label in variants}
        for _ in range(args.rounds):
            for label, (_, k, a) in variants.items():
                if a is full_args:  # a mark within the history's reach: its check runs
                    job.scripts.call(name, keys, args_)
                    a[-4:] = job.scripts.stamp(keys, args_)[1][-4:]
                raw.config_resetstat()
                for _ in range(args.calls):
                    raw.evalsha(shas[label], len(k), *k, *a)
                per_call[label].append(raw.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
        for measured in (job, old_job):  # a refused call (a lost era) would time its refusal
            era = raw.get(measured.keys.era) or b""
            assert b"!" not in era, f"{measured.job_id}: {era!r}: the figures timed refusals"
        print(f"heartbeat script, Redis CPU per call ({args.rounds} rounds x {args.calls} calls):")
        for label, values in per_call.items():
            print(
                f"  {label:30s} median {statistics.median(values):6.2f} us "
                f"(range {min(values):.2f}-{max(values):.2f})"
            )
        raw.close()
        job.close()
        old_job.close()


if __name__ == "__main__":
    main()

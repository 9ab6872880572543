"""Redis CPU per lease hand-off of the lifetime lease counts (``Keys.lease_totals``: steals and
samples trained by worker, counted by ``acquire_shard.lua``): the script before them
(``git show <rev>:lua/acquire_shard.lua``, default f0c6626~1) and today's, side by side.

    python perf/lease_totals_cost.py [--rounds 7] [--shards 4000] [--rev f0c6626~1]

Each call is a draining loop's hand-off (complete the last shard, lease the next: the one
round trip per shard); half of the shards are another worker's, so half the grants are
steals. Reads ``usec_per_call`` of ``INFO commandstats`` (Redis' own CPU time per EVALSHA:
client and network out of it) after each epoch's drain, on one private redis-server; the
variants are interleaved round by round. Prints the median and range over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
from pathlib import Path
from typing import Any

import redis

import strata_redis
from strata_redis import scripts, status
from strata_redis.data.leases import CANDIDATES, new_grant
from strata_redis.data.record import lease_totals
from strata_redis.server import RedisServer

ROOT = Path(__file__).resolve().parent.parent


def drain(job: Any, raw: Any, sha: str, dataset: str, shards: int, new: bool) -> float:
    """Drain one epoch of ``dataset`` as worker "a" with hand-off calls; EVALSHA µs/call."""
    strata_redis.ShardManager(job).register_dataset_params(dataset, shards, 1)
    holder = job.leases(dataset, 0, "a", ttl=3600)
    holder.prepare()
    own = list(holder._own)
    keys = holder._handoff_keys()  # segment 0: the drained epoch fits in one
    if not new:
        keys = keys[:-1]  # the old script had no lifetime totals key
    base = [*holder._acquire_args]
    raw.config_resetstat()
    shard = token = grant_id = ""
    while True:
        # today's script: the completion names its grant, and each grant gets an id
        extra = ([shard, token, 1 if shard != "" else "", grant_id, new_id := new_grant()]
                 if new else [shard, token])  # fmt: skip
        k, a = job.scripts.stamp(keys, [*base, *extra, *own[:CANDIDATES]])
        reply = job.scripts.unwrap(raw.evalsha(sha, len(k), *k, *a), a)
        grant = reply[2:] if shard != "" else reply[1:]
        if int(grant[0]) < 0:
            break
        del own[: int(grant[-1])]
        shard, token = str(grant[0]), str(grant[1])
        grant_id = new_id if new else ""
    us = float(raw.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
    done = holder.progress()
    assert done.finished and 0 < done.steals < shards, done
    if new:  # the variant counts what it should: every steal, every sample
        totals = lease_totals(job.context, dataset)
        assert (totals.steals, totals.samples) == (done.steals, shards), totals
    return us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--shards", type=int, default=4000, help="shards per epoch drained")
    parser.add_argument("--rev", default="f0c6626~1", help="the revision of the old script")
    args = parser.parse_args()
    old_body = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{args.rev}:lua/acquire_shard.lua"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    new_code = scripts.compiled()["acquire_shard"]
    # the file's body as compiled() holds it (codes inlined), swapped for the old one's
    old_code = new_code.replace(status.inline(scripts.sources()["acquire_shard"]),
                                status.inline(old_body))  # fmt: skip
    assert old_code != new_code
    with RedisServer() as server:
        job = strata_redis.connect(server.url, "lease-totals-cost")
        job.register_worker("a", heartbeat_interval=None)
        job.register_worker("b", heartbeat_interval=None)
        raw = redis.Redis.from_url(server.url, decode_responses=True)
        variants = {"before (no lifetime counts)": (old_code, False),
                    "lifetime steals + samples": (new_code, True)}  # fmt: skip
        shas = {label: raw.script_load(code) for label, (code, _) in variants.items()}
        per_call: dict[str, list[float]] = {label: [] for label in variants}
        for r in range(args.rounds):
            for n, (label, (_, new)) in enumerate(variants.items()):
                us = drain(job, raw, shas[label], f"ds-{r}-{n}", args.shards, new)
                per_call[label].append(us)
        print(f"acquire_shard hand-off (complete + lease, half steals), Redis CPU per call "
              f"({args.rounds} rounds x {args.shards} shards):")  # fmt: skip
        for label, values in per_call.items():
            print(f"  {label:28s} median {statistics.median(values):6.2f} us "
                  f"(range {min(values):.2f}-{max(values):.2f})")  # fmt: skip
        raw.close()
        job.close()


if __name__ == "__main__":
    main()

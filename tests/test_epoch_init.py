"""An epoch's pool opens in one O(1) call at any size (the pool is the taken bitmap's zeros):
racing preparers open it once, and every shard is leased once."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import pytest
import redis

import strata_redis
from strata_redis import ShardManager
from strata_redis.errors import DatasetConflictError
from strata_redis.server import RedisServer


def _args(entry: dict[str, object]) -> int:
    """How many words a SLOWLOG entry's command had (Redis keeps 31, then a count of the rest)."""
    raw = entry["command"]
    command = raw.decode() if isinstance(raw, bytes) else str(raw)
    more = re.search(r"\.\.\. \((\d+) more arguments\)$", command)
    return 31 + int(more.group(1)) if more else len(command.split())


@pytest.mark.timeout(240)
def test_opening_a_pool_of_a_million_shards_is_one_small_call(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory(extra=["--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000"])
    job = strata_redis.connect(server.url, "big")
    ShardManager(job).register_dataset_params("ds", 1_000_000, 1)  # 10^6 shards
    job.register_worker("w", heartbeat_interval=None)
    raw = redis.Redis.from_url(server.url, decode_responses=True)
    raw.slowlog_reset()
    leases = job.leases("ds", 0, "w")
    leases.prepare()
    entries = raw.slowlog_get(100_000)
    evals = [e for e in entries if e["command"][:8].upper() in (b"EVALSHA ", "EVALSHA ")]
    evals = [e for e in evals if "epoch_meta" in str(e["command"])]  # (not the era's reads)
    assert len({str(e["command"]) for e in evals}) == 1  # (sent again after a NOSCRIPT)
    # EVALSHA sha numkeys, meta, the job's epoch, 2 bitmaps, the 4 anchors, the era, clock
    # and history keys, total, "" (none), the summary's ttl, the era, the clock, the mark's
    # call id and this call's id
    assert max(_args(e) for e in evals) <= 21
    # microseconds; a loop over 10^6 shards takes hundreds of ms, and 20 ms leaves room for
    # the scheduler of a loaded 2-core machine
    assert max(e["duration"] for e in evals) < 20_000
    progress = leases.progress()
    assert (progress.total, progress.done, progress.leased, progress.todo) == (10**6, 0, 0, 10**6)
    lease = leases.acquire()
    assert lease is not None and lease.complete() is True
    assert leases.progress().done == 1
    job.close()


def test_racing_preparers_open_the_pool_once_and_every_shard_is_leased_once(
    redis_url: str, raw: redis.Redis
) -> None:
    job = strata_redis.connect(redis_url, "race")
    ShardManager(job).register_dataset_params("ds", 500, 1)  # 500 shards
    names = [f"w-{i}" for i in range(8)]
    for name in names:
        job.register_worker(name, heartbeat_interval=None)
    errors: list[BaseException] = []
    done: dict[str, list[int]] = {name: [] for name in names}

    def drain(name: str) -> None:
        try:
            for lease in strata_redis.connect(job, "race").leases("ds", 0, name):
                if lease.complete():
                    done[name].append(lease.shard_id)
        except BaseException as exc:  # recorded, asserted below
            errors.append(exc)

    threads = [threading.Thread(target=drain, args=(n,)) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert raw.hget("strata:{race}:epoch_meta:0:ds", "swept") is not None
    everything = sorted(s for shards in done.values() for s in shards)
    assert everything == list(range(500)), "every shard once, none twice"
    record = job.leases("ds", 0, "w-0").completions()
    assert {s: w for s, (w, _) in record.items()} == {
        s: name for name, shards in done.items() for s in shards
    }


def test_a_closed_epoch_is_not_opened_again(redis_url: str, raw: redis.Redis) -> None:
    job = strata_redis.connect(redis_url, "closed")
    ShardManager(job).register_dataset_params("ds", 30, 1)
    job.register_worker("a", heartbeat_interval=None)
    for epoch in (0, 1):
        for lease in job.leases("ds", epoch, "a"):
            assert lease.complete()
    assert raw.hget("strata:{closed}:epoch_meta:0:ds", "closed_ms") is not None
    late = job.leases("ds", 0, "a")
    late.prepare()  # a late preparer of the closed epoch
    assert late.acquire() is None and late.drained
    assert raw.hget("strata:{closed}:epoch_meta:0:ds", "swept") is None
    assert raw.exists("strata:{closed}:shards_taken:0:ds") == 0


def test_another_shard_count_is_refused(redis_url: str, raw: redis.Redis) -> None:
    job = strata_redis.connect(redis_url, "mismatch")
    job.register_worker("w", heartbeat_interval=None)
    keys = [
        "strata:{mismatch}:epoch_meta:0:ds",
        "strata:{mismatch}:epoch",
        "strata:{mismatch}:shards_taken:0:ds",
        "strata:{mismatch}:shards_done_bits:0:ds",
    ]
    reply = job.scripts.run("init_epoch", keys, [10_000, "", 60, 60], {"job_id": "mismatch"})
    assert [int(x) for x in reply] == [1, 10_000, 0]  # open, nothing closed
    with pytest.raises(DatasetConflictError, match="different number of shards"):
        job.scripts.run(
            "init_epoch", keys, [20, "", 60, 60],
            {"job_id": "mismatch", "dataset": "ds", "epoch": 0, "worker_id": "w"},
        )  # fmt: skip
    assert raw.hget(keys[0], "num_shards") == "10000"

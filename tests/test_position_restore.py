"""Putting an epoch's pool back to a checkpoint's data position is done in bounded chunks:
no call carries more than ``RESTORE_CHUNK`` entries (done shards, offsets) at any size, and
racing members of the restoring round, or one that died half-way, end with the same pool as
one restore."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import redis

import strata_redis
from strata_redis import ShardManager
from strata_redis.data import position
from strata_redis.data.record import epoch_record
from strata_redis.keys import Keys
from strata_redis.server import RedisServer

from .test_epoch_init import _args

WORKERS = ["w1", "w2", "w3"]


def _inputs(num_shards: int) -> tuple[set[int], dict[int, int]]:
    rng = np.random.default_rng(3)
    done = set(rng.choice(num_shards, num_shards // 3, replace=False).tolist())
    partial = [s for s in range(0, num_shards, 7) if s not in done][:500]
    return done, {s: 1 + s % 9 for s in partial}


def _state(raw: redis.Redis, job: str, dataset: str, epoch: int = 0) -> dict[str, Any]:
    keys = Keys(job)
    lk = keys.lease_keys(dataset, epoch)
    return {
        "epoch": raw.get(keys.epoch),
        "taken": _bits(raw, lk.taken),
        "done": _bits(raw, lk.done),
        "done_count": raw.hget(lk.meta, "done"),
        "offsets": raw.hgetall(lk.offsets),
        "swept": raw.hget(lk.meta, "swept"),
    }


def _bits(raw: redis.Redis, key: str) -> set[int]:
    """The bits set in a bitmap."""
    value = raw.execute_command("GET", key, NEVER_DECODE=True) or b""
    return set(np.flatnonzero(np.unpackbits(np.frombuffer(value, dtype=np.uint8))).tolist())


def _restore(url: str, job_id: str, shards: int, mark: int = 1) -> bool:
    job = strata_redis.connect(url, job_id)
    params = ShardManager(job).register_dataset_params("ds", shards, 1)
    done, offsets = _inputs(shards)
    try:
        return position.restore_position(
            job.context, params, 0, done, offsets, workers=WORKERS, mark=mark, later_epochs=1
        )
    finally:
        job.close()


@pytest.mark.timeout(240)
def test_no_restore_call_carries_more_than_a_chunk(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory(extra=["--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000"])
    raw = redis.Redis.from_url(server.url, decode_responses=True)
    shards = 200_000
    job = strata_redis.connect(server.url, "big")
    params = ShardManager(job).register_dataset_params("ds", shards, 1)
    job.leases("ds", 0, "w1")  # an epoch in progress: the restore replaces it
    raw.slowlog_reset()
    calls = int(raw.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    assert _restore(server.url, "big", shards)
    calls = int(raw.info("commandstats")["cmdstat_evalsha"]["calls"]) - calls
    # (the log keeps the newest entries: the scripts' own commands are logged too)
    entries = raw.slowlog_get(100_000)
    evals = [e for e in entries if e["command"][:8].upper() in (b"EVALSHA ", "EVALSHA ")]
    done, offsets = _inputs(shards)
    assert calls >= (len(done) + len(offsets)) // position.RESTORE_CHUNK and evals
    # EVALSHA sha numkeys, 1 + 2 x (6 + 4 record segments) keys + the 4 anchors, the era and
    # the clock keys, 5 fixed arguments, 2 counts, the era and the clock: 38 words; then at
    # most 2 per entry
    assert max(_args(e) for e in evals) <= 2 * position.RESTORE_CHUNK + 38
    state = _state(raw, "big", "ds")
    done, offsets = _inputs(shards)
    # the job's epoch is coordination's (restore_epoch, composed by resume.py): untouched
    assert state["epoch"] is None and state["swept"] == "-1"
    assert state["done"] == done and state["done_count"] == str(len(done))
    assert {int(s): int(o) for s, o in state["offsets"].items()} == offsets
    assert state["taken"] == done, "every other shard is in the pool"
    record = job.leases("ds", 0, "w1").completions()
    assert sorted(record) == sorted(done) and set(record.values()) == {("restored", 0)}
    assert params.num_shards == shards
    job.close()


def test_racing_and_interrupted_restores_end_like_one(redis_url: str, raw: redis.Redis) -> None:
    shards = 20_000
    assert _restore(redis_url, "one", shards)
    expected = _state(raw, "one", "ds")
    assert not _restore(redis_url, "one", shards)  # the same mark again: nothing to do
    assert _state(raw, "one", "ds") == expected

    # four members of the restoring round at once
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(_restore(redis_url, "race", shards)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 4 and any(results)
    assert _state(raw, "race", "ds") == expected

    # a member that died after three chunks: the next one goes on from there
    job = strata_redis.connect(redis_url, "cut")
    params = ShardManager(job).register_dataset_params("ds", shards, 1)
    done, offsets = _inputs(shards)
    keys, chunk = position.restore_chunks(job.context, params, 0, done, offsets, WORKERS, 1, 1)
    for k in range(3):
        assert job.context.scripts.run("restore_position", keys, chunk(k), {})[:2] == [0, k + 1]
    assert _state(raw, "cut", "ds")["swept"] is None  # the pool is not open half-way
    assert _restore(redis_url, "cut", shards)
    assert _state(raw, "cut", "ds") == expected
    job.close()


def test_a_closed_epoch_is_restored_from_a_checkpoint(redis_url: str, raw: redis.Redis) -> None:
    """Resuming from a checkpoint of an earlier epoch, closed into its summary since: the
    restore rebuilds its record from the checkpoint's position; later epochs' keys go."""
    job = strata_redis.connect(redis_url, "back")
    params = ShardManager(job).register_dataset_params("ds", 40, 1)
    job.register_worker("w1", heartbeat_interval=None)
    for epoch in (0, 1):
        for lease in job.leases("ds", epoch, "w1"):
            assert lease.complete()
    assert raw.hget(Keys("back").lease_keys("ds", 0).meta, "closed_ms") is not None
    done, offsets = set(range(0, 40, 2)), {1: 1}
    assert position.restore_position(
        job.context, params, 0, done, offsets, workers=WORKERS, mark=7, later_epochs=1
    )
    assert raw.get(job.keys.epoch) is None  # coordination's: resume.py puts it back first
    assert not raw.keys("strata:{back}:*:1:ds"), "epoch 1's keys are deleted"
    leases = job.leases("ds", 0, "w1")
    progress = leases.progress()
    assert (progress.done, progress.leased, progress.todo) == (20, 0, 20)
    assert epoch_record(job.context, params, 0) == (done, offsets)
    got = []
    for lease in leases:
        got.append((lease.shard_id, lease.start))
        assert lease.complete()
    assert sorted(s for s, _ in got) == list(range(1, 40, 2)) and (1, 1) in got
    record = leases.completions()
    assert sorted(record) == list(range(40))
    assert {record[s] for s in done} == {("restored", 0)}
    assert {record[s][0] for s in range(1, 40, 2)} == {"w1"}
    job.close()

"""An epoch's pool is built in bounded chunks: no call carries more than ``INIT_CHUNK``
shards, racing acquirers and a preparer that died half-way end with every shard once."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import numpy as np
import pytest
import redis

import strata_redis
from strata_redis import ShardManager
from strata_redis.data import leases as leases_module
from strata_redis.server import RedisServer


def _pool(raw: redis.Redis, job: str, dataset: str, epoch: int = 0) -> list[int]:
    return sorted(
        int(m) for m in raw.zrange(f"strata:{{{job}}}:shards_todo:{epoch}:{dataset}", 0, -1)
    )


def _args(entry: dict[str, object]) -> int:
    """How many words a SLOWLOG entry's command had (Redis keeps 31, then a count of the rest)."""
    raw = entry["command"]
    command = raw.decode() if isinstance(raw, bytes) else str(raw)
    more = re.search(r"\.\.\. \((\d+) more arguments\)$", command)
    return 31 + int(more.group(1)) if more else len(command.split())


@pytest.mark.timeout(240)
def test_no_call_carries_more_than_a_chunk(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory(extra=["--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000"])
    job = strata_redis.connect(server.url, "big")
    ShardManager(job).register_dataset_params("ds", 200_000, 1)  # 200,000 shards
    job.register_worker("w", heartbeat_interval=None)
    raw = redis.Redis.from_url(server.url, decode_responses=True)
    raw.slowlog_reset()
    job.leases("ds", 0, "w").prepare()
    entries = raw.slowlog_get(100_000)
    evals = [e for e in entries if e["command"][:8].upper() in (b"EVALSHA ", "EVALSHA ")]
    assert len(evals) >= 200_000 // leases_module.INIT_CHUNK
    # EVALSHA sha numkeys, 4 keys + the era key (+ 6 of an epoch to close), total, offset,
    # the epoch to close, its summary's ttl, two arguments per shard, era
    assert max(_args(e) for e in evals) <= 2 * leases_module.INIT_CHUNK + 20
    assert _pool(raw, "big", "ds") == list(range(200_000))
    job.close()


def test_racing_preparers_add_every_shard_once(
    redis_url: str, raw: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leases_module, "INIT_CHUNK", 100)
    job = strata_redis.connect(redis_url, "race")
    ShardManager(job).register_dataset_params("ds", 5_000, 1)  # 5,000 shards, 50 chunks
    names = [f"w-{i}" for i in range(8)]
    for name in names:
        job.register_worker(name, heartbeat_interval=None)
    errors: list[BaseException] = []

    def prepare(name: str) -> None:
        try:
            strata_redis.connect(job, "race").leases("ds", 0, name).prepare()
        except BaseException as exc:  # recorded, asserted below
            errors.append(exc)

    threads = [threading.Thread(target=prepare, args=(n,)) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert _pool(raw, "race", "ds") == list(range(5_000))
    assert raw.hget("strata:{race}:epoch_meta:0:ds", "swept") == "-1"


def test_a_preparer_that_died_half_way_is_finished_by_the_next(
    redis_url: str, raw: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leases_module, "INIT_CHUNK", 64)
    job = strata_redis.connect(redis_url, "crash")
    ShardManager(job).register_dataset_params("ds", 1_000, 1)
    job.register_worker("a", heartbeat_interval=None)
    job.register_worker("b", heartbeat_interval=None)
    dying = job.leases("ds", 0, "a")
    calls = {"n": 0}
    real = dying.context.scripts.run

    def die_after_three(name: str, *args: object, **kwargs: object) -> object:
        if name == "init_epoch":
            calls["n"] += 1
            if calls["n"] > 3:
                raise KeyboardInterrupt  # the process dies between two chunks
        return real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(dying.context.scripts, "run", die_after_three)
    with pytest.raises(KeyboardInterrupt):
        dying.prepare()
    monkeypatch.undo()
    assert len(_pool(raw, "crash", "ds")) == 3 * 64
    # a half-built pool is not open: nobody leases from it
    assert raw.hget("strata:{crash}:epoch_meta:0:ds", "swept") is None
    survivor = strata_redis.connect(redis_url, "crash").leases("ds", 0, "b")
    done = []
    for lease in survivor:
        done.append(lease.shard_id)
        assert lease.complete()
    assert sorted(done) == list(range(1_000))
    assert sorted(survivor.completions()) == list(range(1_000))


def test_another_shard_count_is_refused_mid_build(redis_url: str, raw: redis.Redis) -> None:
    job = strata_redis.connect(redis_url, "mismatch")
    job.register_worker("w", heartbeat_interval=None)
    # a half-built pool of 10,000 shards
    reply = job.scripts.run(
        "init_epoch",
        ["strata:{mismatch}:epoch_meta:0:ds", "strata:{mismatch}:shards_todo:0:ds",
         "strata:{mismatch}:shards_done:0:ds",
         "strata:{mismatch}:epoch"],
        [10_000, 0, "", 60,
         *np.column_stack([np.zeros(10), np.arange(10)]).astype(int).ravel().tolist()],
        {"job_id": "mismatch"},
    )  # fmt: skip
    assert [int(x) for x in reply] == [0, 10]  # not complete: go on from shard 10
    with pytest.raises(strata_redis.DatasetConflictError, match="different number of shards"):
        job.scripts.run(
            "init_epoch",
            ["strata:{mismatch}:epoch_meta:0:ds", "strata:{mismatch}:shards_todo:0:ds",
             "strata:{mismatch}:shards_done:0:ds",
             "strata:{mismatch}:epoch"],
            [20, 10, "", 60, 1, 10],
            {"job_id": "mismatch", "dataset": "ds", "epoch": 0, "worker_id": "w"},
        )  # fmt: skip

"""Redis at its memory limit (``maxmemory`` reached under ``noeviction``): calls fail with
one clear error naming the limit and apply nothing, heartbeat threads log one line when
they start failing and one when they recover, and the reaper declares no live worker
failed because its heartbeats could not be written."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

import strata_redis
from strata_redis.server import RedisServer

TIMEOUT = 1.0  # heartbeat timeout: the memory stays full for over two of them


@contextmanager
def memory_full(admin: redis.Redis) -> Iterator[None]:
    """Fill Redis to its limit (noeviction), keep it there, then free the memory."""
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", used + 2_000_000)
    filler = []
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        for i in range(1000):
            admin.set(f"filler:{i}", b"x" * 100_000)
            filler.append(f"filler:{i}")
    # a margin below the fill, so the small writes of a tick cannot slip under the limit
    admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]) - 500_000)
    try:
        yield
    finally:
        admin.delete(*filler)
        admin.config_set("maxmemory", 0)


@pytest.fixture
def server(redis_factory: Callable[..., RedisServer]) -> RedisServer:
    return redis_factory(extra=["--maxmemory-policy", "noeviction"])


def test_live_workers_ride_out_a_full_memory_and_a_reap_during_it(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="strata_redis")
    admin = redis.Redis(port=server.port)
    job = strata_redis.connect(server.url, "oom", heartbeat_timeout=TIMEOUT)
    workers = [job.register_worker(f"w{i}", heartbeat_interval=0.1) for i in range(2)]
    time.sleep(0.5)
    generation = job.membership_generation()
    with memory_full(admin):
        time.sleep(2.5 * TIMEOUT)  # no heartbeat gets through for 2.5 timeouts
        # a reap during it declares nobody: the call is refused whole, and says why
        with pytest.raises(strata_redis.RedisMemoryFullError, match="memory limit") as err:
            job.reap()
        assert isinstance(err.value, redis.exceptions.OutOfMemoryError)
        assert err.value.job_id == "oom"
        # other calls fail the same way, and apply nothing
        with pytest.raises(strata_redis.RedisMemoryFullError, match="maxmemory"):
            job.register_worker("late", heartbeat_interval=None)
        with pytest.raises(strata_redis.RedisMemoryFullError):
            job.barrier("b", expected=2).wait("w0", timeout=5)
    # the first reap after it (before any heartbeat thread's step) sees the outage, too
    assert job.reap() == []
    time.sleep(2 * TIMEOUT)
    assert job.reap() == []
    assert {w.worker_id: w.status for w in job.workers()} == {"w0": "idle", "w1": "idle"}
    assert job.membership_generation() == generation  # nobody failed, nobody joined
    assert job.barrier("b", expected=2).state().arrived == []  # the refused arrival
    for w in workers:
        assert w.heartbeating and w.lost is None
    # each heartbeat thread said it once when it started failing, once when it recovered. A
    # reply later than the heartbeat client's 1 s socket timeout (a loaded machine) is an
    # outage of its own, logged the same way once each way: those lines are not the memory's
    lines = [r for r in caplog.records if r.name == "strata_redis.workers"]
    for w in workers:
        mine = [r.getMessage() for r in lines if f"'{w.worker_id}'" in r.getMessage()]
        failing = [m for m in mine if "heartbeats failing" in m]
        full = [m for m in failing if "Redis did not answer in time" not in m]
        assert len(full) == 1 and "memory limit" in full[0], mine
        assert len(mine) == len(failing) + sum("heartbeats recovered" in m for m in mine), mine
        assert "heartbeats recovered" in mine[-1], mine
    assert not any(r.exc_info for r in lines)  # no traceback per tick
    for w in workers:
        w.stop_heartbeat()
    job.close()


def test_a_dead_worker_is_still_declared_failed_after_a_full_memory(
    server: RedisServer,
) -> None:
    admin = redis.Redis(port=server.port)
    job = strata_redis.connect(server.url, "oom", heartbeat_timeout=TIMEOUT)
    live, dead = (job.register_worker(f"w{i}", heartbeat_interval=0.1) for i in range(2))
    time.sleep(0.3)
    dead.stop_heartbeat()  # it dies as the memory fills
    with memory_full(admin):
        time.sleep(2 * TIMEOUT)
    # within the grace only workers silent a timeout before the outage fail; after it, the
    # dead one does (the live one's heartbeat thread reaps it), the live one never
    freed = time.monotonic()
    status: dict[str, str] = {}
    while time.monotonic() < freed + 4 * TIMEOUT and status.get("w1") != "failed":
        assert job.reap() in ([], ["w1"])
        status = {w.worker_id: w.status for w in job.workers()}
        time.sleep(0.05)
    assert status == {"w0": "idle", "w1": "failed"}
    assert live.heartbeating and live.lost is None
    live.stop_heartbeat()
    job.close()


def test_the_training_loop_stops_on_one_clear_error_and_can_go_on(
    server: RedisServer, tmp_path: Path
) -> None:
    admin = redis.Redis(port=server.port)
    with strata_redis.TrainingOrchestrator(
        server.url, "w0", job_id="oom", checkpoint_path=str(tmp_path), last_call=0.1,
        heartbeat_timeout=5.0,
    ) as orch:  # fmt: skip
        with memory_full(admin):
            with pytest.raises(strata_redis.RedisMemoryFullError, match="memory limit"):
                orch.save_checkpoint(step=1, epoch=0, state=b"model")
            with pytest.raises(strata_redis.RedisMemoryFullError, match="memory limit"):
                orch.advance_epoch()
        # nothing was half-applied: the same step saves, the epoch moves once
        future = orch.save_checkpoint(step=1, epoch=0, state=b"model")
        assert future is not None and future.result(30).step == 1
        assert orch.advance_epoch() == 1

"""Redis at its memory limit (``maxmemory`` reached under ``noeviction``) is a pause: calls
wait for memory (one WARNING when the wait starts, one when it ends) and carry on once it is
freed; past the job's ``redis_retry`` they fail with one clear error naming the limit and
apply nothing. Heartbeat threads log one line when they start failing and one when they
recover, and the reaper declares no live worker failed because its heartbeats could not be
written."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

import strata_redis
from strata_redis.server import RedisServer

from . import loops

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
    # calls wait for memory at most 0.5 s (redis_retry) here, then give up
    job = strata_redis.connect(server.url, "oom", heartbeat_timeout=TIMEOUT, redis_retry=0.5)
    workers = [job.register_worker(f"w{i}", heartbeat_interval=0.1) for i in range(2)]
    time.sleep(0.5)
    generation = job.membership_generation()
    with memory_full(admin):
        time.sleep(2.5 * TIMEOUT)  # no heartbeat gets through for 2.5 timeouts
        # a reap during it declares nobody: the call waits for memory, then is refused
        # whole past the budget, and says why
        with pytest.raises(strata_redis.RedisMemoryFullError, match="memory limit") as err:
            job.reap()
        assert isinstance(err.value, redis.exceptions.OutOfMemoryError)
        assert err.value.job_id == "oom"
        assert err.value.seconds is not None and err.value.seconds >= 0.5
        assert "redis_retry" in str(err.value)
        # other calls fail the same way, and apply nothing
        with pytest.raises(strata_redis.RedisMemoryFullError, match="maxmemory"):
            job.register_worker("late", heartbeat_interval=None)
        with pytest.raises(strata_redis.RedisMemoryFullError):
            job.barrier("b", expected=2).wait("w0", timeout=5)
    # each call logged its wait once when it began, and nothing when it gave up
    waits = [r.getMessage() for r in caplog.records if r.name == "strata_redis.outage"]
    assert len(waits) == 3 and all("refuses writes" in m for m in waits), waits
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


def test_the_training_loop_waits_for_memory_and_goes_on(
    server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="strata_redis.outage")
    admin = redis.Redis(port=server.port)
    with strata_redis.TrainingOrchestrator(
        server.url, "w0", job_id="oom", checkpoint_path=str(tmp_path), last_call=0.1,
        heartbeat_timeout=5.0,
    ) as orch:  # fmt: skip
        done: list[object] = []

        def loop() -> None:  # the loop's calls, while the memory is full
            try:
                future = orch.save_checkpoint(step=1, epoch=0, state=b"model")
                assert future is not None
                done.extend([future.result(30).step, orch.advance_epoch(), orch.epoch])
            except BaseException as exc:  # the test looks at what the loop got
                done.append(exc)

        with memory_full(admin):
            thread = threading.Thread(target=loop, daemon=True)
            thread.start()
            time.sleep(1.0)
            assert done == []  # waiting, not failed
        thread.join(30)
        # the step saved once, the epoch moved once
        assert done == [1, 1, 1]
    # one line when the wait began, one when it ended
    lines = [r.getMessage() for r in caplog.records if r.name == "strata_redis.outage"]
    assert len(lines) == 2, lines
    assert "refuses writes" in lines[0] and "accepts writes again" in lines[1], lines


def test_a_training_job_pauses_at_the_memory_limit_and_carries_on(
    server: RedisServer, tmp_path: Path
) -> None:
    # three README loops; Redis' memory fills mid-epoch for longer than two heartbeat
    # timeouts, then is freed: every loop waits, none dies, and the job finishes
    logs = tmp_path / "logs"
    timeout = 2.0
    cfg = {"workers": 3, "sleep": 0.02, "save_every": 10, "heartbeat_timeout": timeout}
    procs = loops.start(server.url, logs, tmp_path / "ckpt", cfg)
    admin = redis.Redis(port=server.port)
    with memory_full(admin):
        time.sleep(2.5 * timeout)
        # every loop is paused in a call now (a loop trains the rest of the shard it holds
        # without Redis, 0.3 s at most): no batch trained in the last second, none dead
        before = loops.batches(logs)
        time.sleep(1.0)
        assert loops.batches(logs) == before
        assert not loops.errors(logs) and all(p.is_alive() for p in procs)
    # each sample once, every save committed, no checkpoint step aborted; nobody failed
    loops.assert_finished_once(procs, logs)
    job = strata_redis.connect(server.url, loops.JOB)
    assert int(admin.hget(job.keys.checkpoint_totals, "aborted_steps") or 0) == 0
    assert admin.hget(job.keys.rendezvous, "restarts_failure") in (None, b"0")
    assert not [e for e in job.events(1000) if e["type"] == "fail"]
    job.close()

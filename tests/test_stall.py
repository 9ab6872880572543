"""The reaper is fair to a Redis stall: when Redis itself could not run (SIGSTOP of
redis-server, a slow command), live workers are not declared failed for heartbeats they
could not deliver; a worker that really went silent still is."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest

import strata_redis
from strata_redis.server import RedisServer

from .procs import wait_for


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stall", ["sigstop", "debug-sleep"])
def test_a_stall_longer_than_the_timeout_fails_no_live_worker(
    redis_factory: Callable[..., RedisServer], stall: str
) -> None:
    server = redis_factory(extra=["--enable-debug-command", "yes"])
    assert server.proc is not None
    # (3 s, not 2: the grace after a stall is one timeout, and in CI's parallel run a
    # heartbeat thread resumed more than 2 s after the stall ended: 4 of 10 workers were
    # refused as failed; the stall itself is still three timeouts)
    timeout = 3.0
    jobs = [
        strata_redis.connect(server.url, f"job-{j}", heartbeat_timeout=timeout) for j in range(2)
    ]
    workers = [
        job.register_worker(f"w-{i}", heartbeat_interval=0.25) for job in jobs for i in range(10)
    ]
    silent = jobs[0].register_worker("silent", heartbeat_interval=None)
    time.sleep(1.0)  # every thread beats a few times: normal operation
    if stall == "sigstop":
        os.kill(server.proc.pid, signal.SIGSTOP)  # the server stops answering for 3 timeouts
        time.sleep(3 * timeout)
        os.kill(server.proc.pid, signal.SIGCONT)
    else:
        admin = jobs[1].client
        admin.execute_command("DEBUG", "SLEEP", 3 * timeout)  # one command blocks Redis
    # the silent worker is still found out, after at most a timeout or two
    wait_for(lambda: "silent" not in jobs[0].live_workers(), 30)
    time.sleep(2 * timeout)
    for job in jobs:
        states = {w.worker_id: w.status for w in job.workers()}
        live = {k: v for k, v in states.items() if k != "silent"}
        assert set(live.values()) == {"idle"}, live
    assert all(w.lost is None and w.heartbeating for w in workers)
    assert silent.worker_id not in jobs[0].live_workers()
    for w in workers:
        w.deregister()

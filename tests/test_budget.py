"""The connection budget of one process: heartbeats on their own pool, a pool limit that
says so (never "Redis unreachable"), socket timeouts that end a silent partition."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis

import strata_redis
from strata_redis import connection
from strata_redis.connection import make_client
from strata_redis.coordination import Release
from strata_redis.errors import PoolExhaustedError
from strata_redis.server import RedisServer

from .procs import wait_for


@pytest.fixture
def strata_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.INFO, logger="strata_redis")
    yield caplog


def _problems(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("strata_redis") and r.levelno >= logging.WARNING
    ]


@pytest.mark.timeout(180)
def test_300_workers_150_at_one_barrier_in_one_process(
    redis_url: str, raw: redis.Redis, strata_logs: pytest.LogCaptureFixture
) -> None:
    # redis-py 8's default pool (100 connections) made this print "Redis unreachable (Too
    # many connections)", break the barrier and declare all 300 workers failed
    job = strata_redis.connect(redis_url, "budget", heartbeat_timeout=6.0)
    workers = [job.register_worker(f"w-{i:03d}", heartbeat_interval=1.0) for i in range(300)]
    barrier = job.barrier("step-1", expected=150, timeout=120)
    results: dict[str, object] = {}

    def wait(worker_id: str) -> None:
        try:
            results[worker_id] = barrier.wait(worker_id)
        except Exception as exc:  # recorded, asserted below
            results[worker_id] = exc

    threads = [threading.Thread(target=wait, args=(w.worker_id,)) for w in workers[:150]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(150)
    assert not any(t.is_alive() for t in threads), "waiters still blocked"
    errors = {k: v for k, v in results.items() if not isinstance(v, Release)}
    assert not errors, list(errors.items())[:3]
    assert {r.generation for r in results.values()} == {1}  # type: ignore[attr-defined]
    # heartbeats kept flowing for every worker, waiting or not, for two timeouts more
    time.sleep(2 * job.heartbeat_timeout)
    statuses = raw.hgetall("strata:{budget}:status")
    assert len(statuses) == 300
    assert set(statuses.values()) == {"idle"}, "a live worker was declared failed"
    assert all(w.lost is None and w.heartbeating for w in workers)
    assert not _problems(strata_logs)
    for w in workers:
        w.deregister()
    job.close()


def test_pool_limit_says_so_and_heartbeats_go_on(
    redis_url: str,
    raw: redis.Redis,
    strata_logs: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connection, "POOL_TIMEOUT", 0.5)
    # 6 s: the heartbeat client's socket timeout is half of it, so a heartbeat reply late on
    # a loaded machine logs nothing; heartbeats drawn from the full pool would log failures
    job = strata_redis.connect(redis_url, "tight", heartbeat_timeout=6.0, max_connections=2)
    worker = job.register_worker("w", heartbeat_interval=0.2)
    # two callers block for 3 s each: the whole pool of two is busy
    blockers = [
        threading.Thread(target=job.client.blpop, args=([f"strata:{{tight}}:nothing-{i}"], 3))
        for i in range(2)
    ]
    for thread in blockers:
        thread.start()
    wait_for(lambda: raw.info("clients")["blocked_clients"] >= 2, 10)
    with pytest.raises(PoolExhaustedError, match=r"connection pool limit reached.*max_connections"):
        job.client.get("strata:{tight}:x")
    try:
        job.client.get("strata:{tight}:x")
    except redis.ConnectionError as exc:  # callers catching redis' own class still do
        assert isinstance(exc, redis.exceptions.MaxConnectionsError)
        assert "unreachable" not in str(exc) and "2 connections" in str(exc)
    for thread in blockers:
        thread.join(10)
    # the heartbeat pool is separate: its heartbeats (every 0.2 s) went on while the pool was
    # full for 3 s (from it, each would have waited 0.5 s and failed: a warning), it lives
    assert raw.hget("strata:{tight}:status", "w") == "idle"
    assert worker.lost is None and worker.heartbeating
    assert not _problems(strata_logs)
    worker.deregister()
    job.close()


@pytest.mark.parametrize("bad", [0, 1, -5, 10**9, 2.5, "10", True])
def test_max_connections_is_checked(redis_url: str, bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="max_connections"):
        strata_redis.connect(redis_url, "x", max_connections=bad)  # type: ignore[arg-type]


def test_clients_have_timeouts_and_keepalive(redis_url: str) -> None:
    job = strata_redis.connect(redis_url, "k")
    kw = job.client.connection_pool.connection_kwargs
    assert kw["socket_timeout"] == connection.SOCKET_TIMEOUT
    assert kw["socket_keepalive"] is True and kw["socket_keepalive_options"]
    assert job.client.connection_pool.max_connections == connection.DEFAULT_MAX_CONNECTIONS
    hb = job.context.heartbeat_scripts.client
    assert hb is not job.client
    assert hb.connection_pool.max_connections == connection.HEARTBEAT_CONNECTIONS
    assert hb.connection_pool.connection_kwargs["socket_timeout"] < job.heartbeat_timeout
    # blocking commands block for less than the socket timeout
    assert job.context.max_block < kw["socket_timeout"]
    job.close()


@pytest.mark.timeout(90)
def test_silent_partition_ends_in_a_clear_error(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory()
    client = make_client(server.url, socket_timeout=1.0)
    client.ping()
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)  # the server stops answering; sockets stay open
    try:
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            client.get("x")
        # bounded: the socket timeout times redis-py's retries, not the outage's length
        assert time.monotonic() - started < 30
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    assert client.ping()
    client.close()

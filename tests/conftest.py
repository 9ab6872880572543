"""Fixtures: a real redis-server per session (flushed per test), fresh ones for fault tests,
and a real S3 endpoint (moto server mode) over HTTP on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

import strata_redis
from strata_redis.server import RedisClusterServers, RedisServer

from .s3server import MotoServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the session, on a free loopback port."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The session server's URL, flushed before each test."""
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
        client.script_flush()
    yield redis_server.url


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A plain decoding redis-py client on the test server, for looking at keys."""
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        yield client


@pytest.fixture
def job(redis_url: str) -> Iterator[strata_redis.Job]:
    """A job on the test server, with a short heartbeat timeout."""
    with strata_redis.connect(redis_url, job_id="test-job", heartbeat_timeout=2.0) as j:
        yield j


@pytest.fixture
def redis_factory() -> Iterator[Callable[..., RedisServer]]:
    """Fresh redis-servers for fault tests (``redis_factory(aof=True)``); stopped at the end."""
    servers: list[RedisServer] = []

    def make(**kwargs: object) -> RedisServer:
        server = RedisServer(**kwargs)  # type: ignore[arg-type]
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        server.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    """A private three-primary Redis Cluster for the session (tests use their own job ids)."""
    with RedisClusterServers(3) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoServer]:
    """A real S3 endpoint over HTTP on 127.0.0.1 (moto server mode)."""
    server = MotoServer().start()
    yield server
    server.stop()


@pytest.fixture
def s3_endpoint(s3_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """The S3 endpoint URL, reset before each test, with dummy credentials in the env."""
    s3_server.reset()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return s3_server.endpoint_url

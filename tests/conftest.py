"""Fixtures: a real redis-server per session (flushed per test), a real 3-primary Redis
Cluster per session (the contract tests run on both), fresh servers for fault tests, and a
real S3 endpoint (moto server mode) over HTTP on loopback."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

import strata_redis
from strata_redis.server import RedisClusterServers, RedisServer

from .s3server import MotoServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the session, on a free loopback port."""
    with RedisServer() as server:
        yield server


# -- the contract tests' two backends -------------------------------------------------------
#
# A module marked ``pytestmark = pytest.mark.both_backends`` runs each of its tests that uses
# ``redis_url``, ``raw``, ``job`` or ``job_id`` twice: on the session's redis-server
# ("single") and on the session's three-primary Redis Cluster ("cluster"). On the cluster
# each test gets its own job id, on a primary picked from the test's node id, and every
# primary is flushed before the test. A test that cannot run on a cluster says why with
# ``@pytest.mark.single_only("why")``; it then runs once, on the single server. Every other
# module runs once, on the single server, with the job id "test-job", as before.

BACKENDS = ("single", "cluster")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "both_backends: run the module's Redis tests on one redis-server and on a 3-primary "
        "Redis Cluster (the redis_backend fixture)",
    )
    config.addinivalue_line(
        "markers", "single_only(reason): in a both_backends module, run on the single server only"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    definition = metafunc.definition
    if definition.get_closest_marker("both_backends") is None:
        return
    single = definition.get_closest_marker("single_only")
    if single is not None:
        if not (single.args or single.kwargs.get("reason")):
            raise pytest.UsageError(f"{definition.nodeid}: single_only needs a reason")
        return  # redis_backend's default: the single server
    if "redis_factory" in metafunc.fixturenames:
        raise pytest.UsageError(
            f"{definition.nodeid}: uses redis_factory, so mark it single_only with the reason"
        )
    if "redis_backend" in metafunc.fixturenames:
        metafunc.parametrize("redis_backend", BACKENDS, indirect=True)


def job_on(node: int, nodes: int, prefix: str) -> str:
    """A job id whose keys hash to ``node``'s slots (``RedisClusterServers`` splits them
    evenly, in node order)."""
    per = 16384 // nodes
    for i in range(10_000):
        job_id = f"{prefix}-{i}"
        slot = key_slot(f"strata:{{{job_id}}}:x".encode())
        if min(slot // per, nodes - 1) == node:
            return job_id
    raise AssertionError("no job id found")  # pragma: no cover


class _ClusterRaw(RedisCluster):
    """A decoding RedisCluster for looking at keys: key commands go to the key's node, KEYS
    looks at every primary, and node commands (INFO, CLIENT LIST, SCRIPT EXISTS) go to the
    default node, which the ``raw`` fixture sets to the test job's primary."""

    def keys(self, pattern: Any = "*", **kwargs: Any) -> Any:
        kwargs.setdefault("target_nodes", self.PRIMARIES)
        return super().keys(pattern, **kwargs)

    def script_exists(self, *args: Any) -> Any:
        return self.execute_command("SCRIPT EXISTS", *args, target_nodes=self.get_default_node())


def decoding_client(url: str, **kwargs: Any) -> Any:
    """A plain decoding redis-py client for a ``redis://`` or ``redis+cluster://`` URL (for
    test-side keys such as "test:go", in test processes and their children)."""
    if url.startswith("redis+cluster://"):
        hosts = url.split("://", 1)[1].split(",")
        nodes = [ClusterNode(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1])) for h in hosts]
        return _ClusterRaw(startup_nodes=nodes, decode_responses=True, **kwargs)
    return redis.Redis.from_url(url, decode_responses=True, **kwargs)


@pytest.fixture
def redis_backend(request: pytest.FixtureRequest) -> str:
    """The backend: "single" or "cluster" (parametrised in both_backends modules)."""
    return str(getattr(request, "param", "single"))


@pytest.fixture
def redis_url(redis_backend: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """The session server's (or cluster's) URL, flushed before each test."""
    server: RedisServer | RedisClusterServers = request.getfixturevalue(
        "redis_cluster" if redis_backend == "cluster" else "redis_server"
    )
    with decoding_client(server.url) as client:
        client.flushall()
        client.script_flush()
    yield server.url


@pytest.fixture
def job_id(redis_backend: str, request: pytest.FixtureRequest) -> str:
    """The test's job id: the module's ``JOB`` (default "test-job") on a single server; on
    the cluster, that name with a suffix putting it on a primary picked from the test's id."""
    if request.node.get_closest_marker("both_backends") is None:
        return "test-job"
    base = str(getattr(request.module, "JOB", "test-job"))
    if redis_backend != "cluster":
        return base
    nodes = len(request.getfixturevalue("redis_cluster").nodes)
    return job_on(zlib.crc32(request.node.nodeid.encode()) % nodes, nodes, base)


@pytest.fixture
def raw(redis_url: str, job_id: str) -> Iterator[Any]:
    """A plain decoding redis-py client on the test server, for looking at keys (on the
    cluster: a RedisCluster whose node commands go to the job's primary)."""
    with decoding_client(redis_url) as client:
        if isinstance(client, RedisCluster):
            client.set_default_node(client.get_node_from_key(f"strata:{{{job_id}}}:x"))
        yield client


@pytest.fixture
def job(redis_url: str, job_id: str) -> Iterator[strata_redis.Job]:
    """A job on the test server, with a short heartbeat timeout."""
    with strata_redis.connect(redis_url, job_id=job_id, heartbeat_timeout=2.0) as j:
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


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest exports COLUMNS=80 to the processes it starts, and ``strata status`` fits its
    text to $COLUMNS: the tests read whole rows, so their commands get a wide one (the
    fitting itself is tested with explicit widths: test_dashboard_cli.py)."""
    monkeypatch.setenv("COLUMNS", "160")

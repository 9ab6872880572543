"""Connecting: URLs, host:port, clients, unix sockets, ACL users, TLS; no leaked secrets."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

import strata_redis
from strata_redis.connection import normalize_url, redact
from strata_redis.server import RedisServer, free_port

SECRET = "s3cr3t-Pa55word"


def roundtrip(job: strata_redis.Job) -> None:
    w = job.register_worker("w", heartbeat_interval=None)
    w.heartbeat()
    assert [i.worker_id for i in job.workers()] == ["w"]


def test_host_port_like_the_seeds(redis_server: RedisServer, redis_url: str) -> None:
    job = strata_redis.connect(f"127.0.0.1:{redis_server.port}", job_id="run-7")
    roundtrip(job)
    assert normalize_url("localhost:50051") == "redis://localhost:50051/0"
    assert normalize_url("localhost") == "redis://localhost:6379/0"
    assert normalize_url("[::1]:7000") == "redis://[::1]:7000/0"


@pytest.mark.parametrize("decode", [False, True])
def test_existing_client(redis_url: str, decode: bool) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=decode)
    job = strata_redis.connect(client, job_id="run-7")
    assert (job.client is client) == decode
    roundtrip(job)
    assert client.exists("strata:{run-7}:generation") == 1


def test_job_shares_another_jobs_client(redis_url: str) -> None:
    a = strata_redis.connect(redis_url, "a")
    b = strata_redis.connect(a, "b")
    assert b.client is a.client and b.job_id == "b"
    assert strata_redis.connect(b).job_id == "b", "a Job's id is kept when none is given"


def test_environment_defaults(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_REDIS_URL", redis_url)
    monkeypatch.setenv("STRATA_JOB_ID", "from-env")
    job = strata_redis.connect()
    assert job.job_id == "from-env"
    roundtrip(job)


@pytest.mark.parametrize(
    ("target", "exc", "match"),
    [
        ("http://localhost:6379", ValueError, "scheme"),
        ("not a host", ValueError, "host:port"),
        ("localhost:99999", ValueError, "port"),
        (6379, TypeError, "redis must be"),
    ],
)
def test_bad_targets(target: object, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        strata_redis.connect(target)  # type: ignore[arg-type]


def test_unix_socket(redis_factory: Callable[..., RedisServer], tmp_path: Path) -> None:
    sock = tmp_path / "redis.sock"
    redis_factory(extra=["--unixsocket", str(sock), "--unixsocketperm", "700"])
    job = strata_redis.connect(f"unix://{sock}?db=0", "run-7")
    roundtrip(job)
    assert repr(job) == f"Job('run-7', redis='unix://{sock}')"


@pytest.fixture
def acl_server(redis_factory: Callable[..., RedisServer]) -> RedisServer:
    return redis_factory(extra=["--user", "alice", "on", f">{SECRET}", "~*", "&*", "+@all"])


def test_acl_user_works_and_password_never_shown(
    acl_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"redis://alice:{SECRET}@127.0.0.1:{acl_server.port}/0"
    caplog.set_level(logging.DEBUG, logger="strata_redis")
    job = strata_redis.connect(url, "run-7")
    roundtrip(job)
    assert SECRET not in repr(job) and SECRET not in str(job)
    assert SECRET not in redact(url) and "alice" not in redact(url)
    assert SECRET not in caplog.text


def test_wrong_password_error_has_no_secret(acl_server: RedisServer) -> None:
    url = f"redis://alice:wrong-{SECRET}@127.0.0.1:{acl_server.port}/0"
    job = strata_redis.connect(url, "run-7")
    with pytest.raises(redis.AuthenticationError) as info:
        job.membership_generation()
    assert SECRET not in str(info.value)
    cli = subprocess.run(
        [sys.executable, "-m", "strata_redis", "status", "--redis-url", url, "--job", "run-7"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode != 0
    assert SECRET not in cli.stdout + cli.stderr


def test_tls(redis_factory: Callable[..., RedisServer], tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    tls_port = free_port()
    redis_factory(
        extra=[
            "--tls-port",
            str(tls_port),
            "--tls-cert-file",
            str(cert),
            "--tls-key-file",
            str(key),
            "--tls-ca-cert-file",
            str(cert),
            "--tls-auth-clients",
            "no",
        ]
    )
    job = strata_redis.connect(f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={cert}", "run-7")
    roundtrip(job)
    assert repr(job).startswith("Job('run-7', redis='rediss://127.0.0.1:")

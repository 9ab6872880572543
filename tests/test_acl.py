"""Least privilege: a worker runs under the docs' worker ACL rule (docs/operations/redis.md),
``strata status`` under the read-only one; credentials never echoed in any target form; a CLI
permission error is one line."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import redis

import strata_redis
from strata_redis import ShardManager
from strata_redis.connection import normalize_url, redact
from strata_redis.server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
SECRET = "Sup3r-s3cret-pw"
JOB = "run-7"


#: the page that gives the ACL rules operators copy
RULES_PAGE = ROOT / "docs" / "operations" / "redis.md"


def readme_rule(marker: str) -> str:
    """The ACL rule the docs give under ``marker`` (one ``ACL SETUSER`` line)."""
    text = RULES_PAGE.read_text()
    match = re.search(rf"<!-- {marker} -->\n```\n(ACL SETUSER [^\n]+)\n```", text)
    assert match, f"{RULES_PAGE.name} has no {marker} rule"
    return match.group(1)


def setuser(admin: redis.Redis, rule: str, user: str, job: str) -> None:
    words = rule.replace("<job>", job).replace("<password>", SECRET).split()
    assert words[:2] == ["ACL", "SETUSER"]
    words[2] = user
    admin.execute_command(*words)


@pytest.fixture
def acl_redis(redis_factory: Callable[..., RedisServer]) -> tuple[RedisServer, redis.Redis]:
    server = redis_factory()
    admin = redis.Redis.from_url(server.url, decode_responses=True)
    setuser(admin, readme_rule("acl-worker"), "worker", JOB)
    setuser(admin, readme_rule("acl-reader"), "reader", JOB)
    admin.acl_log_reset()
    return server, admin


def status_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strata_redis", "status", "--redis-url", url, *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.timeout(120)
def test_worker_runs_under_the_worker_rule_and_status_under_the_reader(
    acl_redis: tuple[RedisServer, redis.Redis], tmp_path: Path
) -> None:
    server, admin = acl_redis
    url = f"redis://worker:{SECRET}@127.0.0.1:{server.port}/0"
    job = strata_redis.connect(url, JOB, heartbeat_timeout=5.0)
    ShardManager(job).register_dataset_params("ds", 100, 10, True, 1)
    worker = job.register_worker("w-0", heartbeat_interval=0.5)
    worker.set_status("training")
    release = job.barrier("start", expected=1, timeout=30).wait("w-0")
    assert release.participants == 1
    done = 0
    for lease in job.leases("ds", 0, "w-0"):
        assert lease.complete()
        done += 1
    assert done == 10
    with strata_redis.CheckpointManager(
        tmp_path / "store", redis=url, job_id=JOB, worker_id="w-0"
    ) as ckpt:
        ckpt.save(np.arange(1000.0), step=1).result(60)
        assert ckpt.load(step=1) is not None
    assert job.reap() == []
    assert [w.status for w in job.workers()] == ["training"]
    assert admin.acl_log() == [], "a command or key was refused"

    reader = f"redis://reader:{SECRET}@127.0.0.1:{server.port}/0"
    shown = status_cli(reader, "--job", JOB)
    assert shown.returncode == 0, shown.stderr
    assert "w-0" in shown.stdout and "1 live of 1 workers" in shown.stdout
    listed = status_cli(reader)
    assert listed.returncode == 0 and listed.stdout.split() == [JOB], listed.stderr
    assert admin.acl_log() == [], "the reader was refused something"
    # the reader cannot write, and the worker cannot touch another job
    with redis.Redis.from_url(reader) as client, pytest.raises(redis.exceptions.NoPermissionError):
        client.hset(f"strata:{{{JOB}}}:status", "w-0", "failed")
    other = strata_redis.connect(url, "other-job")
    with pytest.raises(redis.exceptions.NoPermissionError):
        other.register_worker("x", heartbeat_interval=None)
    worker.deregister()
    job.close()


@pytest.mark.timeout(120)
def test_the_training_loop_runs_under_the_worker_rule(
    acl_redis: tuple[RedisServer, redis.Redis], tmp_path: Path
) -> None:
    server, admin = acl_redis
    url = f"redis://worker:{SECRET}@127.0.0.1:{server.port}/0"
    ShardManager(url, job_id=JOB).register_dataset_params("ds", 200, 20, True, 1)
    with strata_redis.TrainingOrchestrator(
        url, "w-0", job_id=JOB, checkpoint_path=tmp_path / "store", last_call=0.1
    ) as orch:  # fmt: skip
        for epoch in range(2):
            for step, _batch in enumerate(orch.get_shards("ds", batch_size=8)):
                if step % 10 == 0:
                    orch.save_checkpoint(step=step, epoch=epoch, state=b"model")
            orch.advance_epoch()
    with strata_redis.TrainingOrchestrator(
        url, "w-0", job_id=JOB, checkpoint_path=tmp_path / "store", last_call=0.1
    ) as orch:  # fmt: skip
        assert orch.resumed is not None and orch.load_state() == b"model"
        # a lockstep walk (HSETNX of its quota, hand-backs with offsets) as DDP loops use
        stream = orch.get_shards("ds", batch_size=8, lockstep=True, track_consumption=True)
        for _batch in stream:
            stream.consumed(1)
        orch.advance_epoch()
    assert admin.acl_log() == [], "a command or key was refused"


@pytest.mark.torch
def test_the_torch_store_runs_under_the_worker_rule(
    acl_redis: tuple[RedisServer, redis.Redis],
) -> None:
    from strata_redis.torch import RedisStore

    server, admin = acl_redis
    url = f"redis://worker:{SECRET}@127.0.0.1:{server.port}/0"
    job = strata_redis.connect(url, job_id=JOB)
    store = RedisStore(job, 1, timeout=1.0)
    store.set("k", b"v")
    assert store.get("k") == b"v" and store.add("n", 1) == 1
    assert store.compare_set("k", b"v", b"w") == b"w" and store.check(["k", "n"])
    assert store.delete_key("n") and store.num_keys() == 1
    store.append("k", b"x")  # the extended API (WATCH/MULTI, HMGET, HSET of many)
    store.multi_set(["a", "b"], [b"1", b"2"])
    assert store.multi_get(["k", "a", "b"]) == [b"wx", b"1", b"2"]
    clone = store.clone()  # a client of its own, with the same user
    assert clone.get("a") == b"1"
    del clone, store
    job.close()
    assert admin.acl_log() == [], "a command or key was refused"


def test_the_dashboard_runs_under_the_reader_rule(
    acl_redis: tuple[RedisServer, redis.Redis], tmp_path: Path
) -> None:
    from strata_redis.dashboard.app import create_app

    server, admin = acl_redis
    worker_url = f"redis://worker:{SECRET}@127.0.0.1:{server.port}/0"
    ShardManager(worker_url, job_id=JOB).register_dataset_params("ds", 100, 10, True, 1)
    with strata_redis.TrainingOrchestrator(
        worker_url, "w-0", job_id=JOB, checkpoint_path=tmp_path, last_call=0.1
    ) as orch:  # fmt: skip
        for _batch in orch.get_shards("ds", batch_size=10):
            pass
        orch.save_checkpoint(step=1, epoch=0, state=b"m")
        orch.wait_for_checkpoints(30)
        client = create_app(
            f"redis://reader:{SECRET}@127.0.0.1:{server.port}/0", min_interval=0
        ).test_client()
        for _ in range(2):  # the second read has rates to compute
            reply = client.get(f"/api/dashboard?job={JOB}")
            assert reply.status_code == 200, reply.get_data(as_text=True)
        doc = reply.get_json()
        assert [w["worker_id"] for w in doc["workers"]] == ["w-0"]
        assert doc["checkpoints"] and doc["datasets"]
        for path in (f"/job/{JOB}", "/metrics", "/"):
            assert client.get(path).status_code == 200, path
        assert SECRET not in client.get(f"/job/{JOB}").get_data(as_text=True)
    assert admin.acl_log() == [], "a command or key was refused"


@pytest.mark.parametrize("job_arg", [[], ["--job", JOB], ["--job", "other-job"]])
def test_cli_permission_error_is_one_line(
    acl_redis: tuple[RedisServer, redis.Redis], job_arg: list[str]
) -> None:
    server, admin = acl_redis
    # a user that may connect but read nothing
    admin.execute_command("ACL", "SETUSER", "nobody", "on", f">{SECRET}", "+ping")
    url = f"redis://nobody:{SECRET}@127.0.0.1:{server.port}/0"
    run = status_cli(url, *job_arg)
    assert run.returncode == 1, run
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert "permission" in lines[0].lower() and SECRET not in run.stdout + run.stderr


def _targets(port: int, password: str) -> list[str]:
    return [
        f"redis://alice:{password}@127.0.0.1:{port}/0",
        f"redis://:{password}@127.0.0.1:{port}/0",
        f"rediss://alice:{password}@127.0.0.1:{port}/0",
        f"alice:{password}@127.0.0.1:{port}",
        f"{password}@127.0.0.1:{port}",
        f"alice:{password}@127.0.0.1",
        f"redis://127.0.0.1:{port}/0?password={password}",
    ]


def test_scheme_less_credentials_are_accepted(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory(extra=["--user", "alice", "on", f">{SECRET}", "~*", "&*", "+@all"])
    job = strata_redis.connect(f"alice:{SECRET}@127.0.0.1:{server.port}", JOB)
    job.register_worker("w", heartbeat_interval=None).deregister()
    assert SECRET not in repr(job) and SECRET not in repr(job.context)
    assert normalize_url(f"alice:{SECRET}@h:1") == f"redis://alice:{SECRET}@h:1/0"


@pytest.mark.timeout(120)
def test_no_error_path_echoes_a_secret(redis_factory: Callable[..., RedisServer]) -> None:
    server = redis_factory(extra=["--user", "alice", "on", f">{SECRET}", "~*", "&*", "+@all"])
    wrong = f"wrong-{SECRET}"
    closed = server.port + 1 if server.port < 65535 else server.port - 1
    cases: list[str] = []
    for port, password in ((server.port, wrong), (closed, SECRET)):
        # (TLS to the plain server only times out, after the 30 s socket timeout: skipped)
        cases += [t for t in _targets(port, password) if port == closed or "rediss" not in t]
    # malformed forms: bad scheme, bad port, stray characters, a '/' in the password
    cases += [
        f"http://alice:{SECRET}@127.0.0.1:6379",
        f"alice:{SECRET}@127.0.0.1:99999",
        f"alice:{SECRET}@bad host:1",
        f"alice:{SECRET}/x@127.0.0.1:1",
        f"redis://alice:{SECRET}@127.0.0.1:notaport/0",
        f"redis://alice:{SECRET}@[::1/0",
    ]
    for target in cases:
        assert SECRET not in redact(target), target
        texts: list[str] = []
        try:
            # (a closed port is an outage the call rides out: a short budget)
            job = strata_redis.connect(target, JOB, redis_retry=0.2)
            texts += [repr(job), repr(job.context), str(job.context)]
            job.membership_generation()
        except Exception as exc:  # every error path: its message, its chain
            seen: BaseException | None = exc
            while seen is not None:
                texts += [str(seen), repr(seen)]
                seen = seen.__cause__ or seen.__context__
        run = status_cli(target, "--job", JOB)  # (the default user takes any password)
        assert "Traceback" not in run.stderr, run.stderr
        texts += [run.stdout, run.stderr]
        listed = status_cli(target)
        texts += [listed.stdout, listed.stderr]
        for text in texts:
            assert SECRET not in text, (target, text)

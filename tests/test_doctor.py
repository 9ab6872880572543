"""``strata doctor``: one line per check of the Redis (version, round trip, mode,
persistence, memory policy, ACL rights), exit 1 when a check fails, on real servers."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import orjson
import pytest
import redis

from strata_redis.server import RedisClusterServers, RedisServer

from .procs import wait_for
from .test_acl import JOB, SECRET, readme_rule, setuser


def doctor(url: str, *args: str) -> tuple[int, dict[str, tuple[str, str]], str]:
    """Run ``strata doctor --json``: exit code, check -> (level, detail), stderr."""
    run = subprocess.run(
        [sys.executable, "-m", "strata_redis", "doctor", "--redis-url", url, "--json", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    checks = {c["check"]: (c["level"], c["detail"]) for c in orjson.loads(run.stdout or "[]")}
    return run.returncode, checks, run.stderr


def test_a_plain_server_passes_with_a_word_on_persistence(
    redis_factory: Callable[..., RedisServer],
) -> None:
    code, checks, err = doctor(redis_factory().url)
    assert code == 0, err
    assert checks["redis"][0] == "ok" and "Redis 7." in checks["redis"][1]
    assert "round trip" in checks["redis"][1]
    assert checks["mode"] == ("ok", "standalone")
    level, detail = checks["persistence"]
    assert level == "warn" and "StateLostError" in detail  # no AOF, no snapshots
    assert checks["memory"][0] == "ok" and "noeviction" in checks["memory"][1]
    assert checks["worker rights"][0] == checks["reader rights"][0] == "ok"


def test_an_evicting_policy_fails_and_aof_passes(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory(aof=True, extra=["--maxmemory", "64mb", "--maxmemory-policy",
                                            "volatile-lru"])  # fmt: skip
    code, checks, _ = doctor(server.url)
    assert code == 1
    assert checks["memory"][0] == "fail" and "'volatile-lru'" in checks["memory"][1]
    assert checks["persistence"] == ("ok", "AOF on (appendfsync always)")
    # the text form: one line per check, the level first
    run = subprocess.run([sys.executable, "-m", "strata_redis", "doctor", "--redis-url",
                          server.url], capture_output=True, text=True, timeout=60)  # fmt: skip
    lines = run.stdout.splitlines()
    assert run.returncode == 1 and len(lines) == len(checks)
    assert [line.split()[0] for line in lines] == [level for level, _ in checks.values()]


def test_snapshots_only_are_a_rollback_risk(redis_factory: Callable[..., RedisServer]) -> None:
    server = redis_factory(extra=["--save", "3600 1"])
    code, checks, _ = doctor(server.url)
    level, detail = checks["persistence"]
    assert code == 0 and level == "warn" and "StateRolledBackError" in detail, detail


@pytest.mark.parametrize("user, ok, missing", [
    ("worker", "worker rights", "reader rights"),
    ("reader", "reader rights", "worker rights"),
])  # fmt: skip
def test_the_readme_users_have_their_rights_and_only_them(
    redis_factory: Callable[..., RedisServer], user: str, ok: str, missing: str
) -> None:
    server = redis_factory()
    admin = redis.Redis.from_url(server.url, decode_responses=True)
    setuser(admin, readme_rule(f"acl-{user}"), user, JOB)
    url = f"redis://{user}:{SECRET}@127.0.0.1:{server.port}/0"
    code, checks, err = doctor(url, "--job", JOB)
    assert code == 0, (checks, err)
    assert checks[ok][0] == "ok" and f"user {user}" in checks[ok][1]
    if user == "reader":  # a reader can watch every job, and write none
        assert checks[missing][0] == "warn" and "a write (SET)" in checks[missing][1]
    # the probes left nothing behind
    assert admin.keys(f"strata:{{{JOB}}}:doctor:*") == []
    admin.close()


def test_a_user_with_neither_rights_fails(redis_factory: Callable[..., RedisServer]) -> None:
    server = redis_factory()
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", "nobody", "on", f">{SECRET}", "+ping")
    code, checks, err = doctor(f"redis://nobody:{SECRET}@127.0.0.1:{server.port}/0")
    assert code == 1, err
    assert checks["rights"][0] == "fail" and "user nobody" in checks["rights"][1]
    assert checks["persistence"][0] == "warn" and "not allowed" in checks["persistence"][1]
    admin.close()


@pytest.mark.timeout(120)
def test_a_cluster_node_through_a_plain_url_fails(redis_cluster: RedisClusterServers) -> None:
    node = redis_cluster.nodes[0]
    code, checks, _ = doctor(node.url)
    assert code == 1 and checks["mode"][0] == "fail" and "redis+cluster://" in checks["mode"][1]
    code, checks, err = doctor(redis_cluster.url)
    assert checks["mode"] == ("ok", "Redis Cluster"), (checks, err)


def test_durability_says_which_mode_the_deployment_can_honour(
    redis_factory: Callable[..., RedisServer],
) -> None:
    """0 replicas: only the default durability; 1 replica in sync: ``replicated`` too."""
    primary = redis_factory(aof=True)
    code, checks, err = doctor(primary.url)
    level, detail = checks["durability"]
    assert code == 0 and level == "warn", (checks, err)
    assert detail.startswith("durability replicated: cannot be honoured (no replica)"), detail
    assert "AOF appendfsync always, no WAITAOF (Redis < 7.2)" in detail
    replica = redis_factory(extra=["--replicaof", "127.0.0.1", str(primary.port)])
    with redis.Redis.from_url(replica.url) as copy:
        wait_for(lambda: copy.info("replication")["master_link_status"] == "up", 30)
    with redis.Redis.from_url(primary.url) as client:  # the primary has seen its first ack
        wait_for(lambda: client.execute_command("WAIT", 1, 100) == 1, 30)
    code, checks, err = doctor(primary.url)
    level, detail = checks["durability"]
    assert code == 0 and level == "ok", (checks, err)
    assert detail.startswith("durability replicated: can be honoured (1 of 1 replica(s) in "
                             "sync; a failover can only promote that replica"), detail  # fmt: skip

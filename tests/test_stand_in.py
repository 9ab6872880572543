"""The script contracts on both a real redis-server and the in-process stand-in (fakeredis).

The stand-in runs the same Lua files. It cannot stand in for persistence, a killed server,
or the network; those tests use a real server only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import strata_redis
import strata_redis.testing
from strata_redis.errors import WorkerFailedError


@pytest.fixture(params=["redis-server", "fakeredis"])
def any_job(request: pytest.FixtureRequest) -> Iterator[strata_redis.Job]:
    if request.param == "redis-server":
        url = request.getfixturevalue("redis_url")
        job = strata_redis.connect(url, "t", heartbeat_timeout=0.3)
    else:
        job = strata_redis.testing.connect("t", heartbeat_timeout=0.3)
    yield job
    job.close()


def test_every_script_loads(any_job: strata_redis.Job) -> None:
    names = any_job.scripts.names()
    assert {"register_worker", "heartbeat", "deregister_worker", "reap_workers"} <= set(names)
    for name in names:
        assert any_job.client.script_load(any_job.scripts[name].script) == any_job.scripts[name].sha


def test_registry_contract(any_job: strata_redis.Job) -> None:
    a = any_job.register_worker("a", heartbeat_interval=None)
    b = any_job.register_worker("b", heartbeat_interval=None)
    a.set_status("training")
    assert any_job.live_workers() == ["a", "b"]
    b.deregister()
    time.sleep(0.35)  # a's heartbeat goes stale on the server's clock
    assert any_job.reap() == ["a"]
    assert any_job.reap() == []
    assert [(w.worker_id, w.status) for w in any_job.workers()] == [("a", "failed"), ("b", "left")]
    assert any_job.membership_generation() == 4
    with pytest.raises(WorkerFailedError):
        a.heartbeat()
    assert any_job.register_worker("a", heartbeat_interval=None).incarnation == 5


def test_two_jobs_on_one_fake_server_share_state() -> None:
    server = strata_redis.testing.FakeServer()
    one = strata_redis.testing.connect("shared", server=server)
    two = strata_redis.testing.connect("shared", server=server)
    one.register_worker("w", heartbeat_interval=None)
    assert two.live_workers() == ["w"]


def test_lease_contract(any_job: strata_redis.Job) -> None:
    strata_redis.ShardManager(any_job).register_dataset_params("ds", 50, 10)
    any_job.register_worker("a", heartbeat_interval=None)
    leases = any_job.leases("ds", 0, "a", ttl=60)
    first = leases.acquire()
    assert first is not None
    leases.renew(first)
    leases.release(first)
    tokens = []
    while (lease := leases.acquire()) is not None:
        tokens.append(lease.token)
        assert lease.complete() is True
    assert tokens == sorted(tokens) and tokens[0] > first.token
    assert sorted(leases.completions()) == list(range(5))
    with pytest.raises(strata_redis.LeaseLostError):
        first.complete()

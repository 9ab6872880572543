"""The durability knob: ``min_replicas`` makes lease grants, completions and checkpoint
commits ``WAIT`` for replicas; a replica that does not keep up is logged and counted."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable

import pytest
import redis

import strata_redis
from strata_redis.server import RedisServer

from .procs import wait_for


def test_min_replicas_waits_for_replicas_and_reports_a_stalled_one(
    redis_factory: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    primary = redis_factory()
    replica = redis_factory(extra=["--replicaof", "127.0.0.1", str(primary.port)])
    copy = redis.Redis.from_url(replica.url, decode_responses=True)
    wait_for(lambda: copy.info("replication")["master_link_status"] == "up", 30)
    job = strata_redis.connect(primary.url, "rep", min_replicas=1, replica_timeout=0.5)
    strata_redis.ShardManager(job).register_dataset_params("ds", 40, 10)
    job.register_worker("w", heartbeat_interval=None)
    leases = job.leases("ds", 0, "w")
    lease = leases.acquire()
    assert lease is not None
    # WAIT returned: the grant is on the replica when acquire returns
    assert copy.hget(leases.keys.holders, str(lease.shard_id)) is not None
    assert job.context.scripts.shortfalls == 0

    assert replica.proc is not None
    os.kill(replica.proc.pid, signal.SIGSTOP)  # the replica stops acknowledging
    try:
        with caplog.at_level(logging.WARNING, logger="strata_redis.era"):
            start = time.monotonic()
            assert leases.complete(lease)  # done on the primary all the same
            waited = time.monotonic() - start
        assert waited >= 0.4, waited  # it waited for the replica, up to the timeout
        assert job.context.scripts.shortfalls == 1
        assert "acquire_shard: 0 of 1 replicas had its writes" in caplog.text
        # without the knob nothing waits and nothing is counted
        plain = strata_redis.connect(primary.url, "rep")
        other = plain.leases("ds", 0, "w").acquire()
        assert other is not None and plain.context.scripts.shortfalls == 0
        plain.close()
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    copy.close()
    job.close()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"min_replicas": -1}, "min_replicas"),
        ({"min_replicas": 1, "replica_timeout": 0}, "replica_timeout"),
    ],
)
def test_bad_durability_arguments_are_refused(
    redis_url: str, options: dict[str, float], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        strata_redis.connect(redis_url, "rep", **options)  # type: ignore[arg-type]

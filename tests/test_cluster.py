"""Redis Cluster: a ``redis+cluster://`` URL or a ``RedisCluster`` client puts each job's
state on its primary (one hash tag per job: its keys, scripts and transactions stay in its
slot); ``strata status`` lists the jobs of every primary; a plain client sent to the wrong
node says how to connect; the seeds' loop runs on a cluster.

The registry, barrier, lease and checkpoint contract tests (test_workers, test_barrier,
test_leases, test_checkpoint) run on this cluster as on a single server: see conftest's
``redis_backend``."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

import strata_redis
from strata_redis.server import RedisClusterServers

from . import test_e2e
from .conftest import job_on
from .procs import join_all


def test_each_jobs_state_lives_on_its_primary(redis_cluster: RedisClusterServers) -> None:
    """(The registry, barrier, lease and checkpoint contract tests run on this cluster too,
    parametrised by conftest's redis_backend; this checks where a job's keys land.)"""
    nodes = len(redis_cluster.nodes)
    for node in range(nodes):
        job_id = job_on(node, nodes, "home")
        # the URL for two of them, a (non-decoding) RedisCluster client for the other
        target: str | RedisCluster = redis_cluster.url
        if node == 1:
            target = RedisCluster(host="127.0.0.1", port=redis_cluster.nodes[0].port)
        with strata_redis.connect(target, job_id, heartbeat_timeout=2.0) as job:
            assert "redis+cluster://" in repr(job)
            job.register_worker("w", heartbeat_interval=None).set_status("training")
            strata_redis.ShardManager(job).register_dataset_params("ds", 100, 10)
            lease = job.leases("ds", 0, "w").acquire()
            assert lease is not None and lease.complete()
            # the job's state lives on its node, era included, and on no other node
            for i, server in enumerate(redis_cluster.nodes):
                with redis.Redis(port=server.port, decode_responses=True) as client:
                    keys = client.keys(f"strata:{{{job_id}}}:*")
                    if i == node:
                        assert client.get(job.keys.era) == job.context.era.value()
                        assert job.keys.heartbeats in keys and len(keys) > 3
                    else:
                        assert keys == [], (i, keys)
        if isinstance(target, RedisCluster):
            target.close()


def test_status_lists_the_jobs_of_every_primary(redis_cluster: RedisClusterServers) -> None:
    nodes = len(redis_cluster.nodes)
    ids = [job_on(n, nodes, "listed") for n in range(nodes)]
    for job_id in ids:
        job = strata_redis.connect(redis_cluster.url, job_id)
        job.register_worker("w", heartbeat_interval=None).set_status("training")
        job.close()
    run = [sys.executable, "-m", "strata_redis", "status", "--redis-url", redis_cluster.url]
    listed = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert set(ids) <= set(listed.stdout.split())
    one = subprocess.run([*run, "--job", ids[2]], capture_output=True, text=True, timeout=60)
    assert one.returncode == 0, one.stderr
    assert any(line.split()[:2] == ["w", "training"] for line in one.stdout.splitlines())


def test_a_plain_url_to_the_wrong_node_says_how_to_connect(
    redis_cluster: RedisClusterServers,
) -> None:
    nodes = len(redis_cluster.nodes)
    job = strata_redis.connect(redis_cluster.nodes[0].url, job_on(1, nodes, "plain"))
    with pytest.raises(ValueError, match=r"redis\+cluster://"):
        job.register_worker("w", heartbeat_interval=None)
    job.close()


def test_bad_cluster_arguments_are_refused(redis_cluster: RedisClusterServers) -> None:
    with pytest.raises(ValueError, match="min_replicas"):
        strata_redis.connect(redis_cluster.url, "x", min_replicas=1)
    with pytest.raises(ValueError, match="durability='replicated'"):
        strata_redis.connect(redis_cluster.url, "x", durability="replicated")
    for url in ("redis+cluster://", "redis+cluster://h:1,,h:2", "redis+cluster://h:99999"):
        with pytest.raises(ValueError, match="redis"):
            strata_redis.connect(url, "x")
    with pytest.raises(ValueError) as info:
        strata_redis.connect("redis+cluster://user:s3cret@h:1,:2", "x")
    assert "s3cret" not in str(info.value)


@pytest.mark.timeout(240)
def test_the_seeds_loop_on_a_cluster(redis_cluster: RedisClusterServers, tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "ckpt").mkdir()
    url = redis_cluster.url
    params = test_e2e._register(url, total=2000, per_shard=100)
    procs = test_e2e._start(url, tmp_path, ["worker-01", "worker-02"],
                            {"min_workers": 2, "sleep": 0.002})  # fmt: skip
    assert join_all(procs, timeout=180) == [0, 0]
    samples = test_e2e._samples(tmp_path / "logs")
    for epoch in (0, 1):
        assert samples[epoch] == Counter(range(params.total_samples)), epoch

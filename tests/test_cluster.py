"""Redis Cluster: a ``redis+cluster://`` URL or a ``RedisCluster`` client works for jobs on
every primary (one hash tag per job: each job's keys, scripts and transactions stay in its
slot); ``strata status`` lists the jobs of every primary; a plain client sent to the wrong
node says how to connect; the seeds' loop runs on a cluster."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

import strata_redis
from strata_redis.server import RedisClusterServers

from . import test_e2e
from .procs import join_all, wait_for


def _job_on(node: int, nodes: int, prefix: str) -> str:
    """A job id whose keys hash to ``node``'s slots (the fixture splits slots evenly)."""
    per = 16384 // nodes
    for i in range(10_000):
        job_id = f"{prefix}-{i}"
        slot = key_slot(f"strata:{{{job_id}}}:x".encode())
        if min(slot // per, nodes - 1) == node:
            return job_id
    raise AssertionError("no job id found")  # pragma: no cover


def _exercise(job: strata_redis.Job, ckpt: Path) -> None:
    """Registry, heartbeats, reaper, a barrier, a lease drain, a two-rank checkpoint."""
    a = job.register_worker("a", heartbeat_interval=0.2)
    b = job.register_worker("b", heartbeat_interval=0.2)
    silent = job.register_worker("silent", heartbeat_interval=None)
    # the barrier: both released, the same generation
    releases: list[int] = []
    threads = [
        threading.Thread(target=lambda w=w: releases.append(job.barrier("b", 2).wait(w).generation))
        for w in ("a", "b")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(releases) == 2 and len(set(releases)) == 1
    # leases: two workers drain 40 shards, each completed once
    strata_redis.ShardManager(job).register_dataset_params("ds", 400, 10)
    done: list[int] = []

    def drain(worker: str) -> None:
        for lease in job.leases("ds", 0, worker):
            if lease.complete():
                done.append(lease.shard_id)

    threads = [threading.Thread(target=drain, args=(w,)) for w in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(done) == list(range(40))
    assert sorted(job.leases("ds", 0, "a").completions()) == list(range(40))
    # a two-rank checkpoint commits
    managers = [
        strata_redis.CheckpointManager(ckpt, redis=job, worker_id=w, rank=r, world_size=2)
        for r, w in enumerate(("a", "b"))
    ]
    futures = [m.save(bytes([r]) * 1000, step=1) for r, m in enumerate(managers)]
    assert [f.result(timeout=60).step for f in futures] == [1, 1]
    assert [i.step for i in managers[0].list()] == [1]
    for m in managers:
        m.close()
    # the reaper declares the silent worker failed (the others heartbeat)
    wait_for(lambda: {w.worker_id: w.status for w in job.workers()}["silent"] == "failed", 15)
    assert silent.lost is None or isinstance(silent.lost, strata_redis.StrataError)
    assert a.lost is None and b.lost is None
    a.leave()
    b.leave()


@pytest.mark.timeout(240)
def test_jobs_on_every_primary_work(redis_cluster: RedisClusterServers, tmp_path: Path) -> None:
    nodes = len(redis_cluster.nodes)
    for node in range(nodes):
        job_id = _job_on(node, nodes, "every")
        # the URL for two of them, a (non-decoding) RedisCluster client for the other
        target: str | RedisCluster = redis_cluster.url
        if node == 1:
            target = RedisCluster(host="127.0.0.1", port=redis_cluster.nodes[0].port)
        job = strata_redis.connect(target, job_id, heartbeat_timeout=2.0)
        assert "redis+cluster://" in repr(job)
        _exercise(job, tmp_path / job_id)
        # the job's state lives on its node, era included
        with redis.Redis(port=redis_cluster.nodes[node].port, decode_responses=True) as owner:
            assert owner.get(job.keys.era) == job.context.era.value()
        job.close()


def test_status_lists_the_jobs_of_every_primary(redis_cluster: RedisClusterServers) -> None:
    nodes = len(redis_cluster.nodes)
    ids = [_job_on(n, nodes, "listed") for n in range(nodes)]
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
    job = strata_redis.connect(redis_cluster.nodes[0].url, _job_on(1, nodes, "plain"))
    with pytest.raises(ValueError, match=r"redis\+cluster://"):
        job.register_worker("w", heartbeat_interval=None)
    job.close()


def test_bad_cluster_arguments_are_refused(redis_cluster: RedisClusterServers) -> None:
    with pytest.raises(ValueError, match="min_replicas"):
        strata_redis.connect(redis_cluster.url, "x", min_replicas=1)
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

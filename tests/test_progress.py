"""Training progress: the lease owner's lifetime counts (steals, samples trained by worker), and
what the dashboard, ``/metrics`` and ``strata status`` make of them, over real workers."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
from prometheus_client.parser import text_string_to_metric_families

import strata_redis
from strata_redis import ShardManager
from strata_redis.cli.views import render
from strata_redis.coordination.lifecycle import delete_job
from strata_redis.dashboard import DashboardState, create_app
from strata_redis.dashboard.app import schema_text
from strata_redis.dashboard.document import document
from strata_redis.data.record import lease_totals
from strata_redis.storage import LocalStorage

from .conftest import decoding_client
from .procs import join_all, spawn, wait_for

JOB = "progress-job"
#: the workers' heartbeat timeout, and the dashboard's: nothing here waits for a worker to go
#: stale or fail, so 6 s, and a heartbeat stalled a few seconds on a loaded machine neither
#: gets a trainer reaped nor drops it from the "slowest" ranking
TIMEOUT = 6.0
SAMPLES, PER_SHARD = 3000, 10


def metric(redis_url: str, name: str, **labels: str) -> float:
    """The one sample of ``name`` (a counter's ``_total``) with ``labels`` in ``/metrics``."""
    body = create_app(redis_url, min_interval=0).test_client().get("/metrics")
    assert body.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(body.get_data(as_text=True))}
    matches = [s.value for s in families[name].samples
               if all(s.labels.get(k) == v for k, v in labels.items())
               and s.name in (name, f"{name}_total")]  # fmt: skip
    assert len(matches) == 1, (name, labels, families[name].samples)
    return matches[0]


def test_steals_survive_an_epoch_change(job: strata_redis.Job, redis_url: str) -> None:
    ShardManager(job).register_dataset_params("ds", 200, 10)
    job.register_worker("a", heartbeat_interval=None)
    job.register_worker("b", heartbeat_interval=None)
    per_epoch = []
    for epoch in (0, 1):
        assert job.current_epoch() == epoch
        la = job.leases("ds", epoch, "a")
        while (lease := la.acquire()) is not None:
            lease.complete()  # b does nothing: a steals each of b's shards
        per_epoch.append(la.progress().steals)
        if epoch == 0:
            with ThreadPoolExecutor(2) as pool:
                assert set(pool.map(lambda w: job.advance_epoch(w, timeout=30), "ab")) == {1}
    assert all(s > 0 for s in per_epoch), per_epoch
    # the epoch's own count started again at 1; the lifetime one did not
    assert job.leases("ds", 1, "a").progress().steals == per_epoch[1]
    totals = lease_totals(job.context, "ds")
    assert totals.steals == sum(per_epoch)
    assert metric(redis_url, "strata_lease_steals", job_id=job.job_id, dataset="ds") == sum(
        per_epoch
    )
    # every sample of both epochs was trained, all by a
    assert (totals.samples, totals.by_worker) == (400, {"a": 400})
    assert metric(redis_url, "strata_samples_trained", job_id=job.job_id) == 400


def test_a_hand_back_counts_the_part_taken(job: strata_redis.Job) -> None:
    ShardManager(job).register_dataset_params("ds", 200, 10)
    job.register_worker("a", heartbeat_interval=None)
    job.register_worker("b", heartbeat_interval=None)
    la = job.leases("ds", 0, "a")
    lease = la.acquire()
    assert lease is not None
    lease.release(4)  # a took the first 4 samples of the shard
    lease = la.acquire()
    assert lease is not None
    lease.release()  # no offset: nothing taken, nothing counted
    lb = job.leases("ds", 0, "b")
    starts = {}
    while (lease := lb.acquire()) is not None:
        starts[lease.shard_id] = lease.start
        assert lease.complete()
    assert sorted(starts.values())[-1] == 4, "the hand-back's next grant starts at its offset"
    totals = lease_totals(job.context, "ds", ["a", "b", "c"])
    assert totals.by_worker == {"a": 4, "b": 196} and totals.samples == 200
    # a retried completion (same token) records nothing twice
    lease = job.leases("ds", 1, "b").acquire()
    assert lease is not None
    assert lease.owner.complete(lease, prefetch=False)
    assert not lease.owner.complete(lease, prefetch=False)
    assert lease_totals(job.context, "ds").samples == 200 + len(lease.shard)


def _trainer(url: str, worker_id: str, pause: float, checkpoints: str) -> None:
    """A worker process: waits for its peer, drains epoch 0 (``pause`` s a shard), then the
    fast one saves a checkpoint; then idles (heartbeating) until killed."""
    job = strata_redis.connect(url, JOB, heartbeat_timeout=TIMEOUT)
    job.register_worker(worker_id, heartbeat_interval=0.2)
    job.barrier("go", expected=2).wait(worker_id, timeout=60)
    for lease in job.leases("images", 0, worker_id, ttl=5):
        time.sleep(pause)  # "train" on it
        lease.complete()
    if checkpoints:
        with strata_redis.CheckpointManager(checkpoints, redis=job, worker_id=worker_id) as ckpt:
            ckpt.save(b"x" * 10_000, step=10, epoch=0).result()
    time.sleep(120)


def test_progress_over_two_real_workers(redis_url: str, tmp_path: Path) -> None:
    job = strata_redis.connect(redis_url, JOB, heartbeat_timeout=TIMEOUT)
    ShardManager(job).register_dataset_params("images", SAMPLES, PER_SHARD, True, 7)
    where = str(tmp_path / "ckpt")
    procs = [spawn(_trainer, redis_url, "w-fast", 0.025, where),
             spawn(_trainer, redis_url, "w-slow", 0.1, "")]  # fmt: skip
    state = DashboardState(decoding_client(redis_url), heartbeat_timeout=TIMEOUT)
    schema = json.loads(schema_text())
    try:
        wait_for(lambda: len(job.live_workers()) == 2, 60, why=job.workers)
        leases = job.leases("images", 0, "w-fast")
        wait_for(lambda: leases.progress().done > 0, 60)
        seen: list[dict[str, Any]] = []  # documents read while the epoch was under way
        while not leases.progress().finished:
            doc = document(state.read(JOB))
            jsonschema.validate(doc, schema)
            if doc["datasets"][0]["progress"]["done"] < doc["datasets"][0]["num_shards"]:
                seen.append(doc["jobs"][0]["progress"])
            time.sleep(0.25)
        rated = [p for p in seen if p["samples_per_s"]]
        assert rated, seen
        for p in rated:
            # (an ETA rounds to 0.1 s: a few samples left at hundreds a second read 0.0)
            assert p["samples_per_s"] > 0 and p["eta_s"] is not None and p["eta_s"] >= 0, p
            assert p["epoch_remaining_samples"] > 0 and p["rate_window_s"] >= 1, p
        # the eta is what is left at the job's rate
        p = rated[-1]
        assert p["eta_s"] == round(p["epoch_remaining_samples"] / p["samples_per_s"], 1)
        # both live workers rated: the slow one is marked, and only it
        marked = [p for p in rated if all(w["samples_per_s"] is not None for w in p["workers"])]
        assert marked, rated
        for p in marked:
            rates = {w["worker_id"]: w["samples_per_s"] for w in p["workers"]}
            assert p["slowest_worker"] == min(rates, key=lambda w: rates[w]), p
            assert [w["worker_id"] for w in p["workers"] if w["slowest"]] == [p["slowest_worker"]]
        assert sum(p["slowest_worker"] == "w-slow" for p in marked) > len(marked) / 2, marked

        # the epoch done: every sample counted once, split between the two workers
        totals = lease_totals(job.context, "images")
        assert totals.samples == SAMPLES
        assert set(totals.by_worker) == {"w-fast", "w-slow"}
        assert sum(totals.by_worker.values()) == SAMPLES
        assert totals.by_worker["w-fast"] > totals.by_worker["w-slow"] > 0
        shards = leases.completed_by()
        assert {w: n * PER_SHARD for w, n in shards.items()} == totals.by_worker

        # the checkpoint's location, as the library reports it
        wait_for(lambda: job.client.zcard(job.keys.checkpoints) == 1, 30)
        with strata_redis.CheckpointManager(where, redis=job, worker_id="reader") as ckpt:
            latest = ckpt.latest()
            assert latest is not None
            location = f"{LocalStorage(where).describe()}/{JOB}/checkpoints/epoch_0_step_10"
            assert latest.location == location
            doc = document(state.read(JOB))
            jsonschema.validate(doc, schema)
            p = doc["jobs"][0]["progress"]
            assert p["checkpoints"] == [
                {"run": 0, "epoch": 0, "step": 10, "label": "epoch_0_step_10",
                 "location": location}
            ]  # fmt: skip
            assert "location" not in doc["checkpoints"][0]
            assert (p["samples_trained"], p["epoch_remaining_samples"], p["eta_s"]) == (
                SAMPLES, 0, 0.0)  # fmt: skip
            assert p["slowest_worker"] is None  # nothing left: idle workers are not slow
            assert {w["worker_id"]: w["samples_trained"] for w in p["workers"]} == (
                totals.by_worker)  # fmt: skip
            assert p["datasets"] == [{"name": "images", "epoch": 0, "samples_trained": SAMPLES,
                                      "steals_total": totals.steals, "remaining_samples": 0,
                                      "ratio": 1.0}]  # fmt: skip
            # a rebuilt index (from storage) knows where its checkpoints live too
            job.client.delete(job.keys.checkpoint_locations)
            assert ckpt.list()[0].location == location  # the reader locates it itself
            fresh = DashboardState(decoding_client(redis_url), heartbeat_timeout=TIMEOUT)
            lost = document(fresh.read(JOB))["jobs"][0]["progress"]["checkpoints"][0]["location"]
            assert lost is None
            ckpt.rebuild_index()
            again = DashboardState(decoding_client(redis_url), heartbeat_timeout=TIMEOUT)
            found = document(again.read(JOB))["jobs"][0]["progress"]["checkpoints"]
            assert found[0]["location"] == location

        # the per-worker rows follow the requested page of workers (the slowest always shown)
        paged = document(state.read(JOB, limit=1))["jobs"][0]["progress"]
        ids = [w["worker_id"] for w in paged["workers"]]
        assert ids[0] == "w-fast" and set(ids) <= {"w-fast", paged["slowest_worker"]}, paged
        assert metric(redis_url, "strata_samples_trained", job_id=JOB) == SAMPLES
        text = render(state.read(JOB), 100)
        assert "epoch 0 done" in text and f"{SAMPLES} samples trained" in text
        assert all(len(line) <= 100 for line in text.splitlines())
    finally:
        for proc in procs:
            proc.kill()
        join_all(procs, 10)
        job.close()


def test_the_lifetime_counts_end_and_go_with_the_job(job: strata_redis.Job, tmp_path: Path) -> None:
    ShardManager(job).register_dataset_params("ds", 20, 10)
    job.register_worker("a", heartbeat_interval=None).deregister()
    job.register_worker("b", heartbeat_interval=None)
    for lease in job.leases("ds", 0, "b"):
        lease.complete()
    with strata_redis.CheckpointManager(tmp_path, redis=job, worker_id="b") as ckpt:
        ckpt.save(b"x", step=1).result()
    kept = [job.keys.lease_totals("ds"), job.keys.checkpoint_locations]
    assert all(job.client.exists(k) for k in kept)
    assert all(job.client.pttl(k) == -1 for k in kept), "kept for as long as the job runs"
    expires_ms = job.end(retention=60)
    assert all(job.client.pexpiretime(k) == expires_ms for k in kept)
    delete_job(job.client, job.job_id)
    assert not any(job.client.exists(k) for k in kept)

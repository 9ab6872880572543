"""The dashboard's JSON API and /metrics against a real job: fields, schema, 404s, no writes."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

import strata_redis
from strata_redis.checkpoint.records import decode_record
from strata_redis.coordination import Worker
from strata_redis.coordination.registry import queue_events, take_events
from strata_redis.dashboard import DashboardState, create_app
from strata_redis.dashboard.app import COOKIE, schema_text
from strata_redis.data import ShardLeases
from strata_redis.errors import CheckpointAbortedError
from strata_redis.server import RedisServer

from .procs import kill9, spawn, wait_for

JOB = "test-job"
TIMEOUT = 2.0


def _doomed_worker(url: str, job_id: str) -> None:
    """A worker process that registers, heartbeats, and waits to be killed."""
    job = strata_redis.connect(url, job_id, heartbeat_timeout=TIMEOUT)
    job.register_worker("w-doomed", host="gpu-z", gpu_count=2, heartbeat_interval=0.2)
    time.sleep(120)


@dataclass
class Scenario:
    job: strata_redis.Job
    workers: list[Worker]
    leases: ShardLeases
    held: strata_redis.Lease
    ckpt: strata_redis.CheckpointManager

    def quiesce(self) -> None:
        """Stop every background writer, so Redis only changes when someone asks it to."""
        for w in self.workers:
            w.stop_heartbeat()
        self.job.barrier_latencies()  # flushes this process's latency records


@pytest.fixture
def scenario(redis_url: str, tmp_path: Path) -> Iterator[Scenario]:
    """A real job: live workers, one killed (failed), one left, a dataset mid-epoch with a
    lease held, barrier releases, two committed checkpoints and an aborted one."""
    # The job's first registration stores its heartbeat timeout, by which readers judge a
    # live worker stale: a long one (w-03's), so a heartbeat thread a loaded machine stalls
    # for TIMEOUT does not show w-01 or w-02 stale. The workers' own reaper steps still use
    # TIMEOUT (their process's), so the killed worker is declared failed within seconds.
    with strata_redis.connect(redis_url, JOB, heartbeat_timeout=60) as first:
        first.register_worker("w-03", heartbeat_interval=None).deregister()
    job = strata_redis.connect(redis_url, JOB, heartbeat_timeout=TIMEOUT)
    w1 = job.register_worker("w-01", host="gpu-a", address="10.0.0.5:29500", gpu_count=8,
                             labels={"rack": "r1"}, heartbeat_interval=0.2)  # fmt: skip
    w2 = job.register_worker("w-02", host="gpu-b", gpu_count=4, heartbeat_interval=0.2)
    w1.set_status("training")
    doomed = spawn(_doomed_worker, redis_url, JOB)
    wait_for(lambda: "w-doomed" in job.live_workers(), 30)
    kill9(doomed)
    wait_for(lambda: {w.worker_id: w.status for w in job.workers()}["w-doomed"] == "failed",
             TIMEOUT + 5)  # fmt: skip

    strata_redis.ShardManager(job).register_dataset_params("images", 1000, 10, True, 42)
    leases = job.leases("images", 0, "w-01")
    for _ in range(30):
        lease = leases.acquire()
        assert lease is not None
        lease.complete()
    other = job.leases("images", 0, "w-02")
    for _ in range(5):
        lease = other.acquire()
        assert lease is not None
        lease.complete()
    held = leases.acquire()
    assert held is not None
    for i in range(5):
        job.barrier("sync", expected=1).wait("w-01")
        job.barrier(f"once-{i}", expected=1).wait("w-02")

    ckpt = strata_redis.CheckpointManager(tmp_path / "ckpt", keep_count=5, redis=job,
                                          worker_id="w-01")  # fmt: skip
    ckpt.save(os.urandom(300_000), step=100, epoch=0).result()
    ckpt.save(os.urandom(200_000), step=200, epoch=0).result()
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    broken = strata_redis.CheckpointManager(blocked, redis=job, worker_id="w-02")
    with pytest.raises(CheckpointAbortedError, match="step 300"):
        broken.save(b"x" * 1000, step=300, epoch=0).result()
    broken.close()
    yield Scenario(job, [w1, w2], leases, held, ckpt)
    ckpt.close()
    for w in (w1, w2):
        w.stop_heartbeat()
    job.close()


def api(client: Any, path: str = "/api/dashboard", **headers: str) -> Any:
    reply = client.get(path, headers=headers)
    assert reply.status_code == 200, reply.get_data(as_text=True)
    return reply.get_json()


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def test_document_matches_the_library_and_the_schema(scenario: Scenario, redis_url: str) -> None:
    job = scenario.job
    client = create_app(redis_url, heartbeat_timeout=TIMEOUT, min_interval=0).test_client()
    doc = api(client, f"/api/dashboard?job={JOB}")
    jsonschema.validate(doc, json.loads(schema_text()))
    assert doc["job"] == JOB and doc["redis"] == redis_url
    assert doc["read"]["round_trips"] == 2

    (overview,) = doc["jobs"]
    assert overview["epoch"] == job.current_epoch()
    assert overview["membership_generation"] == job.membership_generation()
    assert overview["live_workers"] == len(job.live_workers()) == 2
    assert overview["registered_workers"] == len(job.workers()) == 4
    # the newest committed checkpoint: the loop's numbers, apart
    assert overview["latest_checkpoint"] == {
        "run": 0,
        "epoch": 0,
        "step": 200,
        "label": "epoch_0_step_200",
    }

    # workers: every field as Job.workers() reports it
    info = {w.worker_id: w for w in job.workers()}
    rows = {w["worker_id"]: w for w in doc["workers"]}
    assert sorted(rows) == sorted(info) == ["w-01", "w-02", "w-03", "w-doomed"]
    for wid, row in rows.items():
        lib = info[wid]
        assert (row["status"], row["host"], row["address"], row["gpu_count"], row["labels"],
                row["incarnation"]) == (lib.status, lib.host, lib.address, lib.gpu_count,
                                        lib.labels, lib.incarnation), wid  # fmt: skip
        if lib.last_seen_s is None:
            assert row["last_seen_s"] is None
        else:
            # two reads, either just before a beat of a heartbeat thread a loaded machine
            # stalled: apart by up to TIMEOUT; a wrong clock (this host's, ms for s) is further
            assert row["last_seen_s"] == pytest.approx(lib.last_seen_s, abs=TIMEOUT)
    assert rows["w-doomed"]["status"] == "failed" and rows["w-03"]["status"] == "left"
    assert [(s["dataset"], s["shard_id"], s["token"]) for s in rows["w-01"]["shards"]] == [
        ("images", scenario.held.shard_id, scenario.held.token)
    ]
    (m,) = doc["metrics"]["jobs"]
    assert m["workers"] == {"idle": 1, "training": 1, "checkpointing": 0, "failed": 1, "left": 1,
                            "stale": 0}  # fmt: skip
    assert m["worker_failures_total"] == 1
    assert m["checkpoint_totals"]["saves"] == 2 and m["checkpoint_totals"]["aborted_steps"] == 1
    assert m["checkpoint_totals"]["saved_bytes"] >= 500_000

    # the membership timeline is the events stream
    events = job.events(500)
    assert [(e["type"], e["worker_id"], e["generation"], e["id"]) for e in doc["events"]] == [
        (e["type"], e["worker"], int(e["generation"]), e["id"]) for e in events
    ]

    # datasets: params, progress and the distribution of the completion record
    (ds,) = doc["datasets"]
    (params,) = strata_redis.ShardManager(job).list_datasets()
    assert (ds["name"], ds["total_samples"], ds["samples_per_shard"], ds["num_shards"],
            ds["shuffle"], ds["seed"]) == (params.name, params.total_samples,
                                           params.samples_per_shard, params.num_shards,
                                           params.shuffle, params.seed)  # fmt: skip
    progress = scenario.leases.progress()
    assert ds["progress"] == {"initialized": True, "total": progress.total, "done": progress.done,
                              "leased": progress.leased, "todo": progress.todo,
                              "steals": progress.steals}  # fmt: skip
    assert (progress.done, progress.leased) == (35, 1)
    done = Counter(worker for worker, _token in scenario.leases.completions().values())
    assert {r["worker_id"]: (r["done"], r["leased"]) for r in ds["distribution"]} == {
        "w-01": (done["w-01"], 1), "w-02": (done["w-02"], 0),
    }  # fmt: skip

    # barrier latency: percentiles of job.barrier_latencies()
    latencies = [b.release_ms for b in job.barrier_latencies()]
    assert m["barrier"]["releases"] == len(latencies) == 10
    assert m["barrier"]["p50_ms"] == pytest.approx(nearest_rank(latencies, 50), abs=1e-3)
    assert m["barrier"]["p99_ms"] == pytest.approx(nearest_rank(latencies, 99), abs=1e-3)
    assert m["barrier"]["series"]

    # checkpoints: committed ones as the index says, the aborted one with its culprit
    steps = {c["step"]: c for c in doc["checkpoints"]}
    assert sorted(steps, reverse=True) == [c["step"] for c in doc["checkpoints"]] == [300, 200, 100]
    assert [(c["run"], c["epoch"], c["label"]) for c in doc["checkpoints"]] == [
        (0, 0, "epoch_0_step_300"), (0, 0, "epoch_0_step_200"), (0, 0, "epoch_0_step_100"),
    ]  # fmt: skip
    for info_ in scenario.ckpt.list():
        row = steps[info_.step]
        assert (row["state"], row["epoch"], row["world_size"], row["bytes"], row["files"],
                row["workers"]) == ("committed", info_.epoch, info_.world_size, info_.nbytes,
                                    len(info_.files), {"0": "w-01"})  # fmt: skip
    records = scenario.ckpt.records()
    by_step = {r.step: r for r in records}
    assert steps[200]["seconds"] == pytest.approx(by_step[200].seconds)
    assert steps[300]["state"] == "aborted" and steps[300]["culprit"] == "w-02"
    assert "could not save its parts" in steps[300]["reason"]
    c = m["checkpoint"]
    assert (c["saves"], c["aborted_saves"], c["aborted_steps"]) == (2, 1, 1)
    assert c["bytes"] == sum(r.nbytes for r in records if r.outcome == "uploaded")
    newest = max((r for r in records if r.outcome == "uploaded"), key=lambda r: r.at_ms)
    # the newest checkpoint's (here of one rank each): its row's figures
    assert (c["last_step"], c["last_bytes"]) == (newest.step, newest.nbytes)
    assert (c["last_mb_s"], c["last_seconds"]) == (steps[200]["mb_s"], steps[200]["seconds"])

    # the all-jobs view holds the same job
    everything = api(client)
    jsonschema.validate(everything, json.loads(schema_text()))
    assert [j["job_id"] for j in everything["jobs"]] == [JOB]
    assert everything["jobs_listing"] == {"known": 1, "shown": 1, "complete": True}


def write_calls(raw: redis.Redis) -> tuple[int, dict[str, int]]:
    """(keyspace changes so far, calls per command that may write: write-flagged or scripts)."""
    writers = {
        name for name, spec in raw.command().items()
        if "write" in spec["flags"] or name in ("eval", "evalsha", "fcall", "eval_ro")
    }  # fmt: skip
    stats = raw.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()}
    dirty = raw.info("persistence")["rdb_changes_since_last_save"]
    return dirty, {k.split("|")[0]: v for k, v in calls.items() if k.split("|")[0] in writers}


def test_requests_never_write(scenario: Scenario, redis_url: str, raw: redis.Redis) -> None:
    scenario.quiesce()
    app = create_app(redis_url, heartbeat_timeout=TIMEOUT, min_interval=0)
    client = app.test_client()
    before = write_calls(raw)
    for path in ("/", f"/job/{JOB}", "/api/dashboard", f"/api/dashboard?job={JOB}",
                 f"/api/dashboard?job={JOB}&offset=1&limit=2", "/metrics", "/api/schema",
                 "/api/dashboard?job=nope", "/job/nope"):  # fmt: skip
        for _ in range(3):
            client.get(path)
    after = write_calls(raw)
    assert after == before, f"writes while serving the dashboard: {before} -> {after}"


def test_a_read_only_acl_user_is_enough(redis_factory: Callable[..., RedisServer]) -> None:
    """The dashboard works for a user that may only read (and without INFO: no request rate)."""
    server = redis_factory()
    admin = redis.Redis.from_url(server.url)
    job = strata_redis.connect(server.url, "acl-job")
    job.register_worker("w", host="h", heartbeat_interval=None)
    admin.execute_command("ACL", "SETUSER", "dash", "on", ">s3cret-pw", "~strata:*",
                          "+@read", "+time", "+ping")  # fmt: skip
    url = f"redis://dash:s3cret-pw@127.0.0.1:{server.port}/0"
    client = create_app(url, min_interval=0).test_client()
    for _ in range(2):
        doc = api(client)
    assert [w["worker_id"] for w in doc["workers"]] == ["w"]
    assert doc["metrics"]["redis"]["commands_per_s"] is None
    assert "s3cret-pw" not in json.dumps(doc) and "dash@" not in json.dumps(doc)
    page = client.get("/job/acl-job").get_data(as_text=True)
    assert "s3cret-pw" not in page and f"redis://127.0.0.1:{server.port}/0" in page
    assert "s3cret-pw" not in client.get("/metrics").get_data(as_text=True)
    job.close()


def test_bad_requests_are_clear(redis_url: str, job: strata_redis.Job) -> None:
    job.register_worker("w", heartbeat_interval=None)
    client = create_app(redis_url, min_interval=0).test_client()
    reply = client.get("/api/dashboard?job=nope")
    assert reply.status_code == 404
    assert reply.get_json()["error"].startswith("no job 'nope' in this Redis")
    reply = client.get("/api/dashboard?job=a{b}")
    assert reply.status_code == 404 and "not a valid job id" in reply.get_json()["error"]
    assert client.get("/job/a%7Bb%7D").status_code == 404
    for query, message in (("offset=-1", "offset must be between"),
                           ("limit=many", "limit must be an integer"),
                           ("limit=0", "limit must be between")):  # fmt: skip
        reply = client.get(f"/api/dashboard?{query}")
        assert reply.status_code == 400 and message in reply.get_json()["error"]
    fixed = create_app(redis_url, job=job.job_id).test_client()
    assert fixed.get("/api/dashboard?job=other").status_code == 404
    assert api(fixed)["job"] == job.job_id


def test_token_header_or_cookie(redis_url: str, job: strata_redis.Job) -> None:
    token = "t0ken-" + "x" * 20
    client = create_app(redis_url, token=token).test_client()
    assert client.get("/healthz").status_code == 200
    for path in ("/", "/api/dashboard", "/metrics", "/static/dashboard.js"):
        assert client.get(path).status_code == 401, path
    assert (
        client.get("/api/dashboard", headers={"Authorization": "Bearer wrong"}).status_code == 401
    )
    api(client, "/api/dashboard", Authorization=f"Bearer {token}")
    assert client.get("/?token=wrong").status_code == 401
    reply = client.get(f"/?token={token}")
    assert reply.status_code == 303 and reply.headers["Location"] == "/"
    assert f"{COOKIE}=" in reply.headers["Set-Cookie"] and "HttpOnly" in reply.headers["Set-Cookie"]
    assert client.get("/").status_code == 200  # the cookie now
    assert client.get("/api/dashboard").status_code == 200
    with pytest.raises(ValueError, match="at least 16 characters"):
        create_app(redis_url, token="short")


def test_redis_down_is_503_without_credentials(redis_factory: Callable[..., RedisServer]) -> None:
    """The API answers 503 naming the server; /metrics answers 200 with strata_redis_up 0
    and nothing that needs Redis (Prometheus sees the exporter up and Redis down)."""
    server = redis_factory()
    url = f"redis://user:pa55word@127.0.0.1:{server.port}/0"
    client = create_app(url).test_client()
    plain = create_app(server.url, min_interval=0).test_client()
    strata_redis.connect(server.url, JOB).register_worker("w", heartbeat_interval=None)
    up = plain.get("/metrics").get_data(as_text=True)
    assert "strata_redis_up 1.0" in up and f'strata_workers{{job_id="{JOB}"' in up
    read_ms = api(plain)["time_ms"]
    server.stop()
    reply = client.get("/api/dashboard")
    assert reply.status_code == 503
    text = reply.get_data(as_text=True)
    assert f"127.0.0.1:{server.port}" in text and "pa55word" not in text
    # what the page's banner says: where (no credentials), since when, numbers from when
    body = reply.get_json()
    assert body["redis"] == f"redis://127.0.0.1:{server.port}/0"
    assert body["last_read_ms"] is None  # this app never read
    since = body["redis_down_since_ms"]
    assert abs(since / 1000 - time.time()) < 60
    time.sleep(0.01)
    again = plain.get("/api/dashboard").get_json()
    assert again["last_read_ms"] == read_ms and again["redis_down_since_ms"] >= since
    assert (
        plain.get("/api/dashboard").get_json()["redis_down_since_ms"]
        == again["redis_down_since_ms"]
    )  # since the first failure, not the latest
    assert "Connection refused.." not in again["error"]
    for c in (client, plain):
        reply = c.get("/metrics")
        assert reply.status_code == 200 and reply.mimetype == "text/plain"
        body = reply.get_data(as_text=True)
        assert "pa55word" not in body
        families = list(text_string_to_metric_families(body))
        assert [(f.name, f.type, [s.value for s in f.samples]) for f in families] == [
            ("strata_redis_up", "gauge", [0.0])
        ]


def test_security_headers_and_no_cdn(redis_url: str) -> None:
    client = create_app(redis_url).test_client()
    page = client.get("/")
    html = page.get_data(as_text=True)
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert "http://" not in html.replace("http://127.0.0.1", "") and "https://" not in html
    vendor = "/static/vendor/uplot"
    for asset in ("/static/dashboard.js", f"{vendor}/uPlot.iife.min.js",
                  f"{vendor}/uPlot.min.css", f"{vendor}/LICENSE"):  # fmt: skip
        with client.get(asset) as reply:  # a file response: close it
            assert reply.status_code == 200, asset


def test_metrics_match_the_api(scenario: Scenario, redis_url: str) -> None:
    scenario.quiesce()
    client = create_app(redis_url, heartbeat_timeout=TIMEOUT, min_interval=60).test_client()
    doc = api(client, "/api/dashboard?limit=5000")  # /metrics reuses this read (min_interval)
    reply = client.get("/metrics")
    assert reply.status_code == 200 and reply.mimetype == "text/plain"
    families = {f.name: f for f in text_string_to_metric_families(reply.get_data(as_text=True))}

    def value(name: str, **labels: str) -> float:
        matches = [s.value for s in families[name].samples
                   if all(s.labels.get(k) == v for k, v in labels.items())
                   and s.name in (name, f"{name}_total")]  # fmt: skip
        assert len(matches) == 1, (name, labels, families[name].samples)
        return matches[0]

    (m,) = doc["metrics"]["jobs"]
    for status, count in m["workers"].items():
        assert value("strata_workers", job_id=JOB, status=status) == count
    assert families["strata_membership_changes"].type == "counter"
    assert value("strata_membership_changes", job_id=JOB) == doc["jobs"][0]["membership_generation"]
    assert value("strata_lease_grants", job_id=JOB) == m["lease_grants_total"] > 0
    assert value("strata_epoch", job_id=JOB) == doc["jobs"][0]["epoch"]
    (ds,) = doc["datasets"]
    for state in ("done", "leased", "todo"):
        assert (
            value("strata_shards", job_id=JOB, dataset="images", state=state)
            == ds["progress"][state]
        )
    # the lifetime count (one epoch so far: the epoch's own count)
    (lifetime,) = doc["jobs"][0]["progress"]["datasets"]
    assert value("strata_lease_steals", job_id=JOB, dataset="images") == lifetime["steals_total"]
    assert lifetime["steals_total"] == ds["progress"]["steals"]
    assert value("strata_samples_trained", job_id=JOB) == lifetime["samples_trained"] == 350
    for q, key in (("50", "p50_ms"), ("99", "p99_ms"), ("100", "max_ms")):
        assert value("strata_barrier_release_latency_seconds", job_id=JOB, percentile=q) == (
            pytest.approx(m["barrier"][key] / 1000)
        )
    assert value("strata_redis_up") == 1
    assert value("strata_worker_failures", job_id=JOB) == m["worker_failures_total"]
    c, t = m["checkpoint"], m["checkpoint_totals"]
    for name in ("saves", "saved_bytes", "save_seconds", "aborted_steps", "aborted_saves"):
        assert families[f"strata_checkpoint_{name}"].type == "counter", name
        assert value(f"strata_checkpoint_{name}", job_id=JOB) == pytest.approx(t[name]), name
    # the scenario's saves are few: the newest records read hold them all
    assert t["saves"] == c["saves"] > 0 and t["saved_bytes"] == c["bytes"]
    assert t["aborted_steps"] == c["aborted_steps"] == 1
    assert t["aborted_saves"] == c["aborted_saves"]
    assert value("strata_checkpoint_last_commit_timestamp_seconds", job_id=JOB) == (
        m["last_commit_ms"] / 1000
    )
    assert abs(m["last_commit_ms"] / 1000 - time.time()) < 600
    (ratio,) = [s.value for s in families["strata_epoch_progress_ratio"].samples]
    assert ratio == ds["progress"]["done"] / ds["num_shards"]
    assert value("strata_checkpoint_latest_step", job_id=JOB) == 200
    assert value("strata_checkpoint_latest_epoch", job_id=JOB) == 0
    workers = {s.labels["worker"]: s.labels["status"]
               for s in families["strata_worker_status"].samples}  # fmt: skip
    assert workers == {w["worker_id"]: w["status"] for w in doc["workers"]}
    ages = families["strata_worker_heartbeat_age_seconds"].samples
    assert {s.labels["worker"]: s.value for s in ages} == {
        w["worker_id"]: w["last_seen_s"] for w in doc["workers"] if w["last_seen_s"] is not None
    }


def test_failures_count_survives_a_rejoin(redis_url: str, job: strata_redis.Job) -> None:
    """strata_worker_failures_total counts every failure of the job's life: a failed worker
    that registers again (status back to idle) stays counted, and a second failure adds."""
    client = create_app(redis_url, min_interval=0).test_client()

    def failures() -> float:
        text = client.get("/metrics").get_data(as_text=True)
        (family,) = [f for f in text_string_to_metric_families(text)
                     if f.name == "strata_worker_failures"]  # fmt: skip
        assert family.type == "counter"
        (sample,) = family.samples
        assert sample.name == "strata_worker_failures_total"
        return sample.value

    job.register_worker("w", heartbeat_interval=None)
    assert failures() == 0
    for n in (1, 2):
        wait_for(lambda: job.reap() == ["w"], 10)
        assert failures() == n
        job.register_worker("w", heartbeat_interval=None)  # rejoins: no longer failed
        assert {w.worker_id: w.status for w in job.workers()}["w"] == "idle"
        assert failures() == n


def test_a_worker_failed_between_the_reads_shows_with_its_fail_event(
    redis_url: str, job: strata_redis.Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A document is read in two rounds (the events in the first, the statuses in the
    second). A worker declared failed between them (its status and its fail event written by
    one script) is listed failed *and* with its fail event in the same document: the events
    are read again after the statuses."""
    from strata_redis.dashboard import state as dashboard_state

    state = DashboardState(job.client, heartbeat_timeout=2.0)
    job.register_worker("w", heartbeat_interval=None)  # (no other worker to reap it first)
    before = state.read(job.job_id).jobs[0]
    assert [e.type for e in before.events if e.worker_id == "w"] == ["join"]
    settle = dashboard_state._JobRead.settle
    reaped: list[str] = []

    def between_the_rounds(self: Any, now_ms: int, default_timeout: float) -> None:
        settle(self, now_ms, default_timeout)
        # (w's one heartbeat grows older than the timeout: then reaping fails it)
        wait_for(lambda: reaped.extend(job.reap()) or reaped == ["w"], 10)

    monkeypatch.setattr(dashboard_state._JobRead, "settle", between_the_rounds)
    snap = state.read(job.job_id).jobs[0]
    assert reaped == ["w"]
    rows = {row.worker_id: row.status for row in snap.workers}
    assert rows["w"] == "failed", rows
    assert [e.type for e in snap.events if e.worker_id == "w"] == ["join", "fail"], snap.events


def test_failed_in_the_window_counts_a_rejoined_worker(
    redis_url: str, job: strata_redis.Job
) -> None:
    """The FAILED tile's count: fail events of the membership stream in the window. A worker
    declared failed that rejoined since still counts; one failed before the window no more."""
    client = create_app(redis_url, gone_window=3.0, min_interval=0).test_client()
    job.register_worker("w", heartbeat_interval=None)
    assert api(client)["metrics"]["jobs"][0]["recent"]["failed"] == 0
    wait_for(lambda: job.reap() == ["w"], 10)
    failed_at = time.monotonic()
    job.register_worker("w", heartbeat_interval=None)  # rejoins: idle, not failed, now
    (m,) = api(client)["metrics"]["jobs"]
    assert m["recent"] == {"window_s": 3.0, "failed": 1, "left": 0, "complete": True}
    assert m["workers"]["failed"] == 0 and m["workers"]["idle"] == 1
    time.sleep(max(0.0, failed_at + 3.2 - time.monotonic()))  # the failure leaves the window
    assert api(client)["metrics"]["jobs"][0]["recent"]["failed"] == 0
    assert api(client)["metrics"]["jobs"][0]["worker_failures_total"] == 1  # for life


def test_one_mb_s_for_a_checkpoint_in_tile_table_and_metrics(
    redis_url: str, job: strata_redis.Job, tmp_path: Path
) -> None:
    """A checkpoint's MB/s is all ranks' bytes over the slowest rank's seconds, the same
    figure in the table row, the tile's field and /metrics (bytes over seconds)."""
    managers = [
        strata_redis.CheckpointManager(
            tmp_path / "ckpt", redis=job, worker_id=f"w-{rank}", rank=rank, world_size=2
        )
        for rank in (0, 1)
    ]
    try:
        for step in (10, 20):
            saves = [m.save(os.urandom(size), step=step, epoch=1)
                     for m, size in zip(managers, (3_000_000, 500_000), strict=True)]  # fmt: skip
            for f in saves:
                f.result()
    finally:
        for m in managers:
            m.close()
    ranks = [decode_record(f) for _, f in job.client.xrange(job.keys.checkpoint_records)]
    newest = [r for r in ranks if r.step == 20]
    assert len(newest) == 2
    expected = sum(r.nbytes for r in newest) / 1e6 / max(r.seconds for r in newest)

    client = create_app(redis_url, min_interval=60).test_client()
    doc = api(client)
    row = next(c for c in doc["checkpoints"] if c["step"] == 20)
    (m,) = doc["metrics"]["jobs"]
    tile = m["checkpoint"]
    assert (tile["last_step"], tile["last_epoch"]) == (20, 1)
    assert tile["last_mb_s"] == row["mb_s"] == round(expected, 3)
    assert all(r.mb_s != pytest.approx(tile["last_mb_s"], rel=1e-3) for r in newest)  # not a part
    assert tile["last_bytes"] == row["bytes"] == 3_500_000 and row["ranks_saved"] == 2
    assert tile["last_seconds"] == row["seconds"] == round(max(r.seconds for r in newest), 6)
    # the chart: per checkpoint too (the two steps are in one bucket or in two)
    rows = [c["mb_s"] for c in doc["checkpoints"]]
    assert [p[1] for p in tile["series"]] in ([round(sum(rows) / 2, 3)], rows[::-1])
    families = {f.name: f for f in text_string_to_metric_families(
        client.get("/metrics").get_data(as_text=True))}  # fmt: skip
    (nbytes,) = families["strata_checkpoint_last_save_bytes"].samples
    (seconds,) = families["strata_checkpoint_last_save_seconds"].samples
    assert nbytes.value / 1e6 / seconds.value == pytest.approx(tile["last_mb_s"], rel=1e-3)
    assert (
        "the slowest rank's save seconds"
        in families["strata_checkpoint_last_save_bytes"].documentation
    )
    page = client.get("/").get_data(as_text=True)
    assert "MB/s = all ranks&#39; bytes ÷ the slowest rank&#39;s save seconds" in page


def test_a_committed_checkpoint_without_its_save_records_counts_its_ranks(
    redis_url: str, job: strata_redis.Job, tmp_path: Path
) -> None:
    """The save records are capped (and gone after a state loss); a committed checkpoint's
    metadata still says every rank acked: never "committed ... 0/2 ranks"."""
    managers = [
        strata_redis.CheckpointManager(
            tmp_path / "ckpt", redis=job, worker_id=f"w-{rank}", rank=rank, world_size=2
        )
        for rank in (0, 1)
    ]
    try:
        for f in [m.save(b"x" * 1000, step=10, epoch=0) for m in managers]:
            f.result()
    finally:
        for m in managers:
            m.close()
    job.client.delete(job.keys.checkpoint_records)
    (row,) = api(create_app(redis_url).test_client())["checkpoints"]
    assert (row["state"], row["ranks_saved"], row["world_size"]) == ("committed", 2, 2)
    assert row["workers"] == {"0": "w-0", "1": "w-1"} and row["mb_s"] is None


def test_gone_workers_drop_out_after_the_window(redis_url: str, job: strata_redis.Job) -> None:
    """Label sets stay bounded: a worker that left long ago is no longer listed or exported."""
    job.register_worker("old", heartbeat_interval=None).deregister()
    job.register_worker("live", heartbeat_interval=None)
    # a window a loaded machine's first read falls in; then the listing drops "old"
    app = create_app(redis_url, gone_window=5.0, min_interval=0)
    client = app.test_client()
    assert [w["worker_id"] for w in api(client)["workers"]] == ["live", "old"]
    wait_for(lambda: [w["worker_id"] for w in api(client)["workers"]] == ["live"], 20, step=0.2)
    doc = api(client)
    assert [w["worker_id"] for w in doc["workers"]] == ["live"]
    assert doc["jobs"][0]["gone_workers"] == 1
    assert 'worker="old"' not in client.get("/metrics").get_data(as_text=True)


def test_streams_are_read_incrementally(redis_url: str, raw: redis.Redis) -> None:
    """Each document asks only for entries newer than the newest kept; a stream that was
    trimmed or flushed shows no more than it holds."""
    state = DashboardState(raw)
    key = "strata:{tail}:events"
    tail = state.caches.tail("tail", "events", 5)

    def read() -> list[str]:
        pipe = raw.pipeline(transaction=False)
        queue_events(pipe, "tail", 5, tail.after)
        return [e[0] for e in tail.take(take_events(iter(pipe.execute())))]

    ids = [raw.xadd(key, {"n": str(i)}) for i in range(3)]
    assert read() == ids[::-1]
    more = [raw.xadd(key, {"n": str(i)}) for i in range(3, 5)]
    before = raw.info("commandstats")["cmdstat_xrevrange"]["calls"]
    assert read() == (ids + more)[::-1]
    assert raw.info("commandstats")["cmdstat_xrevrange"]["calls"] == before + 1
    newest = [raw.xadd(key, {"n": str(i)}) for i in range(5, 12)]  # more than the cap
    assert read() == newest[::-1][:5]
    raw.xtrim(key, maxlen=2, approximate=False)
    assert read() == newest[::-1][:2]
    raw.flushall()
    # a recreated stream's ids start again at Redis' clock: step past the millisecond of the
    # newest entry kept, as any real recreation (a flush, a restart) is, or the new entry's
    # id could sort below the kept one and look old
    newest_ms = int(newest[-1].split("-")[0])
    while (lambda t: t[0] * 1000 + t[1] // 1000)(raw.time()) <= newest_ms:
        pass
    again = raw.xadd(key, {"n": "x"})
    assert read() == [again]


@pytest.mark.timeout(120)
def test_healthz_answers_during_a_redis_stall(redis_factory: Callable[..., RedisServer]) -> None:
    server = redis_factory()
    assert server.proc is not None
    strata_redis.connect(server.url, "stalled").register_worker("w", heartbeat_interval=None)
    code = (
        "import sys; from strata_redis.dashboard import create_app; "
        "from strata_redis.dashboard.serving import serve; "
        "serve(create_app(sys.argv[1], job='stalled', min_interval=0), port=0, threads=3, "
        "ready=lambda url: print(url, flush=True))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(strata_redis.__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", code, server.url], stdout=subprocess.PIPE,
                            text=True, env=env)  # fmt: skip
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert _get(url + "api/dashboard")[0] == 200
        os.kill(server.proc.pid, signal.SIGSTOP)  # Redis stops answering
        try:
            # more API requests than the server has threads, every one stuck on Redis
            pool = ThreadPoolExecutor(8)
            stuck = [pool.submit(_get, url + "api/dashboard") for _ in range(8)]
            # those past the server's limit are refused at once, without Redis; the others
            # wait out the 10 s socket timeout: 8 s separates them
            wait_for(lambda: any(f.done() for f in stuck), 8)
            busy = [f.result() for f in stuck if f.done()]
            start = time.monotonic()
            assert _get(url + "healthz") == (200, "ok\n")
            assert time.monotonic() - start < 5.0  # not behind the stuck requests (10 s)
            assert all(code == 503 and "slow to answer" in body for code, body in busy), busy
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert {f.result(30)[0] for f in stuck} <= {200, 503}
        pool.shutdown()
        assert _get(url + "api/dashboard")[0] == 200
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()

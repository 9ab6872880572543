"""/metrics against a real Prometheus and promtool (Debian's ``prometheus`` package), and the
shipped alerting rules and Grafana dashboard (``deploy/``).

CI installs the binaries (``scripts/setup.sh --prometheus``, which ``scripts/test.sh``
runs); without them these tests fail, saying so, rather than skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import strata_redis
from strata_redis.errors import CheckpointAbortedError
from strata_redis.server import RedisServer

from .procs import wait_for

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
JOB = "prom-job"


def binary(name: str) -> str:
    """The path of ``name`` (``prometheus``, ``promtool``); a test failure if it is absent."""
    for path in (f"/usr/bin/{name}", shutil.which(name)):
        if path and os.access(path, os.X_OK):
            return path
    pytest.fail(
        f"no {name} binary (looked at /usr/bin/{name} and PATH): run scripts/setup.sh "
        f"--prometheus (it installs Debian's prometheus package), or apt-get install prometheus"
    )


@dataclass
class Dashboard:
    url: str
    server: RedisServer

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "metrics", timeout=10) as reply:
            assert reply.status == 200
            return str(reply.read().decode())


@pytest.fixture
def dashboard(redis_factory: Any, tmp_path: Path) -> Iterator[Dashboard]:
    """A dedicated Redis with a job that has every kind of state /metrics exports (a live
    worker, a failed one, a dataset with completed shards, barrier releases, a committed
    checkpoint, an aborted one), and the dashboard serving it from a subprocess on a free
    loopback port."""
    server: RedisServer = redis_factory()
    job = strata_redis.connect(server.url, JOB, heartbeat_timeout=1.0)
    worker = job.register_worker("w-01", heartbeat_interval=0.2)
    job.register_worker("w-gone", heartbeat_interval=None)
    # declared failed by the heartbeat thread's reaper step (or this one's)
    wait_for(lambda: job.reap() is not None and _status(job, "w-gone") == "failed", 10)
    strata_redis.ShardManager(job).register_dataset_params("images", 100, 10, True, 42)
    leases = job.leases("images", 0, "w-01")
    for _ in range(3):
        lease = leases.acquire()
        assert lease is not None
        lease.complete()
    for _ in range(3):
        job.barrier("sync", expected=1).wait("w-01")
    job.barrier_latencies()  # flushes this process's latency records
    ckpt = strata_redis.CheckpointManager(tmp_path / "ckpt", redis=job, worker_id="w-01")
    ckpt.save(os.urandom(100_000), step=10, epoch=0).result()
    ckpt.close()
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    broken = strata_redis.CheckpointManager(blocked, redis=job, worker_id="w-01")
    with pytest.raises(CheckpointAbortedError):
        broken.save(b"x" * 1000, step=20, epoch=0).result()
    broken.close()
    code = (
        "import sys; from strata_redis.dashboard import create_app; "
        "from strata_redis.dashboard.serving import serve; "
        "serve(create_app(sys.argv[1], min_interval=0), port=0, threads=4, "
        "ready=lambda url: print(url, flush=True))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code, server.url], stdout=subprocess.PIPE,
                            text=True, env=env)  # fmt: skip
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield Dashboard(url, server)
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        worker.stop_heartbeat()
        job.close()


def _status(job: strata_redis.Job, worker_id: str) -> str | None:
    return {w.worker_id: w.status for w in job.workers()}.get(worker_id)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def query(base: str, expr: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as reply:
        body = json.loads(reply.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def values(base: str, expr: str) -> dict[str, float]:
    """``job_id`` (or ``""``) -> value of each series ``expr`` returns."""
    return {r["metric"].get("job_id", ""): float(r["value"][1]) for r in query(base, expr)}


def test_promtool_checks_the_exposition(dashboard: Dashboard) -> None:
    body = dashboard.metrics()
    done = subprocess.run([binary("promtool"), "check", "metrics"], input=body,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), (
        done.stdout + done.stderr
    )
    families = {f.name: f for f in text_string_to_metric_families(body)}
    for family in families.values():
        for sample in family.samples:
            assert not {"job", "instance"} & sample.labels.keys(), sample
    # the counters are life-of-job counts, here with the fixture's numbers
    counts = {s.name: s.value for f in families.values() for s in f.samples
              if s.labels.get("job_id") == JOB}  # fmt: skip
    assert counts["strata_worker_failures_total"] == 1
    assert counts["strata_checkpoint_saves_total"] == 1
    assert counts["strata_checkpoint_saved_bytes_total"] >= 100_000
    assert counts["strata_checkpoint_aborted_steps_total"] == 1
    assert counts["strata_lease_grants_total"] == 3
    assert abs(counts["strata_checkpoint_last_commit_timestamp_seconds"] - time.time()) < 300


@pytest.mark.timeout(180)
def test_a_real_prometheus_scrapes_the_dashboard(dashboard: Dashboard, tmp_path: Path) -> None:
    """Prometheus scrapes /metrics every second; its query API gives the series back, and
    ``strata_redis_up`` goes to 0 (the target staying up) when Redis stops."""
    prometheus = binary("prometheus")
    target = urllib.parse.urlparse(dashboard.url).netloc
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: strata-dashboard\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:

        def scraped(expr: str, want: dict[str, float]) -> bool:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                return values(base, expr) == want
            except OSError:  # not listening yet
                return False

        wait_for(lambda: scraped("strata_redis_up", {"": 1.0}), 60)
        wait_for(lambda: scraped("up", {"": 1.0}), 10)
        assert scraped(f'strata_lease_grants_total{{job_id="{JOB}"}}', {JOB: 3.0})
        assert scraped(f'strata_worker_failures_total{{job_id="{JOB}"}}', {JOB: 1.0})
        assert scraped(f'strata_workers{{job_id="{JOB}", status="idle"}}', {JOB: 1.0})
        # no exported label clashed with Prometheus' own target labels
        assert query(base, '{exported_job!=""}') == []
        assert query(base, '{exported_instance!=""}') == []
        dashboard.server.stop()
        wait_for(lambda: scraped("strata_redis_up", {"": 0.0}), 30)
        assert scraped("up", {"": 1.0})  # the exporter itself still answers
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def test_alert_rules_pass_their_unit_tests() -> None:
    promtool = binary("promtool")
    rules = DEPLOY / "prometheus"
    check = subprocess.run([promtool, "check", "rules", "strata.rules.yml"], cwd=rules,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr
    # the compose file's Prometheus config (which loads the rules) is valid too
    config = subprocess.run([promtool, "check", "config", "prometheus.yml"], cwd=rules,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert config.returncode == 0 and "1 rule files found" in config.stdout, (
        config.stdout + config.stderr
    )
    done = subprocess.run([promtool, "test", "rules", "strata.rules.test.yml"], cwd=rules,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
    # every rule is exercised by a test that expects it to fire
    alerts = set(re.findall(r"^\s+- alert: (\w+)$", (rules / "strata.rules.yml").read_text(), re.M))
    tested = (rules / "strata.rules.test.yml").read_text()
    fired = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n\s+- exp_labels", tested))
    assert alerts and alerts == fired, alerts ^ fired


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bstrata_[a-z0-9_]+", expr))


def test_grafana_dashboard_queries_exported_metrics(dashboard: Dashboard) -> None:
    """Every metric the Grafana dashboard and the alert rules query is in /metrics, with a
    sample for the fixture's job (or, unlabelled, for the server)."""
    dashboard.metrics()
    time.sleep(1.1)  # the server's command rate takes two reads a second apart
    body = dashboard.metrics()
    exported = {s.name for f in text_string_to_metric_families(body) for s in f.samples}
    spec = json.loads((DEPLOY / "grafana" / "strata.json").read_text())
    exprs = [t["expr"] for p in spec["panels"] for t in p["targets"]]
    variables = [v["definition"] for v in spec["templating"]["list"] if v["type"] == "query"]
    used = set().union(*(_metric_names(e) for e in exprs + variables))
    assert used and used <= exported, used - exported
    assert len(used) >= 15
    groups = yaml.safe_load((DEPLOY / "prometheus" / "strata.rules.yml").read_text())["groups"]
    in_rules = set().union(*(_metric_names(r["expr"]) for g in groups for r in g["rules"]))
    assert in_rules and in_rules <= exported, in_rules - exported
    for panel in spec["panels"]:
        assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]

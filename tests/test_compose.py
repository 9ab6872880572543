"""docker-compose.yml is well-formed (no Docker engine here: structure is checked, not run)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_compose_file_is_consistent() -> None:
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = spec["services"]
    assert {"redis", "minio", "demo", "dashboard", "prometheus", "grafana"} <= set(services)
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        for dep in service.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown service {dep}"
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):  # a bind mount of the repository's own files
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in spec.get("volumes", {}), volume
    assert "--appendonly" in services["redis"]["command"]
    demo = services["demo"]["environment"]
    assert demo["STRATA_REDIS_URL"].startswith("redis://redis:")
    # the demo's checkpoints go to MinIO's bucket, which the create-bucket service makes
    command = services["demo"]["command"]
    path = command[command.index("--checkpoint-path") + 1]
    assert path == f"s3://{demo['CHECKPOINT_BUCKET']}"
    assert f"local/{demo['CHECKPOINT_BUCKET']}" in " ".join(services["create-bucket"]["command"])


def test_dockerfile_copies_what_exists() -> None:
    text = (ROOT / "Dockerfile").read_text()
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        for source in line.split()[:-1]:
            assert (ROOT / source).exists(), source


def test_prometheus_and_grafana_are_wired_to_the_dashboard() -> None:
    """Prometheus scrapes the dashboard service's port with deploy/prometheus's config and
    rules; Grafana reads that Prometheus and loads deploy/grafana/strata.json."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    prometheus = services["prometheus"]
    mounts = dict(v.split(":")[:2] for v in prometheus["volumes"])
    assert mounts["./deploy/prometheus"] == "/etc/prometheus"
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    assert "dashboard" in prometheus["depends_on"]
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    rules = config["rule_files"]
    assert rules == ["strata.rules.yml"] and (ROOT / "deploy/prometheus" / rules[0]).exists()
    (scrape,) = config["scrape_configs"]
    assert scrape["job_name"] == "strata-dashboard"  # what the StrataDashboardDown rule selects
    assert 'up{job="strata-dashboard"}' in (ROOT / "deploy/prometheus" / rules[0]).read_text()
    dashboard = services["dashboard"]["command"]
    port = dashboard[dashboard.index("--port") + 1]
    assert scrape["static_configs"] == [{"targets": [f"dashboard:{port}"]}]
    assert "--no-token" in dashboard  # else Prometheus would need the bearer token
    grafana = services["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    assert mounts["./deploy/grafana/strata.json"].startswith("/var/lib/grafana/dashboards/")
    provisioning = ROOT / "deploy/grafana/provisioning"
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    source = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())
    (datasource,) = source["datasources"]
    published = prometheus["ports"][0].split(":")[-1]
    assert datasource["url"] == f"http://prometheus:{published}"
    assert datasource["type"] == "prometheus"
    (provider,) = yaml.safe_load((provisioning / "dashboards/strata.yml").read_text())["providers"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"

"""docker-compose.yml is well-formed (no Docker engine here: structure is checked, not run)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_compose_file_is_consistent() -> None:
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = spec["services"]
    assert {"redis", "minio", "demo"} <= set(services)
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        for dep in service.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown service {dep}"
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        for volume in service.get("volumes", []):
            assert volume.split(":")[0] in spec.get("volumes", {}), volume
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

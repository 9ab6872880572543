"""S3Storage's clients share the process's botocore data loader (its JSON parsed once), by
data path. No server: a client is made without a request."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from strata_redis.storage import S3Storage

ENDPOINT = "http://127.0.0.1:9"  # (never connected to: no request is made)


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys in the environment: botocore looks no further (no instance metadata request)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unit")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "unit")


def test_a_second_storage_parses_no_botocore_data_again() -> None:
    first = S3Storage("bucket-a", "us-east-1", ENDPOINT)
    began = time.perf_counter()
    second = S3Storage("bucket-b", "eu-west-1", ENDPOINT, prefix="p")
    took = time.perf_counter() - began
    assert second._client._loader is first._client._loader
    assert second._client is not first._client  # (a client, and its pool, of its own)
    assert second._client.meta.region_name == "eu-west-1"
    print(f"a second S3Storage: {took * 1000:.1f} ms")  # (a figure, not a claim)


def test_another_data_path_gets_a_loader_of_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    default = S3Storage("bucket-a", "us-east-1", ENDPOINT)
    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path))
    other = S3Storage("bucket-a", "us-east-1", ENDPOINT)
    assert other._client._loader is not default._client._loader
    assert str(tmp_path) in other._client._loader.search_paths
    assert S3Storage("bucket-b", "us-east-1", ENDPOINT)._client._loader is other._client._loader

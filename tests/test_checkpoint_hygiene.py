"""Checkpoint hygiene: no multipart upload left open after a cut or aborted upload (the write
aborts its own, retention sweeps the rest), and no object references saved as data."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import strata_redis
from strata_redis import S3Storage, StorageError
from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.checkpoint.manifest import checkpoint_dir, checkpoints_prefix
from strata_redis.checkpoint.retention import prune
from strata_redis.storage.transfer import MiB

BUCKET = "hygiene"
SMALL_PARTS: dict[str, Any] = {"multipart_threshold": 5 * MiB, "part_size": 5 * MiB}


@contextlib.contextmanager
def admin(endpoint: str) -> Iterator[Any]:
    import boto3

    client = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1")
    try:
        yield client
    finally:
        client.close()


def open_uploads(endpoint: str, prefix: str = "") -> list[str]:
    with admin(endpoint) as client:
        reply = client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix)
    return [u["Key"] for u in reply.get("Uploads", [])]


@pytest.fixture
def s3(s3_endpoint: str) -> Iterator[S3Storage]:
    with admin(s3_endpoint) as client:
        client.create_bucket(Bucket=BUCKET)
    with S3Storage(BUCKET, endpoint_url=s3_endpoint, max_attempts=1, **SMALL_PARTS) as storage:
        yield storage


class Outage(Exception):
    """S3 went away (raised from a botocore hook)."""


def _fail(names: set[str], after: int = 0) -> Any:
    calls = {"n": 0}

    def hook(model: Any, **_: Any) -> None:
        if model.name in names:
            calls["n"] += 1
            if calls["n"] > after:
                raise Outage(f"S3 outage during {model.name}")

    return hook


def test_s3_outage_mid_upload_then_retention_leaves_no_open_upload(
    s3: S3Storage, s3_endpoint: str, redis_url: str
) -> None:
    job = strata_redis.connect(redis_url, "run-9")
    path = f"{checkpoint_dir('run-9', CheckpointId(100))}/rank_0.bin"
    events = s3._client.meta.events
    # the second part fails, and so does every abort (S3 is down): the upload stays open
    hook = _fail({"UploadPart", "AbortMultipartUpload"}, after=1)
    events.register("before-call.s3", hook)
    try:
        with pytest.raises((StorageError, Outage)):
            s3.write(path, np.ones(12 * MiB, dtype=np.uint8))
    finally:
        events.unregister("before-call.s3", hook)
    assert open_uploads(s3_endpoint) == [path], "the outage left the upload open"
    assert not s3.exists(path)
    # S3 is back: the retention pass sweeps the job's prefix
    report = prune(s3, job.context, keep_count=2, tmp_age=0)
    assert report.tmp_files == 1
    assert open_uploads(s3_endpoint) == []


def test_failed_upload_aborts_its_multipart_upload(s3: S3Storage, s3_endpoint: str) -> None:
    hook = _fail({"UploadPart"}, after=1)
    s3._client.meta.events.register("before-call.s3", hook)
    try:
        with pytest.raises((StorageError, Outage)):
            s3.write("a/big.bin", np.ones(12 * MiB, dtype=np.uint8))
    finally:
        s3._client.meta.events.unregister("before-call.s3", hook)
    assert open_uploads(s3_endpoint) == []


def test_write_retries_an_abort_that_failed(s3: S3Storage, s3_endpoint: str) -> None:
    # the transfer manager's own abort hits the outage; the write's second abort gets through
    seen = {"UploadPart": 0, "AbortMultipartUpload": 0}

    def flaky(model: Any, **_: Any) -> None:
        if model.name in seen:
            seen[model.name] += 1
            if model.name == "UploadPart" and seen[model.name] > 1:
                raise Outage("S3 outage during UploadPart")
            if model.name == "AbortMultipartUpload" and seen[model.name] == 1:
                raise Outage("S3 outage during AbortMultipartUpload")

    s3._client.meta.events.register("before-call.s3", flaky)
    try:
        with pytest.raises((StorageError, Outage)):
            s3.write("a/big.bin", np.ones(12 * MiB, dtype=np.uint8))
    finally:
        s3._client.meta.events.unregister("before-call.s3", flaky)
    assert seen["AbortMultipartUpload"] >= 2
    assert open_uploads(s3_endpoint) == []


def test_interrupted_upload_aborts_its_multipart_upload(s3: S3Storage, s3_endpoint: str) -> None:
    # one thread: the interrupt lands in the writing thread, as a Ctrl-C would
    with S3Storage(BUCKET, endpoint_url=s3_endpoint, max_concurrency=1, **SMALL_PARTS) as one:
        hook = _fail({"UploadPart"}, after=1)

        def interrupt(model: Any, **kwargs: Any) -> None:
            try:
                hook(model, **kwargs)
            except Outage:
                raise KeyboardInterrupt from None

        one._client.meta.events.register("before-call.s3", interrupt)
        with pytest.raises(KeyboardInterrupt):
            one.write("a/big.bin", np.ones(12 * MiB, dtype=np.uint8))
        one._client.meta.events.unregister("before-call.s3", interrupt)
    assert open_uploads(s3_endpoint) == []


def test_remove_abandoned_keeps_young_uploads_and_other_prefixes(
    s3: S3Storage, s3_endpoint: str
) -> None:
    with admin(s3_endpoint) as client:
        mine = client.create_multipart_upload(Bucket=BUCKET, Key="run-9/checkpoints/step_1/x")
        client.upload_part(
            Bucket=BUCKET, Key="run-9/checkpoints/step_1/x", UploadId=mine["UploadId"],
            PartNumber=1, Body=b"x" * 100,
        )  # fmt: skip
        client.create_multipart_upload(Bucket=BUCKET, Key="other-job/checkpoints/step_1/x")
    prefix = checkpoints_prefix("run-9")
    # (moto dates every upload 2010, so ``older_than`` cannot be told apart from None here)
    assert s3.remove_abandoned(prefix) == 1
    assert open_uploads(s3_endpoint) == ["other-job/checkpoints/step_1/x"]
    with pytest.raises(ValueError, match="prefix"):
        s3.remove_abandoned("/abs")


@pytest.mark.parametrize(
    "data",
    [
        np.array([1, "two", None], dtype=object),
        memoryview(np.array([1, 2], dtype=object)),
        np.zeros(2, dtype=[("a", np.int32), ("b", object)]),
    ],
    ids=["object", "object-memoryview", "structured-with-object"],
)
def test_object_arrays_are_refused(data: object, tmp_path: Path, redis_url: str) -> None:
    storage = strata_redis.LocalStorage(tmp_path / "store")
    with pytest.raises(TypeError, match="plain data"):
        storage.write("x.bin", data)
    assert storage.list() == []
    with strata_redis.CheckpointManager(
        storage, redis=redis_url, job_id="obj", worker_id="w"
    ) as ckpt:
        with pytest.raises(TypeError, match="plain data"):
            ckpt.save(data, step=1)
        with pytest.raises(TypeError, match="plain data"):
            ckpt.save({"weights": np.arange(4.0), "meta": data}, step=1)
    # plain structured data still goes
    storage.write("ok.bin", np.zeros(3, dtype=[("O", np.int32), ("P", np.float64)]))

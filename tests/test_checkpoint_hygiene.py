"""Checkpoint hygiene: no multipart upload left open after a cut or aborted upload (the write
aborts its own, retention sweeps the rest), and no object references saved as data."""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import strata_redis
from strata_redis import S3Storage, StorageError
from strata_redis.checkpoint.commit import StepProtocol
from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.checkpoint.manifest import checkpoint_dir, checkpoints_prefix
from strata_redis.checkpoint.retention import prune
from strata_redis.storage.base import TMP_PREFIX
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


# -- retention spares what is in flight, and judges age by the store's clock ----------------
def test_retention_never_aborts_the_upload_of_a_save_in_flight(
    s3: S3Storage, s3_endpoint: str, redis_url: str
) -> None:
    # The issue's case: step 2's 12 MiB save is mid-upload while a retention pass runs (the
    # one after step 1's commit). moto dates every upload 2010, past any tmp_age: only the
    # step's state in Redis (open) tells the pass it is not abandoned.
    started, go = threading.Event(), threading.Event()

    def hold(model: Any, **_: Any) -> None:
        if model.name == "UploadPart":
            started.set()
            go.wait(30)

    with strata_redis.CheckpointManager(
        s3, keep_count=1, redis=redis_url, job_id="run-9", worker_id="w"
    ) as ckpt:
        ckpt.save(b"one", step=1).result(timeout=30)
        s3._client.meta.events.register("before-call.s3", hold)
        try:
            future = ckpt.save(np.ones(12 * MiB, dtype=np.uint8), step=2)
            assert started.wait(30)
            # an abandoned upload of a step with no state in Redis goes, as before
            with admin(s3_endpoint) as client:
                client.create_multipart_upload(Bucket=BUCKET, Key="run-9/checkpoints/step_0/x")
            report = ckpt.prune()
        finally:
            go.set()
            s3._client.meta.events.unregister("before-call.s3", hold)
        assert report.tmp_files == 1
        assert future.result(timeout=60).step == 2  # its upload was not aborted
        assert ckpt.load() == np.ones(12 * MiB, dtype=np.uint8).tobytes()
    assert open_uploads(s3_endpoint) == []


def test_retention_spares_a_local_write_of_a_step_in_flight(tmp_path: Path, redis_url: str) -> None:
    storage = strata_redis.LocalStorage(tmp_path / "store")
    job = strata_redis.connect(redis_url, "run-9")
    StepProtocol(job.context, storage, worker_id="w", rank=0, world_size=1).begin(CheckpointId(7))
    old = time.time() - 3600
    debris = {}
    for step in (3, 7):  # 3 has no state in Redis: abandoned; 7 is open: a rank writes there
        directory = tmp_path / "store" / checkpoint_dir("run-9", CheckpointId(step)) / "rank_0"
        directory.mkdir(parents=True)
        debris[step] = directory / f"{TMP_PREFIX}abc"
        debris[step].write_bytes(b"half a part")
        os.utime(debris[step], (old, old))
    report = prune(storage, job.context, keep_count=2, tmp_age=600)
    assert report.tmp_files == 1
    assert debris[7].exists() and not debris[3].exists()


def test_upload_age_is_judged_by_the_store_clock(
    s3: S3Storage, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store that dates uploads right (moto does not: it says 2010): each upload listed was
    # initiated ``age`` seconds before the reply's Date, the store's clock.
    age = {"seconds": 0.0}

    def dated(http_response: Any, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        now = email.utils.parsedate_to_datetime(http_response.headers["Date"])
        for upload in parsed.get("Uploads", []):
            upload["Initiated"] = now - datetime.timedelta(seconds=age["seconds"])

    s3._client.meta.events.register("after-call.s3.ListMultipartUploads", dated)
    with admin(s3_endpoint) as client:
        client.create_multipart_upload(Bucket=BUCKET, Key="run-9/checkpoints/step_1/x")
    real = time.time
    # this machine's clock 10 minutes fast: the fresh upload would look 10 minutes old
    monkeypatch.setattr(time, "time", lambda: real() + 600)
    assert s3.remove_abandoned("run-9/", older_than=300) == 0
    assert open_uploads(s3_endpoint) == ["run-9/checkpoints/step_1/x"]
    age["seconds"] = 400  # older than older_than by the store's clock: it goes
    assert s3.remove_abandoned("run-9/", older_than=300) == 1
    assert open_uploads(s3_endpoint) == []

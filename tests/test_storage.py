"""Storage backends: one contract run against LocalStorage and S3Storage (a real S3 endpoint)."""

from __future__ import annotations

import array
import contextlib
import json
import os
import pickle
import re
import socket
import sys
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from strata_redis.errors import StorageError, StorageExistsError, StorageNotFoundError
from strata_redis.storage import (
    LocalStorage,
    S3Storage,
    Storage,
    as_byte_view,
    open_storage,
    part_size_for,
    storage_from_env,
    storage_from_url,
)
from strata_redis.storage.base import TMP_PREFIX
from strata_redis.storage.transfer import MAX_OBJECT_SIZE, MAX_PARTS, MIN_PART_SIZE, MiB

from .procs import kill9, spawn
from .s3server import MotoServer

BUCKET = "strata-test"
# A recognizable secret: it must never show up in a message, a repr or a traceback.
SECRET = "sEcReT-MaRkEr-7f3a9c1e"
S3_SMALL_PARTS: dict[str, Any] = {"multipart_threshold": 5 * MiB, "part_size": 5 * MiB}


@contextmanager
def admin(endpoint: str) -> Iterator[Any]:
    """A plain boto3 client on the endpoint, to set up and inspect behind the storage's back."""
    import boto3

    client = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1")
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    with admin(s3_endpoint) as client:
        client.create_bucket(Bucket=BUCKET)
    return BUCKET


@pytest.fixture
def s3(s3_endpoint: str, bucket: str) -> Iterator[S3Storage]:
    with S3Storage(
        bucket, endpoint_url=s3_endpoint, prefix="ckpt/run-1", max_attempts=2, **S3_SMALL_PARTS
    ) as storage:
        yield storage


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return LocalStorage(tmp_path / "root")
    return request.getfixturevalue("s3")  # type: ignore[no-any-return]


def no_secret(*texts: object) -> None:
    for text in texts:
        assert SECRET not in str(text)


def full_text(exc: BaseException) -> str:
    """The exception as a traceback prints it: message, chained causes, reprs."""
    return "".join(traceback.format_exception(exc)) + repr(exc)


BAD_PATHS = [
    "", "/etc/passwd", "../x", "a/../../x", "a/..", "./a", "a/./b", "a//b", "a/", "a\\..\\b",
    "..\\x", "a\x00b", "a\nb", "\x7f", TMP_PREFIX + "x", "a/" + TMP_PREFIX + "1", "n" * 256,
    "a/" * 600, "\udc80",
]  # fmt: skip

BUFFERS: dict[str, Callable[[], Any]] = {
    "bytes": lambda: b"\x00\x01payload" * 100,
    "bytearray": lambda: bytearray(range(256)) * 4,
    "memoryview": lambda: memoryview(b"abcdef" * 50),
    "memoryview-slice": lambda: memoryview(bytes(range(256)) * 4)[3:900],
    "array": lambda: array.array("d", [1.5, -2.0, 3.25]),
    "numpy-2d-float32": lambda: np.arange(1000, dtype=np.float32).reshape(10, 100),
    "numpy-big-endian": lambda: np.arange(100, dtype=">i4"),
    "numpy-complex": lambda: np.ones(10, dtype=np.complex64) * (1 + 2j),
    "numpy-structured": lambda: np.zeros(5, dtype=[("a", "<i4"), ("b", "<f8")]),
    "numpy-empty": lambda: np.zeros((0, 3)),
    "empty-bytes": lambda: b"",
}


class TestContract:
    """What every backend promises; run against both."""

    def test_roundtrip(self, storage: Storage) -> None:
        storage.write("step_1/model.bin", b"weights")
        assert storage.read("step_1/model.bin") == b"weights"
        assert storage.exists("step_1/model.bin")

    def test_overwrite_replaces(self, storage: Storage) -> None:
        storage.write("m.bin", b"first version")
        storage.write("m.bin", b"second, longer version " * 10)
        storage.write("m.bin", b"third")
        assert storage.read("m.bin") == b"third"
        assert storage.list() == ["m.bin"]

    def test_exists_and_delete(self, storage: Storage) -> None:
        assert not storage.exists("a/b.bin")
        storage.write("a/b.bin", b"x")
        assert storage.exists("a/b.bin")
        storage.delete("a/b.bin")
        assert not storage.exists("a/b.bin")
        with pytest.raises(StorageNotFoundError):
            storage.read("a/b.bin")
        storage.delete("a/b.bin")  # missing: a no-op
        storage.delete("never/there")

    def test_list_is_sorted_and_filters_by_string_prefix(self, storage: Storage) -> None:
        names = ["step_2/model.bin", "step_10/model.bin", "top.bin", "step_1/model.bin",
                 "step_1/metadata.json"]  # fmt: skip
        for name in names:
            storage.write(name, name.encode())
        assert storage.list() == sorted(names)
        assert storage.list("step_1") == ["step_1/metadata.json", "step_1/model.bin",
                                          "step_10/model.bin"]  # fmt: skip
        assert storage.list("step_1/") == ["step_1/metadata.json", "step_1/model.bin"]
        assert storage.list("step_1/mo") == ["step_1/model.bin"]
        assert storage.list("nothing") == []
        with pytest.raises(ValueError, match="prefix"):
            storage.list("../")

    def test_read_range_reads_only_the_range(self, storage: Storage) -> None:
        data = bytes(range(256)) * 40
        storage.write("shards/s.tar", data)
        assert storage.read_range("shards/s.tar", 0, 10) == data[:10]
        assert storage.read_range("shards/s.tar", 1000, 3000) == data[1000:4000]
        assert storage.read_range("shards/s.tar", len(data) - 5, 100) == data[-5:]  # the end
        assert storage.read_range("shards/s.tar", len(data), 10) == b""
        assert storage.read_range("shards/s.tar", len(data) + 7, 10) == b""
        assert storage.read_range("shards/s.tar", 3, 0) == b""
        with pytest.raises(StorageNotFoundError, match=re.escape("no object at 'shards/none.tar'")):
            storage.read_range("shards/none.tar", 0, 10)
        with pytest.raises(StorageNotFoundError):
            storage.read_range("shards/none.tar", 0, 0)
        with pytest.raises(ValueError, match="start must be >= 0"):
            storage.read_range("shards/s.tar", -1, 10)
        with pytest.raises(TypeError, match="length must be an int"):
            storage.read_range("shards/s.tar", 0, 1.5)  # type: ignore[arg-type]

    def test_missing_object_is_not_found(self, storage: Storage) -> None:
        with pytest.raises(
            StorageNotFoundError, match=re.escape("no object at 'nope/x.bin'")
        ) as info:
            storage.read("nope/x.bin")
        assert info.value.path == "nope/x.bin"
        assert info.value.backend == storage.describe()

    def test_a_directory_is_not_an_object(self, storage: Storage) -> None:
        storage.write("a/b", b"x")
        assert not storage.exists("a")
        with pytest.raises(StorageNotFoundError):
            storage.read("a")
        storage.delete("a")
        assert storage.read("a/b") == b"x"

    def test_write_chunks_stores_them_one_after_the_other(self, storage: Storage) -> None:
        # more pieces than one gathered write takes (IOV_MAX 1024), empty ones, a big one
        # over the 5 MiB threshold of the S3 fixture: a multipart upload read across pieces
        data = np.random.default_rng(2).integers(0, 256, 6 * MiB + 11, dtype=np.uint8)
        pieces = [memoryview(bytes([i % 256]) * (i % 7)) for i in range(2500)]
        pieces += [memoryview(data)[: 2 * MiB], memoryview(b""), memoryview(data)[2 * MiB :]]
        storage.write_chunks("parts/model.pt", pieces)
        assert storage.read("parts/model.pt") == b"".join(pieces)
        storage.write_chunks("parts/model.pt", [memoryview(b"short")])  # replaces it
        assert storage.read("parts/model.pt") == b"short"
        assert storage.list("parts/") == ["parts/model.pt"]

    def test_empty_object(self, storage: Storage) -> None:
        storage.write("empty", b"")
        assert storage.exists("empty")
        assert storage.read("empty") == b""

    def test_large_object_roundtrip(self, storage: Storage) -> None:
        # Over the 5 MiB threshold of the S3 fixture: a 3-part upload and ranged GETs.
        data = np.random.default_rng(1).integers(0, 256, 12 * MiB + 7, dtype=np.uint8)
        storage.write("big/model.bin", data)
        assert storage.read("big/model.bin") == data.tobytes()
        storage.write("big/model.bin", data[: 11 * MiB])  # overwrite with a shorter one
        assert storage.read("big/model.bin") == data[: 11 * MiB].tobytes()

    def test_bad_paths_are_refused(self, storage: Storage) -> None:
        # One test for all (not parametrized): each S3 setup costs a bucket.
        calls: list[Callable[[str], object]] = [
            lambda bad: storage.write(bad, b"x"),
            lambda bad: storage.write_if_absent(bad, b"x"),
            storage.read,
            storage.exists,
            storage.delete,
        ]
        for bad in BAD_PATHS:
            for call in calls:
                with pytest.raises(ValueError, match=re.escape(repr(bad)[:40])):
                    call(bad)
        assert storage.list() == []

    @pytest.mark.parametrize("bad", [b"a", 1, None, Path("a")], ids=repr)
    def test_non_str_paths_are_refused(self, storage: Storage, bad: object) -> None:
        with pytest.raises(TypeError, match="path must be a str"):
            storage.write(bad, b"x")  # type: ignore[arg-type]

    def test_unicode_names(self, storage: Storage) -> None:
        names = ["données/modèle.bin", "模型/检查点 1.bin", "emoji/😀 µ.bin", "ñ"]
        for name in names:
            storage.write(name, name.encode())
        for name in names:
            assert storage.read(name) == name.encode()
        assert storage.list() == sorted(names)

    def test_buffer_types(self, storage: Storage) -> None:
        for kind, make in BUFFERS.items():
            data = make()
            storage.write(f"buf/{kind}", data)
            assert storage.read(f"buf/{kind}") == memoryview(data).tobytes(), kind
        assert len(storage.list("buf/")) == len(BUFFERS)

    def test_non_contiguous_buffer_is_refused(self, storage: Storage) -> None:
        with pytest.raises(ValueError, match="C-contiguous"):
            storage.write("x", np.arange(10)[::2])
        assert not storage.exists("x")

    def test_non_buffer_is_refused(self, storage: Storage) -> None:
        for bad in ["text", 12, [1, 2], None, object()]:
            with pytest.raises(TypeError, match=type(bad).__name__):
                storage.write("x", bad)
            with pytest.raises(TypeError, match=type(bad).__name__):
                storage.write_if_absent("x", bad)
        assert not storage.exists("x")

    def test_write_if_absent_never_overwrites(self, storage: Storage) -> None:
        storage.write_if_absent("step_5/metadata.json", b'{"step": 5}')
        with pytest.raises(StorageExistsError, match="already exists") as info:
            storage.write_if_absent("step_5/metadata.json", b'{"step": 6}')
        assert info.value.path == "step_5/metadata.json"
        assert storage.read("step_5/metadata.json") == b'{"step": 5}'
        storage.write("plain", b"1")
        with pytest.raises(StorageExistsError):
            storage.write_if_absent("plain", np.zeros(4))
        storage.delete("step_5/metadata.json")
        storage.write_if_absent("step_5/metadata.json", bytearray(b"again"))
        assert storage.read("step_5/metadata.json") == b"again"
        assert storage.list() == ["plain", "step_5/metadata.json"]

    def test_describe_and_repr(self, storage: Storage) -> None:
        assert storage.describe().startswith(("file:///", "s3://"))
        assert type(storage).__name__ in repr(storage)
        no_secret(storage.describe(), repr(storage))

    def test_pickles(self, storage: Storage) -> None:
        storage.write("p", b"pickled")
        blob = pickle.dumps(storage)
        assert SECRET.encode() not in blob
        with pickle.loads(blob) as copy:
            assert copy.read("p") == b"pickled"
            assert repr(copy) == repr(storage)


def test_byte_views_share_the_callers_memory() -> None:
    for data in (bytearray(b"abc"), np.arange(3, dtype=np.int64), np.arange(3, dtype=">i4")):
        view = as_byte_view(data)
        assert view.readonly and view.format == "B" and view.ndim == 1
        assert view.nbytes == memoryview(cast(Any, data)).nbytes
        data[0] = 99  # a change the view must see: no copy was made
        assert view.tobytes() == memoryview(cast(Any, data)).tobytes()


# -- local ---------------------------------------------------------------------------------


def test_local_seed_example(tmp_path: Path) -> None:
    LocalStorage(tmp_path / "mnt/nvme/checkpoints").write("epoch_1/model.bin", bytes(1024))
    assert (tmp_path / "mnt/nvme/checkpoints/epoch_1/model.bin").read_bytes() == bytes(1024)


def test_local_leaves_no_temporary_files_and_hides_leftovers(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.write("a/b/c.bin", b"1")
    storage.write("a/b/c.bin", b"2")
    storage.write_if_absent("a/m.json", b"{}")
    with pytest.raises(StorageExistsError):
        storage.write_if_absent("a/m.json", b"[]")
    on_disk = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert on_disk == ["a/b/c.bin", "a/m.json"]
    (tmp_path / "a" / (TMP_PREFIX + "deadbeef")).write_bytes(b"half")  # a crashed writer's
    assert storage.list() == ["a/b/c.bin", "a/m.json"]


def test_local_delete_prunes_empty_directories_but_not_root(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "root")
    storage.write("a/b/c.bin", b"1")
    storage.write("a/keep.bin", b"1")
    storage.delete("a/b/c.bin")
    assert not (tmp_path / "root/a/b").exists()
    assert (tmp_path / "root/a/keep.bin").exists()
    storage.delete("a/keep.bin")
    assert list((tmp_path / "root").iterdir()) == []


def test_local_filesystem_errors_are_storage_errors(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.write("file", b"x")
    with pytest.raises(StorageError, match="cannot write 'file/child'") as info:
        storage.write("file/child", b"y")
    assert isinstance(info.value.__cause__, OSError)
    assert storage.list() == ["file"]


def test_local_root_is_validated(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="root"):
        LocalStorage(12)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="root"):
        LocalStorage("")
    assert LocalStorage("rel").root == os.path.abspath("rel")
    assert LocalStorage(tmp_path / "x y").describe() == (tmp_path / "x y").as_uri()


def _rewrite_forever(root: str, path: str, size: int) -> None:
    """Child process: overwrite ``path`` with uniform contents, a new byte each time."""
    storage = LocalStorage(root)
    fill = 1
    while True:
        storage.write(path, bytes([fill]) * size)
        fill = fill % 255 + 1


def test_local_writer_killed_mid_write_leaves_old_or_new_never_half(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    size = 32 * MiB
    storage.write("step/model.bin", bytes(size))
    target = tmp_path / "step/model.bin"

    def partly_written(leftovers: set[str]) -> bool:
        for name in set(os.listdir(tmp_path / "step")) - leftovers - {"model.bin"}:
            with contextlib.suppress(FileNotFoundError):  # renamed in place meanwhile
                if 0 < os.path.getsize(tmp_path / "step" / name) < size:
                    return True
        return False

    for _ in range(3):
        # the temporary files of earlier killed writers stay: only this writer's count
        leftovers = set(os.listdir(tmp_path / "step"))
        proc = spawn(_rewrite_forever, str(tmp_path), "step/model.bin", size)
        deadline = time.monotonic() + 30
        # Kill when the writer is seen holding a partly written file: mid-write by observation.
        # Meanwhile the target must always be whole.
        while not partly_written(leftovers):
            assert os.path.getsize(target) == size, "a reader saw a half-written file"
            assert time.monotonic() < deadline, "never saw a write in progress"
        kill9(proc)
        data = storage.read("step/model.bin")
        assert len(data) == size
        assert data.count(data[:1]) == size, "a torn file: two versions mixed"
        assert storage.list() == ["step/model.bin"]


def test_local_concurrent_reader_sees_whole_versions(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    size = MiB
    storage.write("m.bin", bytes(size))
    stop = threading.Event()

    def writer() -> None:
        fill = 1
        while not stop.is_set():
            storage.write("m.bin", bytes([fill]) * (size + fill))
            fill = fill % 200 + 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(200):
            data = storage.read("m.bin")
            assert data.count(data[:1]) == len(data)
            assert len(data) == size + data[0]
    finally:
        stop.set()
        thread.join()


# -- S3 ------------------------------------------------------------------------------------


def test_s3_seed_example(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # the standard variable, as for MinIO
    with admin(s3_endpoint) as client:
        client.create_bucket(Bucket="my-bucket-name")
        client.put_object(Bucket="my-bucket-name", Key="checkpoints/latest.pt", Body=b"pt")
    with S3Storage("my-bucket-name", "us-east-1") as storage:
        assert storage.read("checkpoints/latest.pt") == b"pt"


def test_s3_large_write_is_multipart(s3: S3Storage, s3_endpoint: str) -> None:
    s3.write("big.bin", np.ones(12 * MiB, dtype=np.uint8))
    s3.write("at.bin", np.ones(5 * MiB, dtype=np.uint8))  # at the threshold: multipart
    s3.write("small.bin", np.ones(5 * MiB - 1, dtype=np.uint8))  # below it: one PUT
    with admin(s3_endpoint) as client:

        def etag(name: str) -> str:
            return str(client.head_object(Bucket=BUCKET, Key=f"ckpt/run-1/{name}")["ETag"])

        assert etag("big.bin").endswith('-3"')
        assert etag("at.bin").endswith('-1"')
        assert "-" not in etag("small.bin")
        assert client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


def test_s3_prefix_isolates_objects(s3: S3Storage, s3_endpoint: str) -> None:
    with admin(s3_endpoint) as client:
        client.put_object(Bucket=BUCKET, Key="other-job/model.bin", Body=b"theirs")
        client.put_object(Bucket=BUCKET, Key="ckpt/run-10/model.bin", Body=b"theirs")
    s3.write("model.bin", b"ours")
    assert s3.list() == ["model.bin"]
    assert s3.describe() == f"s3://{BUCKET}/ckpt/run-1"


@pytest.mark.parametrize(
    "size", [0, 1, 16 * MiB, 160 * 1024 * MiB, 1024**4, 3 * 1024**4 + 17, MAX_OBJECT_SIZE]
)
def test_part_size_keeps_parts_within_limits(size: int) -> None:
    part = part_size_for(size, 16 * MiB)
    assert part >= 16 * MiB and part % MiB == 0
    assert -(-size // part) <= MAX_PARTS


def test_part_size_refuses_objects_beyond_s3s_limit() -> None:
    assert part_size_for(MIN_PART_SIZE, MIN_PART_SIZE) == MIN_PART_SIZE
    with pytest.raises(ValueError, match="at most"):
        part_size_for(MAX_OBJECT_SIZE + 1, 16 * MiB)


def test_s3_missing_bucket_is_a_storage_error_not_not_found(s3_endpoint: str) -> None:
    with S3Storage("no-such-bucket", endpoint_url=s3_endpoint, max_attempts=1) as storage:
        calls: list[Callable[[], object]] = [
            lambda: storage.read("x"),
            lambda: storage.exists("x"),
            lambda: storage.write("x", b"1"),
            lambda: storage.write("x", bytes(6 * MiB)),
            lambda: storage.write_if_absent("x", b"1"),
            lambda: storage.list(),
            lambda: storage.delete("x"),
        ]
        for call in calls:
            with pytest.raises(
                StorageError, match="bucket 'no-such-bucket' does not exist"
            ) as info:
                call()
            assert not isinstance(info.value, StorageNotFoundError)
            assert info.value.backend == "s3://no-such-bucket"


def test_s3_stopped_server_is_a_storage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    server = MotoServer().start()
    try:
        with admin(server.endpoint_url) as client:
            client.create_bucket(Bucket=BUCKET)
        storage = S3Storage(BUCKET, "us-east-1", server.endpoint_url, max_attempts=1,
                            connect_timeout=2, **S3_SMALL_PARTS)  # fmt: skip
        storage.write("m.bin", b"before")
    finally:
        server.stop()
    with storage:
        calls: list[Callable[[], object]] = [
            lambda: storage.write("m.bin", b"after"),
            lambda: storage.write("big.bin", bytes(12 * MiB)),
            lambda: storage.write_if_absent("meta.json", b"{}"),
            lambda: storage.read("m.bin"),
            lambda: storage.exists("m.bin"),
            lambda: storage.list(),
            lambda: storage.delete("m.bin"),
        ]
        started = time.monotonic()
        for call in calls:
            with pytest.raises(StorageError, match=f"bucket '{BUCKET}'") as info:
                call()
            assert not isinstance(info.value, StorageNotFoundError)
            assert "Could not connect" in str(info.value)
            no_secret(full_text(info.value))
        assert time.monotonic() - started < 20


@pytest.mark.parametrize("attempts", [1, 3])
def test_s3_max_attempts_bounds_the_retries(attempts: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    # A server that hangs up on every request: each attempt is one accepted connection.
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = 0

    def serve() -> None:
        nonlocal accepted
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted += 1
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        with (
            S3Storage(BUCKET, "us-east-1", endpoint, max_attempts=attempts) as storage,
            pytest.raises(StorageError, match=re.escape(f"cannot stat 'x' (bucket '{BUCKET}')")),
        ):
            storage.exists("x")
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept()
        listener.close()
        thread.join(5)
    assert accepted == attempts


@pytest.fixture
def auth_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, dict[str, str]]]:
    """A private S3 endpoint enforcing IAM: bucket ``BUCKET`` holds ``m.bin``; returns the URL
    and the keys of a user allowed only to read and list."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    server = MotoServer().start()
    try:
        endpoint = server.endpoint_url
        with admin(endpoint) as client:
            client.create_bucket(Bucket=BUCKET)
            client.put_object(Bucket=BUCKET, Key="m.bin", Body=b"original")
        iam = boto3.session.Session().client("iam", endpoint_url=endpoint, region_name="us-east-1")
        read_only = {"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"],
                     "Resource": "*"}  # fmt: skip
        iam.create_user(UserName="reader")
        iam.put_user_policy(
            UserName="reader",
            PolicyName="read-only",
            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [read_only]}),
        )
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        iam.close()
        set_auth(endpoint, "0")  # from now on every request is authenticated and authorized
        yield endpoint, {"id": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
    finally:
        server.stop()


def set_auth(endpoint: str, free_requests: str) -> None:
    """Moto's switch: requests after the first ``free_requests`` must pass IAM ("inf": off)."""
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth", data=free_requests.encode(), method="POST",
        headers={"Content-Type": "text/plain"},
    )  # fmt: skip
    urllib.request.urlopen(request, timeout=5).close()


def test_s3_denied_write_is_a_storage_error_and_changes_nothing(
    auth_server: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, reader = auth_server
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", reader["id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", reader["secret"])
    with S3Storage(BUCKET, endpoint_url=endpoint, max_attempts=1, **S3_SMALL_PARTS) as storage:
        assert storage.read("m.bin") == b"original"  # the credentials work: reads are allowed
        calls: list[Callable[[], object]] = [
            lambda: storage.write("m.bin", b"overwritten"),
            lambda: storage.write("m.bin", bytes(12 * MiB)),  # multipart
            lambda: storage.write_if_absent("new.json", b"{}"),
            lambda: storage.delete("m.bin"),
        ]
        for call in calls:
            with pytest.raises(StorageError, match="access denied") as info:
                call()
            assert reader["secret"] not in full_text(info.value)
        assert storage.read("m.bin") == b"original"
        assert storage.list() == ["m.bin"]
    set_auth(endpoint, "inf")
    with admin(endpoint) as client:
        assert client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


def test_s3_bad_credentials_are_storage_errors_without_the_secret(
    auth_server: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, reader = auth_server
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", reader["id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)  # the wrong secret for this key
    with S3Storage(BUCKET, endpoint_url=endpoint, max_attempts=1) as storage:
        for call in (lambda: storage.read("m.bin"), lambda: storage.list()):
            with pytest.raises(StorageError, match="access denied") as info:
                call()
            no_secret(full_text(info.value), repr(storage))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000")
    with S3Storage(BUCKET, endpoint_url=endpoint, max_attempts=1) as storage:
        with pytest.raises(StorageError, match="InvalidAccessKeyId") as info:
            storage.write("m.bin", b"x")
        no_secret(full_text(info.value))


def test_s3_no_credentials_is_a_storage_error(
    s3_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with (
        S3Storage(bucket, endpoint_url=s3_endpoint, max_attempts=1) as storage,
        pytest.raises(StorageError, match="no AWS credentials found"),
    ):
        storage.write("m.bin", b"x")


def test_s3_secret_never_shown(s3: S3Storage) -> None:
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == SECRET
    with pytest.raises(StorageNotFoundError) as info:
        s3.read("missing")
    no_secret(full_text(info.value), repr(s3), s3.describe(), vars(s3))


def test_s3_arguments_are_validated(s3_endpoint: str) -> None:
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"bucket": ""}, ValueError, "bucket"),
        ({"bucket": "a/b"}, ValueError, "bucket"),
        ({"bucket": 5}, TypeError, "bucket"),
        ({"endpoint_url": "ftp://x"}, ValueError, "endpoint_url"),
        ({"endpoint_url": "http://user:pw@host:9000"}, ValueError, "credentials"),
        ({"part_size": MIN_PART_SIZE - 1}, ValueError, "part_size"),
        ({"multipart_threshold": 0}, ValueError, "multipart_threshold"),
        ({"max_concurrency": 0}, ValueError, "max_concurrency"),
        ({"max_attempts": True}, TypeError, "max_attempts"),
        ({"read_timeout": -1}, ValueError, "read_timeout"),
        ({"prefix": "../up"}, ValueError, "prefix"),
        ({"addressing_style": "sideways"}, ValueError, "addressing_style"),
    ]
    for override, exc_type, match in cases:
        kwargs: dict[str, Any] = {"bucket": BUCKET, "endpoint_url": s3_endpoint, **override}
        with pytest.raises(exc_type, match=match):
            S3Storage(**kwargs)


def test_s3_reads_region_and_endpoint_from_the_environment(
    s3_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    with S3Storage(bucket) as storage:
        assert "eu-central-1" in repr(storage) and s3_endpoint in repr(storage)
        storage.write("x", b"1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "minio:9000")  # the S3-specific one wins
    with pytest.raises(ValueError, match="AWS_ENDPOINT_URL_S3"):
        S3Storage(bucket)


def test_s3_without_boto3_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # what a missing package looks like
    with pytest.raises(ImportError, match=re.escape("pip install 'strata-redis[s3]'")):
        S3Storage(BUCKET)


# -- choosing a backend --------------------------------------------------------------------


def test_from_url_s3(s3_endpoint: str) -> None:
    with storage_from_url("s3://my-bucket/models/run-7", endpoint_url=s3_endpoint) as storage:
        assert isinstance(storage, S3Storage)
        assert (storage.bucket, storage.prefix) == ("my-bucket", "models/run-7")
    with storage_from_url("s3://my-bucket", region="eu-west-1") as storage:
        assert isinstance(storage, S3Storage)
        assert (storage.bucket, storage.prefix) == ("my-bucket", "")
        assert "eu-west-1" in repr(storage)


def test_from_url_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cases = {
        f"file://{tmp_path}/a": f"{tmp_path}/a",
        f"file://localhost{tmp_path}/b": f"{tmp_path}/b",
        f"file://{tmp_path}/with%20space": f"{tmp_path}/with space",
        "relative/dir": f"{tmp_path}/relative/dir",
        str(tmp_path / "plain"): f"{tmp_path}/plain",
        "~/ckpt": os.path.expanduser("~/ckpt"),
    }
    for url, root in cases.items():
        storage = storage_from_url(url)
        assert isinstance(storage, LocalStorage)
        assert storage.root == root, url
    storage = storage_from_url(tmp_path / "pathlike")
    assert isinstance(storage, LocalStorage)
    assert storage.root == str(tmp_path / "pathlike")


@pytest.mark.parametrize(
    ("url", "exc_type", "match"),
    [
        ("", ValueError, "empty"),
        ("gs://bucket/x", ValueError, "unsupported scheme 'gs'"),
        ("s3://", ValueError, "bucket"),
        ("s3:///prefix", ValueError, "bucket"),
        ("s3://Bad_Bucket!/x", ValueError, "bucket"),
        ("s3://bucket/x?region=us-east-1", ValueError, "query"),
        ("s3://bucket/a/../b", ValueError, "prefix"),
        ("file://remote-host/x", ValueError, "remote-host"),
        ("file://relative", ValueError, "remote|relative"),
        ("local\x00dir", ValueError, "NUL"),
        (12, TypeError, "url"),
    ],
    ids=repr,
)
def test_from_url_refuses(url: Any, exc_type: type[Exception], match: str) -> None:
    with pytest.raises(exc_type, match=match):
        storage_from_url(url)


def test_from_url_refuses_s3_options_for_a_local_path(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="region"):
        storage_from_url(str(tmp_path), region="us-east-1")


def test_from_env_local(tmp_path: Path) -> None:
    storage = storage_from_env({"STORAGE_BACKEND": "local", "LOCAL_STORAGE_PATH": str(tmp_path)})
    assert isinstance(storage, LocalStorage) and storage.root == str(tmp_path)
    # none given: the per-user data directory (not the system temp dir)
    storage = storage_from_env({"HOME": str(tmp_path / "home")})
    expected = tmp_path / "home" / ".local" / "share" / "strata_redis" / "checkpoints"
    assert isinstance(storage, LocalStorage) and storage.root == str(expected)
    storage = storage_from_env({"STORAGE_BACKEND": "local", "XDG_DATA_HOME": str(tmp_path)})
    assert isinstance(storage, LocalStorage)
    assert storage.root == str(tmp_path / "strata_redis" / "checkpoints")


def test_from_env_s3_as_the_seeds_say(s3_endpoint: str, bucket: str) -> None:
    env = {"STORAGE_BACKEND": "S3", "CHECKPOINT_BUCKET": bucket, "AWS_REGION": "eu-west-1",
           "AWS_ENDPOINT_URL": s3_endpoint}  # fmt: skip
    with storage_from_env(env) as storage:
        assert isinstance(storage, S3Storage)
        assert (storage.bucket, storage.prefix) == (bucket, "")
        assert "eu-west-1" in repr(storage) and s3_endpoint in repr(storage)
        storage.write("from-env.bin", b"1")
    env["CHECKPOINT_BUCKET"] = f"{bucket}/team/job"
    with storage_from_env(env) as storage:
        storage.write("m.bin", b"2")
    with admin(s3_endpoint) as client:
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert sorted(keys) == ["from-env.bin", "team/job/m.bin"]


def test_open_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = LocalStorage(tmp_path)
    assert open_storage(local) is local
    monkeypatch.setenv("STORAGE_BACKEND", "local")
    monkeypatch.setenv("LOCAL_STORAGE_PATH", str(tmp_path / "env"))
    assert open_storage().describe() == (tmp_path / "env").as_uri()
    assert open_storage(f"file://{tmp_path}/u").describe() == (tmp_path / "u").as_uri()


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"STORAGE_BACKEND": "gcs"}, "STORAGE_BACKEND"),
        ({"STORAGE_BACKEND": "s3"}, "CHECKPOINT_BUCKET"),
        ({"STORAGE_BACKEND": "s3", "CHECKPOINT_BUCKET": "  "}, "CHECKPOINT_BUCKET"),
        ({"STORAGE_BACKEND": "s3", "CHECKPOINT_BUCKET": "no such!"}, "CHECKPOINT_BUCKET"),
        ({"STORAGE_BACKEND": "s3", "CHECKPOINT_BUCKET": "b-1/../x"}, "CHECKPOINT_BUCKET"),
        (
            {"STORAGE_BACKEND": "s3", "CHECKPOINT_BUCKET": "b-1", "AWS_ENDPOINT_URL": "minio:9000"},
            "AWS_ENDPOINT_URL",
        ),
        (
            {"STORAGE_BACKEND": "s3", "CHECKPOINT_BUCKET": "b-1", "AWS_REGION": "us east 1"},
            "AWS_REGION",
        ),
        ({"STORAGE_BACKEND": "local", "LOCAL_STORAGE_PATH": "a\x00b"}, "LOCAL_STORAGE_PATH"),
    ],
    ids=lambda v: "-".join(v.values()) if isinstance(v, dict) else v,
)
def test_from_env_names_the_bad_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ValueError, match=variable):
        storage_from_env(env)


def test_local_write_chunks_carries_on_after_short_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gathered write may write less than asked (a signal, a full pipe): the rest of a
    piece written in part, and the pieces after it, still land in order."""
    real = os.writev
    calls = []

    def short(fd: int, views: list[memoryview]) -> int:
        calls.append(len(views))
        first = views[0]
        return real(fd, [first[: max(1, len(first) // 3)]])  # a third of the first piece

    monkeypatch.setattr(os, "writev", short)
    local = LocalStorage(tmp_path / "root")
    pieces = [memoryview(bytes(range(i, i + 50))) for i in range(0, 200, 50)]
    local.write_chunks("short/model.pt", pieces)
    assert local.read("short/model.pt") == b"".join(pieces)
    assert len(calls) > len(pieces)  # it did write in parts

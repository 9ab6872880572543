"""Storage writes and reads beside the raw calls they wrap, same bytes, same run.

    python perf/bench_storage.py -o perf/results/storage.json
    CHECKPOINT_SIZE_MB=1024 python perf/bench_storage.py --endpoint-url http://minio:9000

Local: ``LocalStorage.write`` (temp file, fsync, rename, fsync of the directory) beside a raw
``write`` + ``fsync`` of the same bytes to the same directory; reads beside a raw ``read``.
S3: ``S3Storage.write``/``read`` beside boto3's managed ``upload_fileobj``/``download_fileobj``
tuned alike (same part size and concurrency), against the same endpoint: ``--endpoint-url``
(credentials from the AWS chain), else a private moto server started here.
Size: ``--size-mb``, else ``CHECKPOINT_SIZE_MB``, else 256 (8 for a ``--debug-single-value``
smoke run).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import pyperf

from strata_redis.storage import LocalStorage, S3Storage

RATIOS = [
    ("LocalStorage.write", "raw write+fsync"),
    ("LocalStorage.read", "raw read"),
    ("S3Storage.write", "raw boto3 upload_fileobj"),
    ("S3Storage.read", "raw boto3 download_fileobj"),
]

MiB = 1024 * 1024
PART_SIZE = 16 * MiB
CONCURRENCY = 10
BUCKET = "strata-bench"
AWS_VARS = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
            "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_CONFIG_FILE",
            "AWS_SHARED_CREDENTIALS_FILE"]  # fmt: skip


def _pass_args(cmd: list[str], args: argparse.Namespace) -> None:
    # pyperf re-runs this script in worker processes: hand them the same endpoint and size.
    cmd.extend(["--endpoint-url", args.endpoint_url, "--size-mb", str(args.size_mb)])
    cmd.extend(["--dir", args.dir])
    if args.redis_url:
        cmd.extend(["--redis-url", args.redis_url])
    if args.dummy_credentials:
        cmd.append("--dummy-credentials")


def start_moto() -> str:
    """A private moto S3 server on a free loopback port, stopped at exit; returns its URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    atexit.register(lambda: (proc.terminate(), proc.wait(10)))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
            return url
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("moto server did not start") from None
            time.sleep(0.1)


def make_data(size_mb: int) -> bytes:
    import numpy as np

    return np.random.default_rng(0).bytes(size_mb * MiB)


def s3_client(endpoint_url: str) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(max_pool_connections=CONCURRENCY + 2, s3={"addressing_style": "path"})
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url, config=config, region_name="us-east-1"
    )


def transfer_config() -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        multipart_threshold=PART_SIZE,
        multipart_chunksize=PART_SIZE,
        max_concurrency=CONCURRENCY,
        preferred_transfer_client="classic",
    )


# -- local ---------------------------------------------------------------------------------
def bench_raw_write(loops: int, data: bytes, directory: str) -> float:
    path = os.path.join(directory, "raw.bin")
    start = time.perf_counter()
    for _ in range(loops):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:])
        os.fsync(fd)
        os.close(fd)
    return time.perf_counter() - start


def bench_local_write(loops: int, data: bytes, directory: str) -> float:
    storage = LocalStorage(directory)
    start = time.perf_counter()
    for _ in range(loops):
        storage.write("step_1/model.bin", data)
    return time.perf_counter() - start


def bench_raw_read(loops: int, data: bytes, directory: str) -> float:
    path = os.path.join(directory, "raw-read.bin")
    with open(path, "wb") as file:
        file.write(data)
    start = time.perf_counter()
    for _ in range(loops):
        with open(path, "rb") as file:
            file.read()
    return time.perf_counter() - start


def bench_local_read(loops: int, data: bytes, directory: str) -> float:
    storage = LocalStorage(directory)
    storage.write("step_1/read.bin", data)
    start = time.perf_counter()
    for _ in range(loops):
        storage.read("step_1/read.bin")
    return time.perf_counter() - start


# -- S3 ------------------------------------------------------------------------------------
def _bucket(client: Any) -> None:
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)


def bench_raw_upload(loops: int, data: bytes, endpoint_url: str) -> float:
    client = s3_client(endpoint_url)
    _bucket(client)
    config = transfer_config()
    start = time.perf_counter()
    for _ in range(loops):
        client.upload_fileobj(io.BytesIO(data), BUCKET, "raw/model.bin", Config=config)
    elapsed = time.perf_counter() - start
    client.close()
    return elapsed


def bench_s3_write(loops: int, data: bytes, endpoint_url: str) -> float:
    client = s3_client(endpoint_url)
    _bucket(client)
    client.close()
    storage = S3Storage(
        BUCKET, "us-east-1", endpoint_url, "strata", max_concurrency=CONCURRENCY,
        multipart_threshold=PART_SIZE, part_size=PART_SIZE,
    )  # fmt: skip
    start = time.perf_counter()
    for _ in range(loops):
        storage.write("step_1/model.bin", data)
    elapsed = time.perf_counter() - start
    storage.close()
    return elapsed


def bench_raw_download(loops: int, data: bytes, endpoint_url: str) -> float:
    client = s3_client(endpoint_url)
    _bucket(client)
    config = transfer_config()
    client.upload_fileobj(io.BytesIO(data), BUCKET, "raw/read.bin", Config=config)
    start = time.perf_counter()
    for _ in range(loops):
        sink = io.BytesIO()
        client.download_fileobj(BUCKET, "raw/read.bin", sink, Config=config)
        sink.getvalue()
    elapsed = time.perf_counter() - start
    client.close()
    return elapsed


def bench_s3_read(loops: int, data: bytes, endpoint_url: str) -> float:
    client = s3_client(endpoint_url)
    _bucket(client)
    client.close()
    storage = S3Storage(
        BUCKET, "us-east-1", endpoint_url, "strata", max_concurrency=CONCURRENCY,
        multipart_threshold=PART_SIZE, part_size=PART_SIZE,
    )  # fmt: skip
    storage.write("step_1/read.bin", data)
    start = time.perf_counter()
    for _ in range(loops):
        storage.read("step_1/read.bin")
    elapsed = time.perf_counter() - start
    storage.close()
    return elapsed


def main() -> None:
    runner = pyperf.Runner(processes=4, values=3, warmups=1, add_cmdline_args=_pass_args)
    parser = runner.argparser
    parser.add_argument("--endpoint-url", help="an S3 endpoint (default: a private moto)")
    parser.add_argument("--size-mb", type=int, help="default: CHECKPOINT_SIZE_MB, else 256")
    parser.add_argument("--dir", help="directory for the local benchmarks (default: a temp dir)")
    parser.add_argument("--redis-url", help="ignored (perf/run.py passes it to every benchmark)")
    parser.add_argument("--dummy-credentials", action="store_true", help=argparse.SUPPRESS)
    args = runner.parse_args()
    if not args.worker:
        if args.size_mb is None:
            # A smoke run (one value) only proves the benchmark works: keep it small.
            smoke = "8" if args.debug_single_value else "256"
            args.size_mb = int(os.environ.get("CHECKPOINT_SIZE_MB", smoke))
        if args.endpoint_url is None:
            args.endpoint_url = start_moto()
            args.dummy_credentials = True
        if args.dir is None:
            args.dir = tempfile.mkdtemp(prefix="strata-bench-")
            atexit.register(shutil.rmtree, args.dir, True)
        args.inherit_environ = (args.inherit_environ or []) + [
            var for var in AWS_VARS if var in os.environ
        ]
    if args.dummy_credentials:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    data = make_data(args.size_mb) if args.worker else b""
    size = f"{args.size_mb} MiB"
    runner.metadata["checkpoint_size_mb"] = args.size_mb
    for name, func, where in [
        ("raw write+fsync", bench_raw_write, args.dir),
        ("LocalStorage.write", bench_local_write, args.dir),
        ("raw read", bench_raw_read, args.dir),
        ("LocalStorage.read", bench_local_read, args.dir),
        ("raw boto3 upload_fileobj", bench_raw_upload, args.endpoint_url),
        ("S3Storage.write", bench_s3_write, args.endpoint_url),
        ("raw boto3 download_fileobj", bench_raw_download, args.endpoint_url),
        ("S3Storage.read", bench_s3_read, args.endpoint_url),
    ]:
        runner.bench_time_func(name, func, data, where, metadata={"description": size})


if __name__ == "__main__":
    main()

"""Shared by the pyperf benchmarks: ``--redis-url`` (else a private redis-server), and for the
storage-backed ones an S3 endpoint (else a private moto server), a size, a directory, and
the raw references they are measured against (write+fsync, a tuned boto3 upload)."""

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

from strata_redis.server import RedisServer

MiB = 1024 * 1024
PART_SIZE = 16 * MiB
CONCURRENCY = 10
BUCKET = "strata-bench"
AWS_VARS = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
            "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_CONFIG_FILE",
            "AWS_SHARED_CREDENTIALS_FILE"]  # fmt: skip


def _pass_args(cmd: list[str], args: argparse.Namespace) -> None:
    # pyperf re-runs this script in worker processes: hand them the same Redis.
    cmd.extend(["--redis-url", args.redis_url])


def make_runner(**kwargs: Any) -> pyperf.Runner:
    """A pyperf Runner with ``--redis-url``; the master starts a private server if none given."""
    runner = pyperf.Runner(add_cmdline_args=_pass_args, **kwargs)
    runner.argparser.add_argument("--redis-url", help="default: a private redis-server")
    args = runner.parse_args()
    if args.redis_url is None:
        server = RedisServer().start()
        atexit.register(server.close)
        args.redis_url = server.url
    return runner


# -- storage-backed benchmarks -------------------------------------------------------------
def _pass_storage_args(cmd: list[str], args: argparse.Namespace) -> None:
    # pyperf re-runs the script in worker processes: hand them the same endpoint, size, dir.
    cmd.extend(["--endpoint-url", args.endpoint_url, "--size-mb", str(args.size_mb)])
    cmd.extend(["--dir", args.dir])
    if args.redis_url:
        cmd.extend(["--redis-url", args.redis_url])
    if args.dummy_credentials:
        cmd.append("--dummy-credentials")


def storage_runner(
    *, redis: bool = False, smoke_mb: int = 8, **kwargs: Any
) -> tuple[pyperf.Runner, argparse.Namespace]:
    """A Runner with ``--endpoint-url``, ``--size-mb``, ``--dir`` and ``--redis-url``.

    The master picks the size (``--size-mb``, else ``CHECKPOINT_SIZE_MB``, else 256, or
    ``smoke_mb`` for a ``--debug-single-value`` smoke run), starts a private moto server
    without ``--endpoint-url`` (dummy credentials), a temp dir without ``--dir``, and with
    ``redis`` a private redis-server without ``--redis-url``.
    """
    runner = pyperf.Runner(add_cmdline_args=_pass_storage_args, **kwargs)
    parser = runner.argparser
    parser.add_argument("--endpoint-url", help="an S3 endpoint (default: a private moto)")
    parser.add_argument("--size-mb", type=int, help="default: CHECKPOINT_SIZE_MB, else 256")
    parser.add_argument("--dir", help="directory for the local benchmarks (default: a temp dir)")
    parser.add_argument("--redis-url", help="default: a private redis-server (if one is used)")
    parser.add_argument("--dummy-credentials", action="store_true", help=argparse.SUPPRESS)
    args = runner.parse_args()
    if not args.worker:
        if args.size_mb is None:
            # A smoke run (one value) only proves the benchmark works: keep it small.
            default = str(smoke_mb) if args.debug_single_value else "256"
            args.size_mb = int(os.environ.get("CHECKPOINT_SIZE_MB", default))
        if args.endpoint_url is None:
            args.endpoint_url = start_moto()
            args.dummy_credentials = True
        if args.dir is None:
            args.dir = tempfile.mkdtemp(prefix="strata-bench-")
            atexit.register(shutil.rmtree, args.dir, True)
        if redis and args.redis_url is None:
            server = RedisServer().start()
            atexit.register(server.close)
            args.redis_url = server.url
        args.inherit_environ = (args.inherit_environ or []) + [
            var for var in AWS_VARS if var in os.environ
        ]
    if args.dummy_credentials:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    runner.metadata["checkpoint_size_mb"] = args.size_mb
    return runner, args


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
    """``size_mb`` MiB of random bytes (the same every time)."""
    import numpy as np

    return np.random.default_rng(0).bytes(size_mb * MiB)


def s3_client(endpoint_url: str) -> Any:
    """A boto3 S3 client on the endpoint, with a connection per transfer thread."""
    import boto3
    from botocore.config import Config

    config = Config(max_pool_connections=CONCURRENCY + 2, s3={"addressing_style": "path"})
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url, config=config, region_name="us-east-1"
    )


def transfer_config() -> Any:
    """boto3's managed transfers tuned like ``S3Storage``: same part size and concurrency."""
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        multipart_threshold=PART_SIZE,
        multipart_chunksize=PART_SIZE,
        max_concurrency=CONCURRENCY,
        preferred_transfer_client="classic",
    )


def create_bucket(client: Any, bucket: str = BUCKET) -> None:
    """Create ``bucket`` unless it exists."""
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)


# -- the raw references ----------------------------------------------------------------------
def bench_raw_write(loops: int, data: bytes, directory: str) -> float:
    """``write`` + ``fsync`` of ``data`` to one file in ``directory``, ``loops`` times."""
    path = os.path.join(directory, "raw.bin")
    start = time.perf_counter()
    for _ in range(loops):
        write_fsync(path, data)
    return time.perf_counter() - start


def write_fsync(path: str, data: Any) -> None:
    """The raw reference: ``write`` all of ``data`` to ``path`` (truncated), then ``fsync``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    view = memoryview(data)
    written = 0
    while written < len(view):
        written += os.write(fd, view[written:])
    os.fsync(fd)
    os.close(fd)


def bench_raw_upload(loops: int, data: bytes, endpoint_url: str) -> float:
    """boto3's managed ``upload_fileobj`` of ``data``, tuned alike, ``loops`` times."""
    client = s3_client(endpoint_url)
    create_bucket(client)
    config = transfer_config()
    start = time.perf_counter()
    for _ in range(loops):
        client.upload_fileobj(io.BytesIO(data), BUCKET, "raw/model.bin", Config=config)
    elapsed = time.perf_counter() - start
    client.close()
    return elapsed

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

import io
import os
import time

from common import (
    BUCKET,
    CONCURRENCY,
    PART_SIZE,
    bench_raw_upload,
    bench_raw_write,
    create_bucket,
    make_data,
    s3_client,
    storage_runner,
    transfer_config,
)

from strata_redis.storage import LocalStorage, S3Storage

RATIOS = [
    ("LocalStorage.write", "raw write+fsync"),
    ("LocalStorage.read", "raw read"),
    ("S3Storage.write", "raw boto3 upload_fileobj"),
    ("S3Storage.read", "raw boto3 download_fileobj"),
]


# -- local ---------------------------------------------------------------------------------
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
def _s3_storage(endpoint_url: str) -> S3Storage:
    """The bucket (created if needed) behind an S3Storage tuned like the raw reference."""
    client = s3_client(endpoint_url)
    create_bucket(client)
    client.close()
    return S3Storage(
        BUCKET, "us-east-1", endpoint_url, "strata", max_concurrency=CONCURRENCY,
        multipart_threshold=PART_SIZE, part_size=PART_SIZE,
    )  # fmt: skip


def bench_s3_write(loops: int, data: bytes, endpoint_url: str) -> float:
    storage = _s3_storage(endpoint_url)
    start = time.perf_counter()
    for _ in range(loops):
        storage.write("step_1/model.bin", data)
    elapsed = time.perf_counter() - start
    storage.close()
    return elapsed


def bench_raw_download(loops: int, data: bytes, endpoint_url: str) -> float:
    client = s3_client(endpoint_url)
    create_bucket(client)
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
    storage = _s3_storage(endpoint_url)
    storage.write("step_1/read.bin", data)
    start = time.perf_counter()
    for _ in range(loops):
        storage.read("step_1/read.bin")
    elapsed = time.perf_counter() - start
    storage.close()
    return elapsed


def main() -> None:
    runner, args = storage_runner(processes=4, values=3, warmups=1)
    data = make_data(args.size_mb) if args.worker else b""
    size = f"{args.size_mb} MiB"
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

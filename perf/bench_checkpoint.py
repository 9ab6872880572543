"""Checkpoint saves beside the raw writes they wrap and beside their peers, same bytes, same run.

    python perf/bench_checkpoint.py -o perf/results/checkpoint.json
    CHECKPOINT_SIZE_MB=1024 python perf/bench_checkpoint.py --endpoint-url http://minio:9000

- Local: ``CheckpointManager.save(...).result()`` (snapshot, upload with its CRC-32, ack,
  metadata.json, commit in Redis, retention) beside a raw ``write`` + ``fsync`` of the same
  bytes, with ``bytes`` (kept by reference: immutable) and with a numpy array (snapshot
  copy). Peers: ``torch.save`` + ``fsync`` and ``torch.distributed.checkpoint.save`` of the
  same bytes as a uint8 tensor (skipped when torch is not installed).
- S3: the same save to ``S3Storage`` beside boto3's managed ``upload_fileobj`` tuned alike,
  against the same endpoint (``--endpoint-url``, else a private moto server).
- Snapshot: the manager's snapshot (one copy into a reused buffer) beside a numpy memcpy
  into a warm buffer; the training-loop stall of ``save`` (the call itself) beside the same.

Checkpoints go to a new file (or key) per step, while the raw references above rewrite one,
so a raw write to a new file (key) per step, the one of two steps back deleted untimed, is
measured too. Local saves and that raw reference are timed in their steady state: each
pyperf worker process first writes, untimed, until its data on disk stops growing
(``2 * (keep_count + 1)`` saves; three raw files), and its checkpoints are removed at exit. On a
disk where writing blocks not in use costs far more than rewriting blocks just freed (this
project's VM: thin-provisioned, ext4 mounted with ``discard``; 256 MiB to a new file in
730-880 ms while the data on disk grows, 160 ms once it no longer does) the first writes of
a job are slow for raw writes and saves alike; a training job lives in the steady state.

Saves are timed from ``save`` to the commit; the retention pass after a commit (deleting the
step that fell out of ``keep_count=2``) runs between saves, untimed, as in a training job
where saves are minutes apart.

Size: ``--size-mb``, else ``CHECKPOINT_SIZE_MB``, else 256 (8 for a smoke run).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import itertools
import os
import shutil
import time
import warnings
from typing import Any

import numpy as np
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
    write_fsync,
)

from strata_redis import CheckpointManager, LocalStorage, S3Storage
from strata_redis.checkpoint.snapshot import BufferPool

RATIOS = [
    ("CheckpointManager.save local (bytes)", "raw write+fsync"),
    ("CheckpointManager.save local (numpy, snapshot)", "raw write+fsync"),
    ("torch.save+fsync", "raw write+fsync"),
    ("torch.distributed.checkpoint.save", "raw write+fsync"),
    ("CheckpointManager.save local (bytes)", "raw write+fsync, new file per step"),
    ("CheckpointManager.save local (numpy, snapshot)", "raw write+fsync, new file per step"),
    ("torch.save+fsync", "raw write+fsync, new file per step"),
    ("CheckpointManager.save S3", "raw boto3 upload_fileobj"),
    ("CheckpointManager.save S3", "raw boto3 upload_fileobj, new key per step"),
    ("snapshot", "numpy memcpy"),
    ("save() stall (numpy)", "numpy memcpy"),
]

#: steps only go forward, across every call in a worker process
STEPS = itertools.count(1)
#: kept for the life of a worker process, as a training job keeps its manager and buffers
_CACHE: dict[str, Any] = {}


def _manager(kind: str, where: str, redis_url: str) -> CheckpointManager:
    if kind not in _CACHE:
        if kind == "s3":
            client = s3_client(where)
            create_bucket(client)
            client.close()
            storage: Any = S3Storage(
                BUCKET, "us-east-1", where, "ckpt", max_concurrency=CONCURRENCY,
                multipart_threshold=PART_SIZE, part_size=PART_SIZE,
            )  # fmt: skip
        else:
            storage = LocalStorage(os.path.join(where, "ckpt"))
        manager = CheckpointManager(
            storage, keep_count=2, redis=redis_url, job_id=f"bench-{kind}-{os.getpid()}"
        )
        _CACHE[kind] = manager
        if kind != "s3":
            # Leave the disk as this worker process found it: its last steps (keep_count)
            # would otherwise pile up over pyperf's worker processes (each is its own job),
            # so the data on disk would keep growing (the slow case, see bench_save) while
            # the raw references reuse their files: not like for like.
            atexit.register(_remove_job, manager, os.path.join(where, "ckpt"))
    cached: CheckpointManager = _CACHE[kind]
    return cached


def _remove_job(manager: CheckpointManager, root: str) -> None:
    manager.close()
    shutil.rmtree(root, ignore_errors=True)


def _array(data: bytes) -> np.ndarray:
    if "array" not in _CACHE:
        _CACHE["array"] = np.frombuffer(data, dtype=np.uint8).copy()
    array: np.ndarray = _CACHE["array"]
    return array


# -- saves ---------------------------------------------------------------------------------
def bench_save(loops: int, data: Any, kind: str, where: str, redis_url: str) -> float:
    """From ``save`` to the commit (``result()``); the retention pass after each commit runs
    between saves, untimed, as it does in training, where saves are minutes apart."""
    ckpt = _manager(kind, where, redis_url)
    if kind != "s3" and not _CACHE.get(f"{kind}-steady"):
        # Untimed, once per worker process: reach the steady state of a job that has saved
        # before (keep_count steps on disk, one more being written). The first saves of a
        # job grow the data on disk, and on this kind of disk (thin-provisioned, mounted
        # with `discard`) a write to blocks not in use costs ~4x a write to blocks just
        # freed: raw writes of new files show the same (see _steady_raw_files).
        for _ in range(2 * (ckpt.keep_count + 1)):  # measured: settled by the 6th save
            ckpt.wait()
            ckpt.save(data, step=next(STEPS)).result()
        _CACHE[f"{kind}-steady"] = True
    elapsed = 0.0
    for _ in range(loops):
        ckpt.wait()
        start = time.perf_counter()
        ckpt.save(data, step=next(STEPS)).result()
        elapsed += time.perf_counter() - start
    return elapsed


def bench_save_local_bytes(loops: int, data: bytes, where: str, redis_url: str) -> float:
    return bench_save(loops, data, "local", where, redis_url)


def bench_save_local_numpy(loops: int, data: bytes, where: str, redis_url: str) -> float:
    return bench_save(loops, _array(data), "local", where, redis_url)


def bench_save_s3(loops: int, data: bytes, where: str, redis_url: str) -> float:
    return bench_save(loops, data, "s3", where, redis_url)


# -- raw references writing a new object per step, as checkpoints do ---------------------------
def bench_raw_write_new(loops: int, data: bytes, where: str, redis_url: str) -> float:
    """write + fsync to a new file per step; the file of two steps back is deleted untimed."""
    if not _CACHE.get("raw-steady"):
        _steady_raw_files(data, where)
    elapsed = 0.0
    for _ in range(loops):
        elapsed += _write_new(data, where)
    return elapsed


def _write_new(data: bytes, where: str) -> float:
    step = next(STEPS)
    start = time.perf_counter()
    write_fsync(os.path.join(where, f"raw-{step}.bin"), data)
    elapsed = time.perf_counter() - start
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(where, f"raw-{step - 2}.bin"))
    return elapsed


def _steady_raw_files(data: bytes, where: str) -> None:
    """Untimed, once per worker process, as for the saves: from an empty directory, write
    until two files are kept (the first writes are the slow ones on this disk)."""
    for old in os.listdir(where):
        if old.startswith("raw-"):
            os.unlink(os.path.join(where, old))
    for _ in range(3):
        _write_new(data, where)
    _CACHE["raw-steady"] = True


def bench_raw_upload_new(loops: int, data: bytes, endpoint_url: str, redis_url: str) -> float:
    """boto3 upload_fileobj to a new key per step; the key of two steps back deleted untimed."""
    client = _CACHE.get("client") or _CACHE.setdefault("client", s3_client(endpoint_url))
    create_bucket(client)
    config = transfer_config()
    elapsed = 0.0
    for _ in range(loops):
        step = next(STEPS)
        start = time.perf_counter()
        client.upload_fileobj(io.BytesIO(data), BUCKET, f"raw/{step}.bin", Config=config)
        elapsed += time.perf_counter() - start
        client.delete_object(Bucket=BUCKET, Key=f"raw/{step - 2}.bin")
    return elapsed


# -- snapshot and stall ----------------------------------------------------------------------
def bench_memcpy(loops: int, data: bytes, where: str, redis_url: str) -> float:
    source = np.frombuffer(data, dtype=np.uint8)
    if "dst" not in _CACHE:
        _CACHE["dst"] = np.ones(len(data), dtype=np.uint8)  # warm: its pages are mapped
    target = _CACHE["dst"]
    start = time.perf_counter()
    for _ in range(loops):
        np.copyto(target, source)
    return time.perf_counter() - start


def bench_snapshot(loops: int, data: bytes, where: str, redis_url: str) -> float:
    view = memoryview(_array(data))
    pool = _CACHE.setdefault("pool", BufferPool(2))
    pool.copy(view).release()  # as in a training job, the buffer is warm after the first save
    start = time.perf_counter()
    for _ in range(loops):
        snapshot = pool.copy(view)
        snapshot.release()
    return time.perf_counter() - start


def bench_stall(loops: int, data: bytes, where: str, redis_url: str) -> float:
    ckpt = _manager("local", where, redis_url)
    state = _array(data)
    elapsed = 0.0
    for _ in range(loops):
        ckpt.wait()  # room for the save: the stall measured is the snapshot's, not a wait
        start = time.perf_counter()
        future = ckpt.save(state, step=next(STEPS))
        elapsed += time.perf_counter() - start
        future.result()  # the training loop's next step would run here, beside the upload
    return elapsed


# -- peers ---------------------------------------------------------------------------------
def _tensor(data: bytes) -> Any:
    import torch

    if "tensor" not in _CACHE:
        _CACHE["tensor"] = torch.from_numpy(_array(data).copy())
    return _CACHE["tensor"]


def bench_torch_save(loops: int, data: bytes, where: str, redis_url: str) -> float:
    import torch

    tensor = _tensor(data)
    path = os.path.join(where, "torch.pt")
    start = time.perf_counter()
    for _ in range(loops):
        torch.save({"state": tensor}, path)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)  # as durable as the others
        os.close(fd)
    return time.perf_counter() - start


def bench_dcp_save(loops: int, data: bytes, where: str, redis_url: str) -> float:
    import torch.distributed.checkpoint as dcp

    tensor = _tensor(data)
    path = os.path.join(where, "dcp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: saving in a single process"
        start = time.perf_counter()
        for _ in range(loops):
            dcp.save({"state": tensor}, checkpoint_id=path)  # FileSystemWriter, fsyncs files
        return time.perf_counter() - start


def _have_torch() -> bool:
    try:
        import torch.distributed.checkpoint  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    runner, args = storage_runner(redis=True, processes=4, values=3, warmups=1)
    data = make_data(args.size_mb) if args.worker else b""
    size = f"{args.size_mb} MiB"
    benches: list[tuple[str, Any, str]] = [
        ("raw write+fsync", bench_raw_write, args.dir),
        ("raw write+fsync, new file per step", bench_raw_write_new, args.dir),
        ("CheckpointManager.save local (bytes)", bench_save_local_bytes, args.dir),
        ("CheckpointManager.save local (numpy, snapshot)", bench_save_local_numpy, args.dir),
        ("raw boto3 upload_fileobj", bench_raw_upload, args.endpoint_url),
        ("raw boto3 upload_fileobj, new key per step", bench_raw_upload_new, args.endpoint_url),
        ("CheckpointManager.save S3", bench_save_s3, args.endpoint_url),
        ("numpy memcpy", bench_memcpy, args.dir),
        ("snapshot", bench_snapshot, args.dir),
        ("save() stall (numpy)", bench_stall, args.dir),
    ]
    if _have_torch():
        benches += [
            ("torch.save+fsync", bench_torch_save, args.dir),
            ("torch.distributed.checkpoint.save", bench_dcp_save, args.dir),
        ]
    elif not args.worker:
        print("torch is not installed: skipping the torch.save and DCP peers")
    for name, func, where in benches:
        extra = () if func in (bench_raw_write, bench_raw_upload) else (args.redis_url,)
        runner.bench_time_func(name, func, data, where, *extra, metadata={"description": size})


if __name__ == "__main__":
    main()

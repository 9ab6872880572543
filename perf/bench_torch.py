"""strata_redis.torch beside plain torch, same data, same disk, same run.

    python perf/bench_torch.py -o perf/results/bench_torch.json
    python perf/bench_torch.py --size-mb 1024 --shards 64 --per-shard 4096

- Sampler: one epoch of ``strata_redis.torch.DataLoader`` over a ``LeaseBatchSampler``
  (``num_workers=0``, batches of 256, 64 shards x 4,096 samples, one worker, then
  ``advance_epoch``) beside torch's ``DistributedSampler`` (``num_replicas=1``) under a
  plain ``DataLoader(batch_size=256)`` over the same map-style dataset (sample i is the
  tensor ``i``), timed per batch. strata pays one Redis round trip per shard (its lease;
  another to complete it) and the epoch barrier, none per batch.
- Checkpoint of a model's ``state_dict`` (4 bias-free ``Linear`` layers of float32, 256 MiB in
  all; ``--size-mb``): ``strata_redis.torch.save(orch, step=, epoch=, model=)`` to a local
  directory, its stall (until ``save`` returns) and its total (until ``result()``, the
  commit); beside ``torch.save`` to a file + ``fsync``, ``torch.distributed.checkpoint.save``
  (DCP, no process group: one process) to a ``FileSystemWriter`` directory, DCP's
  ``async_save`` stall, a raw ``write`` + ``fsync`` of the bytes ``torch.save`` makes, all on
  the same disk, and a memcpy of the state's bytes into a warm buffer (the stall's bar).
  strata's stall is the copy into its staging area (``strata_redis.torch.staging_area``):
  its size is measured once by the master (the same staging code, the same model) and
  printed, and kept in the results' metadata (``strata_torch_staging_mib``).

Every writer writes a new file (or directory) per step and keeps the last two (strata's
``keep_count=2``; the others delete the one of two steps back, untimed), and each is timed
in its steady state: each pyperf worker process first saves untimed until its data on disk
stops growing (see perf/bench_checkpoint.py: on a thin-provisioned disk mounted with
``discard``, writes to blocks not in use cost several times writes to blocks just freed).
Between strata saves, ``wait_for_checkpoints()`` lets the retention pass of the previous
commit finish, untimed, as in a training job where saves are minutes apart.

Smoke (``--debug-single-value``, as ``perf/run.py --smoke``): 4 shards x 512 samples, 4 MiB.
"""

from __future__ import annotations

import argparse
import atexit
import itertools
import os
import shutil
import tempfile
import time
import uuid
import warnings
from typing import Any

import numpy as np
import pyperf
import torch
import torch.distributed.checkpoint as dcp
from common import MiB, write_fsync
from torch.distributed.checkpoint import FileSystemWriter
from torch.utils.data import DataLoader, DistributedSampler

import strata_redis
import strata_redis.torch as strata_torch
from strata_redis.server import RedisServer

BATCH = 256
LAYERS = 4
IN_FEATURES = 4096
KEEP = 2
RATIOS = [
    ("strata DataLoader batch (LeaseBatchSampler)", "torch DataLoader batch (DistributedSampler)"),
    ("strata torch.save() stall", "memcpy of the state"),
    ("DCP async_save stall", "memcpy of the state"),
    ("strata torch.save() stall", "DCP async_save stall"),
    ("strata torch.save() total", "torch.save+fsync"),
    ("strata torch.save() total", "raw write+fsync of the serialized state"),
    ("torch.distributed.checkpoint.save", "torch.save+fsync"),
]

#: steps only go forward, across every call in a worker process
STEPS = itertools.count(1)
#: kept for the life of a worker process, as a training job keeps its loader, model, manager
_CACHE: dict[str, Any] = {}


# -- the command line ------------------------------------------------------------------------
def _pass_args(cmd: list[str], args: argparse.Namespace) -> None:
    # pyperf re-runs this script in worker processes: hand them the same Redis, sizes, dir.
    cmd.extend(["--redis-url", args.redis_url, "--size-mb", str(args.size_mb), "--dir", args.dir])
    cmd.extend(["--shards", str(args.shards), "--per-shard", str(args.per_shard)])


def make_runner() -> tuple[pyperf.Runner, argparse.Namespace]:
    runner = pyperf.Runner(add_cmdline_args=_pass_args, processes=4, values=3, warmups=1)
    parser = runner.argparser
    parser.add_argument("--redis-url", help="default: a private redis-server")
    parser.add_argument("--size-mb", type=int, help="state_dict size (default 256; smoke 4)")
    parser.add_argument("--dir", help="directory for the checkpoints (default: a temp dir)")
    parser.add_argument("--shards", type=int, help="shards of the epoch (default 64; smoke 4)")
    parser.add_argument("--per-shard", type=int, help="samples per shard (default 4096; smoke 512)")
    args = runner.parse_args()
    if not args.worker:
        smoke = args.debug_single_value  # one value only proves it works: keep it small
        for name, full, tiny in (("size_mb", 256, 4), ("shards", 64, 4), ("per_shard", 4096, 512)):
            if getattr(args, name) is None:
                setattr(args, name, tiny if smoke else full)
        if args.size_mb * MiB % (LAYERS * 4 * IN_FEATURES):
            parser.error(f"--size-mb must make {LAYERS} layers of {IN_FEATURES} float32 columns")
        if args.dir is None:
            args.dir = tempfile.mkdtemp(prefix="strata-bench-torch-")
            atexit.register(shutil.rmtree, args.dir, True)
        if args.redis_url is None:
            server = RedisServer().start()
            atexit.register(server.close)
            args.redis_url = server.url
    runner.metadata["checkpoint_size_mb"] = args.size_mb
    if not args.worker:
        staged = _staging_mib(args.size_mb)
        runner.metadata["strata_torch_staging_mib"] = staged
        print(f"strata_redis.torch staging area: {staged:.1f} MiB in 1 buffer for a "
              f"{args.size_mb} MiB state_dict (memory bound: one state)", flush=True)  # fmt: skip
    return runner, args


def _staging_mib(size_mb: int) -> float:
    """The staging area one save of the benchmark's model takes (MiB), measured."""
    area = strata_torch.StagingArea(1)
    for part in area.stage({"model.pt": _model(size_mb).state_dict()}).values():
        part.drop()
    staged = area.nbytes / MiB
    area.clear()
    _CACHE.pop("model", None)
    return staged


# -- sampler -----------------------------------------------------------------------------------
class Ids(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A trivial map-style dataset: sample i is the tensor ``i``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(i)


def _orchestrator(url: str, where: str | None = None) -> strata_redis.TrainingOrchestrator:
    """One worker's orchestrator in a job of its own (one per pyperf worker process)."""
    job = f"bench-torch-{uuid.uuid4().hex[:8]}"
    root = where or tempfile.mkdtemp(prefix="strata-bench-torch-")
    path = os.path.join(root, job)
    orch = strata_redis.TrainingOrchestrator(
        url, "w0", job_id=job, checkpoint_path=path, keep_count=KEEP, last_call=0.01,
        max_workers=1,
    )  # fmt: skip
    atexit.register(_remove_job, orch, root if where is None else path)
    return orch


def _remove_job(orch: strata_redis.TrainingOrchestrator, path: str) -> None:
    orch.close()
    shutil.rmtree(path, ignore_errors=True)


def bench_strata_sampler(loops: int, url: str, shards: int, per_shard: int) -> float:
    if "loader" not in _CACHE:
        job_orch = _orchestrator(url)
        manager = strata_redis.ShardManager(url, job_id=job_orch.job_id)
        manager.register_dataset_params("bench", shards * per_shard, per_shard, True, 1)
        sampler = strata_torch.LeaseBatchSampler(job_orch, "bench", batch_size=BATCH)
        loader = strata_torch.DataLoader(Ids(shards * per_shard), batch_sampler=sampler)
        _CACHE.update(orch=job_orch, sampler=sampler, loader=loader)
    orch, sampler, loader = _CACHE["orch"], _CACHE["sampler"], _CACHE["loader"]
    expected = shards * -(-per_shard // BATCH)
    elapsed = 0.0
    for _ in range(loops):
        start = time.perf_counter()
        sampler.set_epoch(orch.epoch)
        batches = 0
        for _batch in loader:
            batches += 1
        orch.advance_epoch()
        elapsed += time.perf_counter() - start
        if batches != expected:
            raise RuntimeError(f"{batches} batches in the epoch, expected {expected}")
    return elapsed


def bench_torch_sampler(loops: int, url: str, shards: int, per_shard: int) -> float:
    if "torch-loader" not in _CACHE:
        dataset = Ids(shards * per_shard)
        sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=1)
        loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
        _CACHE.update({"torch-sampler": sampler, "torch-loader": loader})
    sampler, loader = _CACHE["torch-sampler"], _CACHE["torch-loader"]
    expected = -(-(shards * per_shard) // BATCH)
    elapsed = 0.0
    for _ in range(loops):
        start = time.perf_counter()
        sampler.set_epoch(next(STEPS))
        batches = 0
        for _batch in loader:
            batches += 1
        elapsed += time.perf_counter() - start
        if batches != expected:
            raise RuntimeError(f"{batches} batches in the epoch, expected {expected}")
    return elapsed


# -- checkpoint --------------------------------------------------------------------------------
def _model(size_mb: int) -> torch.nn.Module:
    """``size_mb`` MiB of float32 weights in ``LAYERS`` bias-free Linear layers."""
    if "model" not in _CACHE:
        torch.manual_seed(0)
        out = size_mb * MiB // (LAYERS * 4 * IN_FEATURES)
        layers = [torch.nn.Linear(IN_FEATURES, out, bias=False) for _ in range(LAYERS)]
        _CACHE["model"] = torch.nn.Sequential(*layers)
    model: torch.nn.Module = _CACHE["model"]
    return model


def _ckpt_orchestrator(url: str, where: str) -> strata_redis.TrainingOrchestrator:
    if "ckpt-orch" not in _CACHE:
        _CACHE["ckpt-orch"] = _orchestrator(url, where)
    orch: strata_redis.TrainingOrchestrator = _CACHE["ckpt-orch"]
    return orch


def _strata_save(orch: strata_redis.TrainingOrchestrator, model: torch.nn.Module) -> Any:
    future = strata_torch.save(orch, step=next(STEPS), epoch=orch.epoch, model=model)
    if future is None:
        raise RuntimeError("strata_redis.torch.save did not save")
    return future


def _strata_steady(orch: strata_redis.TrainingOrchestrator, model: torch.nn.Module) -> None:
    """Untimed, once per worker process: save until the data on disk stops growing
    (``keep_count`` steps kept, one more being written)."""
    if not _CACHE.get("strata-steady"):
        for _ in range(2 * (KEEP + 1)):
            orch.wait_for_checkpoints()
            _strata_save(orch, model).result()
        _CACHE["strata-steady"] = True


def bench_strata_stall(loops: int, url: str, size_mb: int, where: str) -> float:
    orch, model = _ckpt_orchestrator(url, where), _model(size_mb)
    _strata_steady(orch, model)
    elapsed = 0.0
    for _ in range(loops):
        orch.wait_for_checkpoints()  # room for the save: the stall measured is save()'s own
        start = time.perf_counter()
        future = _strata_save(orch, model)
        elapsed += time.perf_counter() - start
        future.result()  # the training loop's next steps would run here, beside the write
    return elapsed


def bench_strata_total(loops: int, url: str, size_mb: int, where: str) -> float:
    orch, model = _ckpt_orchestrator(url, where), _model(size_mb)
    _strata_steady(orch, model)
    elapsed = 0.0
    for _ in range(loops):
        orch.wait_for_checkpoints()
        start = time.perf_counter()
        _strata_save(orch, model).result()
        elapsed += time.perf_counter() - start
    return elapsed


def bench_memcpy(loops: int, url: str, size_mb: int, where: str) -> float:
    """The state's bytes copied into a warm buffer of their size (numpy: one memcpy each)."""
    sources = [t.detach().numpy().reshape(-1) for t in _model(size_mb).state_dict().values()]
    if "flat" not in _CACHE:
        _CACHE["flat"] = np.ones(sum(s.size for s in sources), dtype=np.float32)  # warm
    flat = _CACHE["flat"]
    start = time.perf_counter()
    for _ in range(loops):
        offset = 0
        for source in sources:
            np.copyto(flat[offset : offset + source.size], source)
            offset += source.size
    return time.perf_counter() - start


def _new_path(where: str, kind: str, step: int) -> str:
    return os.path.join(where, f"{kind}-{os.getpid()}-{step}")


def _drop(where: str, kind: str, step: int) -> None:
    """Remove the file (or directory) of two steps back, untimed: keep the last two."""
    old = _new_path(where, kind, step - KEEP)
    if os.path.isdir(old):
        shutil.rmtree(old, ignore_errors=True)
    elif os.path.exists(old):
        os.unlink(old)


def _timed_writes(loops: int, where: str, kind: str, write: Any) -> float:
    """``write(path)`` to a new path per step, timed, after 3 untimed ones (steady state)."""
    if not _CACHE.get(f"{kind}-steady"):
        atexit.register(_remove_kind, where, kind)
        for _ in range(KEEP + 1):
            step = next(STEPS)
            write(_new_path(where, kind, step))
            _drop(where, kind, step)
        _CACHE[f"{kind}-steady"] = True
    elapsed = 0.0
    for _ in range(loops):
        step = next(STEPS)
        start = time.perf_counter()
        write(_new_path(where, kind, step))
        elapsed += time.perf_counter() - start
        _drop(where, kind, step)
    return elapsed


def _remove_kind(where: str, kind: str) -> None:
    prefix = f"{kind}-{os.getpid()}-"
    for name in os.listdir(where):
        if name.startswith(prefix):
            path = os.path.join(where, name)
            shutil.rmtree(path, True) if os.path.isdir(path) else os.unlink(path)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def bench_torch_save(loops: int, url: str, size_mb: int, where: str) -> float:
    model = _model(size_mb)

    def write(path: str) -> None:
        torch.save(model.state_dict(), path)
        _fsync(path)  # as durable as strata's save
        _fsync(where)  # and its directory entry

    return _timed_writes(loops, where, "torch", write)


def bench_raw_write(loops: int, url: str, size_mb: int, where: str) -> float:
    """write + fsync of the bytes torch.save makes of the state (serialized untimed, once)."""
    if "serialized" not in _CACHE:
        import io

        buffer = io.BytesIO()
        torch.save(_model(size_mb).state_dict(), buffer)
        _CACHE["serialized"] = buffer.getvalue()
    data = _CACHE["serialized"]

    def write(path: str) -> None:
        write_fsync(path, data)
        _fsync(where)

    return _timed_writes(loops, where, "raw", write)


def bench_dcp_save(loops: int, url: str, size_mb: int, where: str) -> float:
    model = _model(size_mb)

    def write(path: str) -> None:
        # FileSystemWriter fsyncs its files (sync_files=True)
        dcp.save({"model": model.state_dict()}, storage_writer=FileSystemWriter(path))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: saving in a single process"
        return _timed_writes(loops, where, "dcp", write)


def bench_dcp_async_stall(loops: int, url: str, size_mb: int, where: str) -> float:
    model = _model(size_mb)
    stalls: list[float] = []

    def write(path: str) -> None:
        start = time.perf_counter()
        writer = FileSystemWriter(path)
        future = dcp.async_save({"model": model.state_dict()}, storage_writer=writer)
        stalls.append(time.perf_counter() - start)
        future.result()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _timed_writes(loops, where, "dcp-async", write)
    return sum(stalls[-loops:])


def main() -> None:
    runner, args = make_runner()
    url, mb, where = args.redis_url, args.size_mb, args.dir
    batches = args.shards * -(-args.per_shard // BATCH)
    epoch = f"batch {BATCH}, {args.shards} shards x {args.per_shard} samples, time per batch"
    for name, func in (
        ("strata DataLoader batch (LeaseBatchSampler)", bench_strata_sampler),
        ("torch DataLoader batch (DistributedSampler)", bench_torch_sampler),
    ):
        runner.bench_time_func(
            name, func, url, args.shards, args.per_shard, inner_loops=batches,
            metadata={"description": epoch},
        )  # fmt: skip
    size = f"{mb} MiB state_dict"
    for name, func in (
        ("memcpy of the state", bench_memcpy),
        ("strata torch.save() stall", bench_strata_stall),
        ("DCP async_save stall", bench_dcp_async_stall),
        ("strata torch.save() total", bench_strata_total),
        ("torch.save+fsync", bench_torch_save),
        ("raw write+fsync of the serialized state", bench_raw_write),
        ("torch.distributed.checkpoint.save", bench_dcp_save),
    ):
        runner.bench_time_func(name, func, url, mb, where, metadata={"description": size})


if __name__ == "__main__":
    main()

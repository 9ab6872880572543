"""Resume cost at 10 and 10^5 batches done: strata's lease position beside Accelerate's
``skip_first_batches``.

    python perf/frameworks_resume.py [--done 10 100000] [--repeat 3]

For each ``done``: a job (batch size 1, shards of 1,000 samples) trains ``done`` batches
(the raw lease stream: no model) and checkpoints; a new orchestrator of the job (a fresh
round: a relaunch) resumes, and the time from its construction to the first batch in hand
from ``strata_redis.accelerate.DataLoader`` is measured, with the samples the dataset read
before it. Beside it, a plain ``DataLoader`` over the same dataset through Accelerate's
``skip_first_batches(loader, done)``: the time to its first batch and the samples it read.
A private redis-server and a scratch directory; prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from typing import Any

import torch
from accelerate import skip_first_batches

import strata_redis
import strata_redis.accelerate
from strata_redis.server import RedisServer

SHARD = 1000


class Counting(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample ``i`` is ``i``; counts the reads."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self.reads = 0

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> int:
        self.reads += 1
        return i


def strata_resume(url: str, storage: str, done: int) -> tuple[float, int]:
    """Train ``done`` batches, checkpoint, resume in a fresh round: (seconds, reads)."""
    job = f"resume-{uuid.uuid4().hex[:8]}"
    samples = done + 10 * SHARD
    strata_redis.ShardManager(url, job_id=job).register_dataset_params(
        "ds", samples, SHARD, True, 1
    )
    kw: dict[str, Any] = dict(coordinator_url=url, job_id=job, checkpoint_path=storage,
                              last_call=0.05, batch_size=1)  # fmt: skip
    with strata_redis.TrainingOrchestrator(worker_id="first", **kw) as orch:
        stream = orch.get_shards("ds")
        for n, _ in enumerate(stream, 1):
            if n == done:
                break
        orch.save_checkpoint(step=done, epoch=0)
        orch.wait_for_checkpoints(60)
        stream_close = getattr(stream, "close", None)
        if stream_close:
            stream_close()
    data = Counting(samples)
    started = time.perf_counter()
    with strata_redis.TrainingOrchestrator(worker_id="second", **kw) as orch:
        assert orch.resumed is not None and orch.resumed.step == done
        loader = strata_redis.accelerate.DataLoader(data, orch, "ds", batch_size=1)
        loader.set_epoch(orch.epoch)
        next(iter(loader))
        seconds = time.perf_counter() - started
    return seconds, data.reads


class CountingStream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """The same samples as a stream (a streaming dataset: no index to skip to)."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self.reads = 0

    def __iter__(self) -> Any:
        for i in range(self.samples):
            self.reads += 1
            yield i


def accelerate_resume(done: int, stream: bool) -> tuple[float, int]:
    """``skip_first_batches`` past ``done`` batches of a plain loader over a map-style
    dataset (skipped in the sampler) or a stream (read and dropped): (seconds, reads)."""
    data: Any = (CountingStream if stream else Counting)(done + 10 * SHARD)
    loader = torch.utils.data.DataLoader(data, batch_size=1)
    started = time.perf_counter()
    next(iter(skip_first_batches(loader, done)))
    return time.perf_counter() - started, data.reads


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--done", type=int, nargs="+", default=[10, 100_000])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    rows = []
    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        for done in args.done:
            s = [strata_resume(server.url, tmp, done) for _ in range(args.repeat)]
            a = [accelerate_resume(done, False) for _ in range(args.repeat)]
            b = [accelerate_resume(done, True) for _ in range(args.repeat)]
            rows.append((done, s, a, b))
    print("seconds to the first batch after the resume (median) and samples read before it")
    print(f"{'batches done':>12} | {'strata leases':>15} | {'skip_first_batches, map':>25} | "
          f"{'skip_first_batches, stream':>27}")  # fmt: skip
    for done, *runs in rows:
        cells = [f"{statistics.median(x for x, _ in r):.3f} s, {r[0][1]} read" for r in runs]
        print(f"{done:>12} | {cells[0]:>15} | {cells[1]:>25} | {cells[2]:>27}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

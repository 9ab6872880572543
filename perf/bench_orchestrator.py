"""The orchestrator's batch loop beside plain numpy, and a 100-worker rendezvous, same run.

    python perf/bench_orchestrator.py -o perf/results/orchestrator.json

- one epoch of the seeds' loop body (no training): ``for batch in orchestrator.get_shards(...)``
  over 64 shards x 1,024 samples in batches of 32 (2,048 batches), then ``advance_epoch``
  (one worker); against the same index ranges cut into the same batches from plain numpy
  (``Shard.indices()`` sliced), with no Redis at all. The ratio is the orchestrator's whole
  overhead: leases (one round trip per shard), the per-batch round check, the epoch barrier;
- a rendezvous of 100 workers (100 threads, each its own connection, one process): every
  worker joins with ``max_workers=100``; the time from the first join until every member
  has its round.

- recovery: two workers (threads) in a round with a 1 s heartbeat timeout; one goes silent
  as a SIGKILLed process would (its heartbeats stop, it never deregisters, its lease stays);
  the time until the survivor's batch loop runs in a new round (which also took the silent
  worker's shard back). The goal is the heartbeat timeout + 1 s; the seeds' bar is < 30 s.
  ``tests/test_e2e.py::test_worker_failure_recovery`` does it with real processes and SIGKILL.
"""

from __future__ import annotations

import tempfile
import threading
import time
import uuid

from common import make_runner

import strata_redis
from strata_redis.context import JobContext
from strata_redis.coordination import Worker
from strata_redis.coordination.rendezvous import Rendezvous

SHARDS, PER_SHARD, BATCH = 64, 1024, 32
WORKERS = 100
RATIOS = [("numpy batches of one epoch", "orchestrator batches of one epoch")]


def numpy_epoch(loops: int, url: str) -> float:
    params = strata_redis.DatasetParams("bench", SHARDS * PER_SHARD, PER_SHARD, True, 1)
    start = time.perf_counter()
    for epoch in range(loops):
        for shard_id in range(params.num_shards):
            indices = params.shard(shard_id, epoch).indices()
            for offset in range(0, len(indices), BATCH):
                indices[offset : offset + BATCH]
    return time.perf_counter() - start


def orchestrator_epoch(loops: int, url: str) -> float:
    job = f"bench-{uuid.uuid4().hex[:8]}"
    strata_redis.ShardManager(url, job_id=job).register_dataset_params(
        "bench", SHARDS * PER_SHARD, PER_SHARD, True, 1
    )
    with tempfile.TemporaryDirectory() as tmp, strata_redis.TrainingOrchestrator(
        url, "w0", job_id=job, checkpoint_path=tmp, last_call=0.01, batch_size=BATCH
    ) as orch:  # fmt: skip
        stream = orch.get_shards("bench")
        start = time.perf_counter()
        for _ in range(loops):
            for _batch in stream:
                pass
            orch.advance_epoch()
        return time.perf_counter() - start


def _join(
    url: str,
    job_id: str,
    worker: Worker,
    ready: threading.Barrier,
    done: list[float],
) -> None:
    ctx = JobContext(url, job_id)
    rdzv = Rendezvous(ctx, min_workers=WORKERS, max_workers=WORKERS, timeout=60)
    ready.wait()
    rdzv.join(worker.worker_id, worker.incarnation)
    done.append(time.perf_counter())
    ctx.close()


def rendezvous_100(loops: int, url: str) -> float:
    total = 0.0
    for _ in range(loops):
        job = strata_redis.connect(url, job_id=f"bench-{uuid.uuid4().hex[:8]}")
        workers = [
            job.register_worker(f"w{i:03d}", heartbeat_interval=None) for i in range(WORKERS)
        ]
        ready = threading.Barrier(WORKERS + 1)
        done: list[float] = []
        threads = [
            threading.Thread(target=_join, args=(url, job.job_id, w, ready, done)) for w in workers
        ]
        for t in threads:
            t.start()
        ready.wait()
        start = time.perf_counter()
        for t in threads:
            t.join(120)
        if len(done) != WORKERS:
            raise RuntimeError(f"only {len(done)} of {WORKERS} workers got their round")
        total += max(done) - start
        job.close()
    return total


RECOVERY_TIMEOUT = 1.0


def _make(
    made: dict[str, strata_redis.TrainingOrchestrator], url: str, wid: str, job: str, tmp: str
) -> None:
    # max_workers=2: round 1 closes with both; min_workers=1: the survivor goes on alone
    made[wid] = strata_redis.TrainingOrchestrator(
        url, wid, job_id=job, checkpoint_path=tmp, min_workers=1, max_workers=2, last_call=30,
        heartbeat_timeout=RECOVERY_TIMEOUT,
    )  # fmt: skip


def recovery(loops: int, url: str) -> float:
    total = 0.0
    for _ in range(loops):
        job = f"bench-{uuid.uuid4().hex[:8]}"
        strata_redis.ShardManager(url, job_id=job).register_dataset_params(
            "bench", 1_000_000, 10_000, True, 1
        )
        with tempfile.TemporaryDirectory() as tmp:
            made: dict[str, strata_redis.TrainingOrchestrator] = {}
            threads = [
                threading.Thread(target=_make, args=(made, url, w, job, tmp))
                for w in ("survivor", "victim")
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            survivor, victim = made["survivor"], made["victim"]
            held = iter(victim.get_shards("bench"))
            next(held)  # the victim holds a lease
            batches = iter(survivor.get_shards("bench"))
            next(batches)
            victim.worker.stop_heartbeat()  # silent from now on, as after a SIGKILL
            start = time.perf_counter()
            while survivor.round.number == 1:
                next(batches)
                time.sleep(0.001)
            total += time.perf_counter() - start
            survivor.close()
            held.close()  # type: ignore[attr-defined]
            victim.close()  # already declared failed: it cannot deregister, as after a kill
    return total


def main() -> None:
    runner = make_runner()
    url = runner.args.redis_url
    runner.bench_time_func("numpy batches of one epoch", numpy_epoch, url)
    runner.bench_time_func("orchestrator batches of one epoch", orchestrator_epoch, url)
    runner.bench_time_func(
        "rendezvous of 100 workers: first join -> all closed", rendezvous_100, url
    )
    runner.bench_time_func("recovery: silent worker -> survivor in a new round", recovery, url)


if __name__ == "__main__":
    main()

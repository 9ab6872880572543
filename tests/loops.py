"""The README's training loop in a worker process, for fault tests: each batch it trains and
each checkpoint save's outcome are written to files the test reads afterwards."""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any

JOB = "loop"
DATASET = "imagenet_total"


def register(url: str, total: int, per_shard: int) -> None:
    """Register the loop's dataset (the one line a launcher runs before the workers)."""
    import strata_redis

    manager = strata_redis.ShardManager(url, job_id=JOB)
    manager.register_dataset_params(DATASET, total, per_shard, True, 7)
    manager.context.close()


def readme_worker(url: str, worker_id: str, ckpt: str, logdir: str, cfg: dict[str, Any]) -> None:
    """One worker process: the README loop, writing ``<worker>.log`` (one line a batch:
    epoch, samples), ``saves-<worker>`` (one line a save: its label and outcome) and, if the
    loop raised, ``error-<worker>``.

    ``cfg``: ``workers`` (the round's size), ``sleep`` (seconds a batch "trains"),
    ``save_every`` (steps between saves), ``heartbeat_timeout``, and ``read_epoch``: read
    ``orchestrator.epoch`` every batch (a property that asks Redis)."""
    try:
        _loop(url, worker_id, ckpt, logdir, cfg)
    except BaseException as exc:
        Path(logdir, f"error-{worker_id}").write_text(f"{type(exc).__name__}: {exc}")
        raise


def _loop(url: str, worker_id: str, ckpt: str, logdir: str, cfg: dict[str, Any]) -> None:
    import logging
    import time

    import strata_redis

    logging.basicConfig(
        filename=os.path.join(logdir, f"log-{worker_id}"), level=logging.INFO,
        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s",
    )  # fmt: skip
    saves: list[Future[Any]] = []
    with (
        open(os.path.join(logdir, f"{worker_id}.log"), "a") as log,
        strata_redis.TrainingOrchestrator(
            coordinator_url=url, worker_id=worker_id, job_id=JOB, checkpoint_path=ckpt,
            min_workers=cfg["workers"], last_call=1.0, batch_size=4,
            heartbeat_timeout=cfg.get("heartbeat_timeout", 3.0), commit_timeout=60.0,
            epoch_timeout=120.0, state_provider=lambda: b"model",
        ) as orchestrator,
    ):  # fmt: skip
        shard_info = orchestrator.get_shards(DATASET)
        for epoch in range(2):
            for step, batch in enumerate(shard_info):
                time.sleep(cfg["sleep"])
                if cfg.get("read_epoch") and orchestrator.epoch != epoch:
                    raise AssertionError(f"orchestrator.epoch is {orchestrator.epoch}, not {epoch}")
                log.write(f"{epoch} {' '.join(map(str, batch.tolist()))}\n")
                log.flush()
                if step % cfg.get("save_every", 100) == 0:
                    future = orchestrator.save_checkpoint(step=step, epoch=epoch)
                    if future is not None:
                        saves.append(future)
            orchestrator.advance_epoch()
        orchestrator.wait_for_checkpoints(120)
    with open(os.path.join(logdir, f"saves-{worker_id}"), "w") as out:
        for future in saves:
            exc = future.exception(0)
            label = getattr(future, "checkpoint", "?")
            out.write(f"{label} {'committed' if exc is None else f'{type(exc).__name__}: {exc}'}\n")


def samples(logdir: Path) -> dict[int, Counter[int]]:
    """epoch -> how many times each sample was trained, from the workers' logs."""
    out: dict[int, Counter[int]] = {}
    for path in logdir.glob("*.log"):
        for line in path.read_text().splitlines():
            epoch, *trained = line.split()
            out.setdefault(int(epoch), Counter()).update(int(s) for s in trained)
    return out


def batches(logdir: Path) -> int:
    """Batches trained so far by every worker (lines in their logs)."""
    return sum(len(p.read_text().splitlines()) for p in logdir.glob("*.log"))


def outcomes(logdir: Path) -> dict[str, list[str]]:
    """worker -> each of its saves' outcome line, from ``saves-<worker>``."""
    return {p.name[6:]: p.read_text().splitlines() for p in logdir.glob("saves-*")}


def errors(logdir: Path) -> dict[str, str]:
    """worker -> the error its loop ended on."""
    return {p.name[6:]: p.read_text() for p in logdir.glob("error-*")}


#: the samples of the dataset ``start`` registers (in shards of 50)
TOTAL = 1200


def start(url: str, logs: Path, ckpt: Path, cfg: dict[str, Any]) -> list[Any]:
    """Register the dataset, start ``cfg["workers"]`` README loops (worker processes), and
    return them once they trained 60 batches between them."""
    from .procs import spawn, wait_for

    logs.mkdir()
    register(url, total=TOTAL, per_shard=50)
    procs = [spawn(readme_worker, url, f"w{i}", str(ckpt), str(logs), cfg)
             for i in range(cfg["workers"])]  # fmt: skip
    wait_for(lambda: batches(logs) >= 60, 60, why=lambda: errors(logs))
    return procs


def assert_finished_once(procs: list[Any], logs: Path) -> None:
    """Every loop exited 0, trained each sample of both epochs once, and every save it made
    committed."""
    from .procs import join_all

    assert join_all(procs, timeout=120) == [0] * len(procs), errors(logs)
    trained = samples(logs)
    assert sorted(trained) == [0, 1]
    for epoch in (0, 1):
        assert trained[epoch] == Counter(range(TOTAL)), epoch  # each sample once
    saved = outcomes(logs)
    assert len(saved) == len(procs) and all(saved.values()), saved
    assert all(line.endswith(" committed") for lines in saved.values() for line in lines)

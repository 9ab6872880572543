"""``strata dashboard --demo``: the dashboard on a private Redis, over a small live cluster.

A private ``redis-server`` and a few real worker processes that use the library's own calls
(nothing canned): they register and heartbeat, drain each epoch of a dataset through shard
leases (one of them is slower, so the others steal its shards), meet at the epoch barrier,
and save their parts of a checkpoint to a temporary directory. A supervisor thread now and
then kills one with SIGKILL (it is declared failed; a step it was saving is aborted) or
stops one gracefully (it leaves), and starts it again a few seconds later (it rejoins).
Ctrl-C (or SIGTERM) stops the server, the workers, Redis, and removes the directory.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

import strata_redis
from strata_redis.errors import BarrierBrokenError, BarrierTimeoutError
from strata_redis.server import RedisServer

CTX = multiprocessing.get_context("spawn")
JOB = "demo"
DATASET = "demo-tokens"
MiB = 1024 * 1024
log = logging.getLogger("strata_redis.dashboard.demo")

DEFAULTS: dict[str, Any] = {
    "interval": 1.0,  # heartbeat interval, s
    "timeout": 6.0,  # heartbeat timeout, s
    "lease_ttl": 5.0,
    "work_s": 0.12,  # seconds per shard (the slow worker takes 3x)
    "total_samples": 6_400,
    "samples_per_shard": 64,
    "part_mb": 4,
    "commit_timeout": 15.0,
    "barrier_timeout": 60.0,
    "churn_every": 20.0,  # seconds between two failures or leaves
    "rejoin_after": 6.0,  # seconds until the stopped worker starts again
}


# -- a worker process ----------------------------------------------------------------------
def _watch_parent(life: Connection) -> None:
    """Exit at once when the parent is gone (its end of ``life`` closes)."""
    with contextlib.suppress(EOFError, OSError):
        life.recv()
    os._exit(0)


def _leave(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def worker_main(
    url: str, worker_id: str, cfg: dict[str, Any], checkpoint_dir: str, life: Connection
) -> None:
    """A demo worker: train (lease shards), meet at the epoch barrier, save, repeat."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us, not the terminal
    signal.signal(signal.SIGTERM, _leave)  # a graceful stop: deregister, then exit
    threading.Thread(target=_watch_parent, args=(life,), daemon=True).start()
    logging.basicConfig(level=logging.CRITICAL)
    job = strata_redis.connect(url, JOB, heartbeat_timeout=cfg["timeout"])
    number = int(worker_id.rsplit("-", 1)[1])
    worker = job.register_worker(
        worker_id, host=f"gpu-node-{number}", address=f"10.0.0.{10 + number}:29500",
        gpu_count=8, labels={"role": "demo"}, heartbeat_interval=cfg["interval"], replace=True,
    )  # fmt: skip
    rng = random.Random(worker_id)
    slow = 3.0 if number == 1 else 1.0
    try:
        while worker.lost is None:
            epoch = job.current_epoch()
            worker.set_status("training")
            for lease in job.leases(DATASET, epoch, worker_id, ttl=cfg["lease_ttl"]):
                time.sleep(cfg["work_s"] * slow * rng.uniform(0.6, 1.4))  # "train"
                with contextlib.suppress(strata_redis.LeaseLostError):
                    lease.complete()
            try:
                release = job.epoch_barrier(cfg["barrier_timeout"]).wait(worker_id)
            except (
                BarrierBrokenError,
                BarrierTimeoutError,
            ) as err:
                with contextlib.suppress(strata_redis.StrataError):
                    job.epoch_barrier().reset(err.generation)
                continue
            worker.set_status("checkpointing")
            _save(job, worker_id, cfg, checkpoint_dir, release)
    except strata_redis.WorkerError:
        pass  # declared failed (paused too long) or replaced: the supervisor restarts us
    finally:
        with contextlib.suppress(strata_redis.StrataError, Exception):
            worker.deregister()


def _save(
    job: strata_redis.Job, worker_id: str, cfg: dict[str, Any], directory: str, release: Any
) -> None:
    """Save this worker's part of the new epoch's step, ranked among the live workers."""
    live = job.live_workers()
    if worker_id not in live or len(live) != release.participants:
        return  # membership moved since the release: skip this step rather than hang it
    data = np.full(cfg["part_mb"] * MiB, live.index(worker_id), np.uint8)
    with contextlib.suppress(strata_redis.StrataError, ValueError), strata_redis.CheckpointManager(
        directory, keep_count=3, redis=job, worker_id=worker_id, rank=live.index(worker_id),
        world_size=len(live), commit_timeout=cfg["commit_timeout"],
    ) as ckpt:  # fmt: skip
        ckpt.save(data, step=release.epoch * 100, epoch=release.epoch, copy=False).result()


# -- the cluster, from the parent ------------------------------------------------------------
class DemoCluster:
    """The demo's worker processes and the supervisor that fails and restarts them.

    Args:
        url: the Redis.
        workers: how many worker processes (at least 3).
        checkpoint_dir: where they save.
        cfg: overrides of ``DEFAULTS``.
    """

    def __init__(
        self, url: str, workers: int, checkpoint_dir: str, cfg: dict[str, Any] | None = None
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or not 3 <= workers <= 32:
            raise ValueError(f"workers must be an int in [3, 32], got {workers!r}")
        self.url = url
        self.cfg = {**DEFAULTS, **(cfg or {})}
        self.ids = [f"worker-{i}" for i in range(1, workers + 1)]
        self.checkpoint_dir = checkpoint_dir
        self.procs: dict[str, BaseProcess] = {}
        self._lives: dict[str, Connection] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._supervisor: threading.Thread | None = None

    def start(self) -> None:
        """Register the dataset, start every worker and the supervisor."""
        with strata_redis.connect(self.url, JOB) as job:
            cfg = self.cfg
            strata_redis.ShardManager(job).register_dataset_params(
                DATASET, cfg["total_samples"], cfg["samples_per_shard"], True, 7
            )
        for worker_id in self.ids:
            self._spawn(worker_id)
        self._supervisor = threading.Thread(target=self._churn, name="demo-churn", daemon=True)
        self._supervisor.start()

    def _spawn(self, worker_id: str) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            mine, theirs = CTX.Pipe(duplex=False)
            proc = CTX.Process(
                target=worker_main, name=f"strata-demo-{worker_id}",
                args=(self.url, worker_id, self.cfg, self.checkpoint_dir, mine), daemon=True,
            )  # fmt: skip
            proc.start()
            mine.close()  # the child has it; ``theirs`` stays open while we live
            self.procs[worker_id] = proc
            self._lives[worker_id] = theirs

    def _churn(self) -> None:
        rng = random.Random(12)
        while not self._stop.wait(self.cfg["churn_every"] * rng.uniform(0.7, 1.3)):
            alive = [w for w, p in self.procs.items() if p.is_alive()]
            if len(alive) < len(self.ids):
                continue
            victim = rng.choice(alive)
            proc = self.procs[victim]
            if rng.random() < 0.7:
                log.info("demo: kill -9 %s", victim)
                os.kill(proc.pid or 0, signal.SIGKILL)  # no goodbye: declared failed
            else:
                log.info("demo: stopping %s gracefully", victim)
                proc.terminate()  # SIGTERM: it deregisters (leaves)
            proc.join(10)
            if self._stop.wait(self.cfg["rejoin_after"]):
                return
            self._spawn(victim)

    def stop(self) -> None:
        """Stop the supervisor and every worker process, and wait for them."""
        with self._lock:
            self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(15)
        for proc in self.procs.values():
            if proc.is_alive():
                proc.kill()
        for proc in self.procs.values():
            proc.join(10)
        for life in self._lives.values():
            life.close()


def run_demo(
    host: str = "127.0.0.1",
    port: int = 8050,
    *,
    workers: int = 4,
    threads: int = 8,
    ready: Callable[[str], None] | None = None,
) -> int:
    """Start Redis, the cluster and the dashboard; serve until Ctrl-C; stop everything.

    Returns:
        The exit code (0).
    """
    from .app import create_app
    from .serving import serve

    def say(text: str) -> None:
        print(text, flush=True)

    with contextlib.ExitStack() as stack:
        server = RedisServer()
        stack.callback(server.close)
        server.start()
        say(f"demo: private redis-server on {server.url}")
        directory = tempfile.mkdtemp(prefix="strata-dashboard-demo-")
        stack.callback(shutil.rmtree, directory, ignore_errors=True)
        cluster = DemoCluster(server.url, workers, directory)
        stack.callback(cluster.stop)
        cluster.start()
        say(f"demo: {workers} worker processes of job {JOB!r} (pids "
            f"{', '.join(str(p.pid) for p in cluster.procs.values())}); one fails or leaves "
            f"about every {cluster.cfg['churn_every']:.0f} s and rejoins")  # fmt: skip
        app = create_app(server.url, job=JOB, heartbeat_timeout=cluster.cfg["timeout"])

        def announce(url: str) -> None:
            say(f"dashboard: {url}  (Ctrl-C stops the dashboard, the workers and Redis)")
            if ready is not None:
                ready(url)

        serve(app, host, port, threads=threads, ready=announce)
        say("demo: stopping the workers and Redis ...")
    say("demo: stopped")
    sys.stdout.flush()
    return 0

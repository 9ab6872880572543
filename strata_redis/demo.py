"""``strata demo``: a simulated training cluster of real worker processes on one Redis.

The story: workers register and heartbeat; they drain epoch 0 of a dataset through shard
leases; one is killed with SIGKILL mid-shard, is declared failed, and its shards are
finished by the others, exactly once; the survivors meet at the epoch barrier and all
advance to the same epoch; in epoch 1 a straggler is killed while the others wait at the
barrier, which breaks at once (naming it) instead of hanging, and the survivors reset it
and carry on. After every epoch the workers save their parts of a checkpoint; one of them
is killed mid-save, that step never becomes visible, and the next one commits.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from .checkpoint.manager import CheckpointManager
from .errors import BarrierBrokenError, StrataError
from .job import Job, connect
from .server import RedisServer
from .shard_manager import ShardManager

CTX = multiprocessing.get_context("spawn")
DATASET = "demo-images"
#: the epoch-1 straggler sleeps this long before the barrier (it is killed meanwhile)
STRAGGLE_S = 30.0
MiB = 1024 * 1024


def say(text: str = "") -> None:
    """Print one line of the demo's story, at once."""
    print(text, flush=True)


# -- the worker process ---------------------------------------------------------------------


def _worker_main(
    url: str, job_id: str, worker_id: str, cfg: dict[str, Any], out: Connection, go: Any
) -> None:
    """A demo worker: register, drain each epoch through leases, meet at the epoch barrier.

    It tells the main process what happens on ``out``, its own pipe (see ``_Inbox``).
    """
    logging.basicConfig(level=logging.ERROR)  # the main process tells the story
    job = connect(url, job_id, heartbeat_timeout=cfg["timeout"])
    worker = job.register_worker(
        worker_id, host=os.uname().nodename, address=f"127.0.0.1:{29500 + os.getpid() % 1000}",
        gpu_count=8, labels={"role": "demo"}, heartbeat_interval=cfg["interval"],
    )  # fmt: skip
    out.send(("ready", worker_id))
    go.wait(120)
    worker.set_status("training")
    epoch = job.current_epoch()
    while epoch < cfg["epochs"]:
        for lease in job.leases(DATASET, epoch, worker_id, ttl=cfg["lease_ttl"]):
            time.sleep(cfg["work_s"])  # "train" on lease.indices()
            if lease.complete():
                out.send(("done", worker_id, epoch, lease.shard_id, lease.token))
        if worker_id == cfg["straggler"] and epoch == 1:
            out.send(("straggling", worker_id))
            time.sleep(STRAGGLE_S)
        while True:
            try:
                new = job.advance_epoch(worker_id, timeout=cfg["barrier_timeout"])
                break
            except BarrierBrokenError as err:
                out.send(("broken", worker_id, epoch, err.culprit, err.reason))
                job.epoch_barrier().reset(err.generation)
        out.send(("epoch", worker_id, new))
        epoch = new
        worker.set_status("checkpointing")
        _save(job, worker_id, cfg, epoch, out)
        worker.set_status("training")
    worker.deregister()


def _save(job: Job, worker_id: str, cfg: dict[str, Any], epoch: int, out: Connection) -> None:
    """Save this worker's part of the epoch's checkpoint (rank = place among the live)."""
    live = job.live_workers()
    rank, step = live.index(worker_id), epoch * 100
    big = worker_id == cfg["save_victim"] and epoch == 2  # slow enough to be killed mid-save
    data = np.full((cfg["victim_part_mb"] if big else cfg["part_mb"]) * MiB, rank, np.uint8)
    with CheckpointManager(
        cfg["checkpoint_path"], keep_count=2, redis=job, worker_id=worker_id, rank=rank,
        world_size=len(live), commit_timeout=60,
    ) as ckpt:  # fmt: skip
        future = ckpt.save(data, step=step, epoch=epoch, copy=False)
        out.send(("saving", worker_id, step))
        try:
            info = future.result()
            out.send(("saved", worker_id, step, info.world_size))
        except StrataError as err:  # aborted (or refused): the main process tells the story
            out.send(("save-aborted", worker_id, step, f"{type(err).__name__}: {err}"))


# -- the story, told by the main process ----------------------------------------------------


@contextlib.contextmanager
def _redis(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    say("starting a private redis-server on a free loopback port ...")
    with RedisServer() as server:
        say(f"  redis-server {server.binary} listening on {server.url}")
        yield server.url
    say("private redis-server stopped")


def _table(job: Job) -> None:
    say(f"  {'WORKER':<12}{'STATUS':<15}{'LAST SEEN':>10}  HOST")
    for w in job.workers():
        seen = "-" if w.last_seen_s is None else f"{w.last_seen_s:.1f}s ago"
        say(f"  {w.worker_id:<12}{w.status:<15}{seen:>10}  {w.host or '-'}")


class _Inbox:
    """Messages from the workers, in the order they are read; one pipe per worker.

    Each worker writes to a pipe of its own, from one thread, with no lock shared with
    any other process: the demo kills workers with SIGKILL at arbitrary points, and a worker
    killed in the middle of a send can break only its own channel. (A single shared
    ``multiprocessing.Queue`` would not do: its writers' feeder threads share one lock, and a
    worker killed while holding it silently blocks every other worker's messages for good.)
    """

    def __init__(self) -> None:
        self.readers: dict[Connection, str] = {}
        self.seen: list[tuple[Any, ...]] = []

    def channel(self, worker_id: str) -> Connection:
        """A new pipe for ``worker_id``; returns its write end, for the worker."""
        reader, writer = CTX.Pipe(duplex=False)
        self.readers[reader] = worker_id
        return writer

    def drain(self, timeout: float = 0.05) -> None:
        if not self.readers:
            time.sleep(timeout)
            return
        for ready in multiprocessing.connection.wait(list(self.readers), timeout):
            assert isinstance(ready, Connection)
            try:
                while ready.poll():
                    self.seen.append(ready.recv())
            except (EOFError, OSError):  # the worker is gone (exited or killed)
                self.close(ready)

    def close(self, reader: Connection | None = None) -> None:
        """Close ``reader``'s pipe, or every pipe."""
        for conn in [reader] if reader is not None else list(self.readers):
            conn.close()
            self.readers.pop(conn, None)

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        return [m for m in self.seen if m[0] == kind]

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float) -> float:
        start = time.monotonic()
        while not predicate():
            if time.monotonic() - start > timeout:
                recent = "".join(f"\n  {m!r}" for m in self.seen[-12:]) or " none"
                raise TimeoutError(
                    f"demo: {what} did not happen within {timeout}s; the workers' latest "
                    f"messages (of {len(self.seen)}; pipes still open: "
                    f"{sorted(self.readers.values())}):{recent}"
                )
            self.drain()
        return time.monotonic() - start


def run_demo(
    redis_url: str | None = None, *, workers: int = 4, job_id: str = "demo",
    checkpoint_path: str | None = None, heartbeat_interval: float = 0.25,
    heartbeat_timeout: float = 2.0,
) -> int:  # fmt: skip
    """Run the demo; return the process exit code (0 when every check held).

    Args:
        redis_url: a Redis to use; default a private ``redis-server``.
        workers: worker processes (at least 4: three are killed on the way).
        job_id: the job's id.
        checkpoint_path: where checkpoints go (a path or ``s3://`` URL); default a temporary
            directory, removed at the end.
        heartbeat_interval, heartbeat_timeout: the workers' heartbeats.
    """
    if workers < 4:
        raise ValueError(f"workers must be at least 4 (three are killed), got {workers}")
    ids = [f"worker-{i:02d}" for i in range(1, workers + 1)]
    with contextlib.ExitStack() as stack:
        if checkpoint_path is None:
            checkpoint_path = tempfile.mkdtemp(prefix="strata-demo-checkpoints-")
            stack.callback(shutil.rmtree, checkpoint_path, ignore_errors=True)
            stack.callback(
                say, "temporary checkpoint directory removed (--checkpoint-path keeps one)"
            )
        cfg = {
            "interval": heartbeat_interval, "timeout": heartbeat_timeout, "epochs": 3,
            "lease_ttl": 5.0, "work_s": 0.04, "barrier_timeout": 60.0,
            "victim": ids[-1], "straggler": ids[0], "save_victim": ids[-2],
            "part_mb": 8, "victim_part_mb": 768, "checkpoint_path": checkpoint_path,
        }  # fmt: skip
        return _run(redis_url, job_id, ids, cfg)


def _run(redis_url: str | None, job_id: str, ids: list[str], cfg: dict[str, Any]) -> int:
    workers, victim, straggler = len(ids), cfg["victim"], cfg["straggler"]
    heartbeat_timeout = cfg["timeout"]
    checks: list[tuple[str, bool]] = []
    with _redis(redis_url) as url:
        job = connect(url, job_id, heartbeat_timeout=heartbeat_timeout)
        if job.live_workers():
            say(f"job {job_id!r} already has live workers in this Redis: pick another --job")
            return 2
        params = ShardManager(job).register_dataset_params(DATASET, 12_000, 100, True, 42)
        say(f"\n== 1. {workers} worker processes register and heartbeat (job {job_id!r})")
        say(f"  dataset {DATASET!r}: {params.total_samples} samples in {params.num_shards} "
            f"shards of {params.samples_per_shard}, shuffled per epoch (seed 42)")  # fmt: skip
        inbox = _Inbox()
        go = CTX.Event()
        procs: dict[str, BaseProcess] = {}
        try:
            for wid in ids:
                writer = inbox.channel(wid)
                proc: BaseProcess = CTX.Process(
                    target=_worker_main, args=(url, job_id, wid, cfg, writer, go), daemon=True
                )
                proc.start()
                writer.close()  # the worker has its copy: its pipe ends when it does
                procs[wid] = proc
            inbox.wait("registration", lambda: len(inbox.of("ready")) == workers, 120)
            _table(job)
            say(f"  membership generation: {job.membership_generation()}")
            go.set()
            checks += _epoch0(job, inbox, procs, victim, params.num_shards, heartbeat_timeout)
            checks += _epoch1(job, inbox, procs, straggler, heartbeat_timeout)
            checks += _mid_save(job, inbox, procs, cfg["save_victim"], heartbeat_timeout)
            last = (workers - 1) + (workers - 2) + (workers - 3)  # "epoch" messages, epochs 1-3
            inbox.wait("the last epoch", lambda: len(inbox.of("epoch")) >= last, 120)
            inbox.wait("the last save", lambda: any(m[2] == 300 for m in inbox.of("saved")), 60)
            for proc in procs.values():
                proc.join(30)
        finally:
            for proc in procs.values():
                if proc.is_alive():
                    proc.kill()
                    proc.join(10)
            inbox.close()
        say("\n== summary")
        statuses = {w.worker_id: w.status for w in job.workers()}
        say(f"  workers: {', '.join(f'{k}={v}' for k, v in sorted(statuses.items()))}")
        say(f"  epoch: {job.current_epoch()}, membership generation "
            f"{job.membership_generation()}")  # fmt: skip
        checks += _checkpoints(job, cfg["checkpoint_path"])
        for what, ok in checks:
            say(f"  [{'OK' if ok else 'FAILED'}] {what}")
        job.close()
    return 0 if all(ok for _, ok in checks) else 1


def _kill(procs: dict[str, BaseProcess], wid: str) -> None:
    os.kill(procs[wid].pid or 0, signal.SIGKILL)
    procs[wid].join(10)


def _epoch0(
    job: Job, inbox: _Inbox, procs: dict[str, BaseProcess], victim: str, num_shards: int,
    timeout: float,
) -> list[tuple[str, bool]]:  # fmt: skip
    say("\n== 2. epoch 0: the workers drain the dataset through fenced shard leases")
    leases = job.leases(DATASET, 0, victim)
    inbox.wait("a quarter of epoch 0", lambda: leases.progress().done >= num_shards // 4, 60)
    held: list[int] = []
    pid = procs[victim].pid or 0

    def holding() -> bool:
        # Kill it mid-shard, not in the instant between two leases: stop it, look at what
        # it holds (nothing can change while it is stopped), and let it go on if nothing.
        os.kill(pid, signal.SIGSTOP)
        holders = job.client.hgetall(leases.keys.holders)
        held[:] = sorted(int(s) for s, v in holders.items() if v.split(" ", 3)[3] == victim)
        if not held:
            os.kill(pid, signal.SIGCONT)
        return bool(held)

    inbox.wait(f"{victim} to hold a lease", holding, 30)
    say(f"  progress: {leases.progress().done}/{num_shards} shards; {victim} holds {held}")
    say(f"  kill -9 {victim} (pid {pid}) mid-shard: no goodbye, no release")
    _kill(procs, victim)

    def failed() -> bool:
        return {w.worker_id: w.status for w in job.workers()}[victim] == "failed"

    detected = inbox.wait("failure detection", failed, timeout * 4)
    say(f"  {victim} declared failed {detected:.2f}s after the kill (timeout {timeout}s) "
        "by the survivors' heartbeat threads; its leases went back to the pool")  # fmt: skip
    survivors = [w for w in procs if w != victim]
    inbox.wait("epoch 0 to end", lambda: len(inbox.of("epoch")) >= len(survivors), 120)
    done = [m for m in inbox.of("done") if m[2] == 0]
    record = leases.completions()
    redone = [s for s in held if s in record and record[s][0] != victim]
    reported = [m[3] for m in done]
    # The record holds each shard once; a worker's report matches it; only the killed
    # worker may have recorded a shard and died before reporting it.
    once = sorted(record) == list(range(num_shards)) and len(reported) == len(set(reported))
    same = all(record[m[3]] == (m[1], m[4]) for m in done) and all(
        record[s][0] == victim for s in set(record) - set(reported)
    )
    say(f"  epoch 0 record: {len(record)}/{num_shards} shards, each recorded once "
        f"({len(done)} completions reported by the workers, {len(set(m[3] for m in done))} "
        f"distinct); {victim}'s in-flight shards {redone} finished by others")  # fmt: skip
    epochs = {m[2] for m in inbox.of("epoch")}
    say(f"  the survivors met at the epoch barrier and all advanced to epoch {sorted(epochs)}")
    _table(job)
    return [
        (
            f"{victim} declared failed within timeout + 1s ({detected:.2f}s)",
            detected <= timeout + 1,
        ),
        ("epoch 0: every shard completed exactly once", once and same),
        (f"{victim}'s leased shards finished by the others", redone == held and bool(held)),
        ("survivors agree on the new epoch", epochs == {1}),
    ]


def _epoch1(
    job: Job, inbox: _Inbox, procs: dict[str, BaseProcess], straggler: str, timeout: float
) -> list[tuple[str, bool]]:
    say(f"\n== 3. epoch 1: {straggler} straggles before the barrier; the others wait in it")
    inbox.wait("the straggler", lambda: bool(inbox.of("straggling")), 120)
    waiting = [w for w in procs if procs[w].is_alive() and w != straggler]
    barrier = job.epoch_barrier()
    inbox.wait("the others to arrive", lambda: len(barrier.state().arrived) >= len(waiting), 60)
    say(f"  {len(waiting)} workers wait at the epoch barrier; kill -9 {straggler}")
    _kill(procs, straggler)
    killed = time.monotonic()

    def broken() -> list[tuple[Any, ...]]:
        return [m for m in inbox.of("broken") if m[2] == 1]

    inbox.wait("the barrier to break", lambda: len(broken()) >= len(waiting), 60)
    broke = time.monotonic() - killed
    culprits = {m[3] for m in broken()}
    say(f"  every waiter got BarrierBrokenError naming {sorted(culprits)} {broke:.2f}s after "
        f"the kill (the barrier timeout is 60s): no hang")  # fmt: skip
    inbox.wait("epoch 1 to end", lambda: len(inbox.of("epoch")) >= 2 * len(waiting) + 1, 60)
    epochs = sorted({m[2] for m in inbox.of("epoch")})
    say(f"  the survivors reset the barrier and advanced together: epochs seen {epochs}")
    return [
        (f"barrier broken at once naming {straggler} ({broke:.2f}s)",
         culprits == {straggler} and broke <= timeout + 1),
        ("survivors continued after the reset", 2 in epochs),
    ]  # fmt: skip


def _mid_save(
    job: Job, inbox: _Inbox, procs: dict[str, BaseProcess], victim: str, timeout: float
) -> list[tuple[str, bool]]:
    say(f"\n== 4. checkpoint of epoch 2 (step 200): kill -9 {victim} in the middle of its upload")
    step_key, acks_key = job.keys.checkpoint_step(200), job.keys.checkpoint_acks(200)
    pid = procs[victim].pid or 0
    inbox.wait(f"{victim}'s upload", lambda: victim in job.client.hvals(step_key), 60)
    os.kill(pid, signal.SIGSTOP)  # frozen mid-upload: check it has not acked yet
    if any(victim in v for v in job.client.hvals(acks_key)):
        os.kill(pid, signal.SIGCONT)
        say(f"  {victim} finished its upload before it could be stopped: nothing to show")
        return [(f"{victim} killed mid-save", False)]
    _kill(procs, victim)
    killed = time.monotonic()
    others = [w for w in procs if procs[w].is_alive()]

    def aborted() -> list[tuple[Any, ...]]:
        return [m for m in inbox.of("save-aborted") if m[2] == 200]

    inbox.wait("the abort", lambda: len(aborted()) >= len(others), 60)
    took = time.monotonic() - killed
    say(
        f"  {victim} was declared failed and the other ranks were told at once: step 200 "
        f"aborted {took:.2f}s after the kill (commit timeout 60s):"
    )
    say(f"    {aborted()[0][3]}")
    told = all(m[3].startswith("CheckpointAbortedError") for m in aborted())
    return [(f"step 200 aborted at once when {victim} died mid-save ({took:.2f}s)",
             told and took <= timeout + 2)]  # fmt: skip


def _checkpoints(job: Job, path: str) -> list[tuple[str, bool]]:
    say("\n== checkpoints")
    with CheckpointManager(path, keep_count=2, redis=job, worker_id="demo-reader") as ckpt:
        kept = ckpt.list()
        for info in kept:
            ranks = sorted(info.workers.values())
            say(f"  step {info.step:>4} (epoch {info.epoch}): {info.world_size} ranks {ranks}, "
                f"{info.nbytes / MiB:.0f} MiB, verified")  # fmt: skip
        latest = ckpt.latest()
        say(f"  would resume from: step {latest.step if latest else None} at {path}")
        loaded = ckpt.load_checkpoint(rank=0) if latest else None
    steps = sorted(info.step for info in kept)
    return [
        ("checkpoints kept: steps 100 and 300 (200 never became visible)", steps == [100, 300]),
        (
            "resume point step 300 loads and verifies",
            loaded is not None and loaded.info.step == 300,
        ),
    ]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_demo())

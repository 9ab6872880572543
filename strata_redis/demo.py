"""``strata demo``: a simulated training cluster of real worker processes on one Redis.

Each worker process runs the seeds' training loop through ``TrainingOrchestrator``, and the
demo puts the job through what real clusters do to it:

1. the workers start staggered: the elastic rendezvous waits for them and closes one round
   with all of them (nobody trains alone);
2. in epoch 0 one is killed with SIGKILL mid-shard: it is declared failed, the survivors
   meet in a new round and finish its shards, each once;
3. at the end of epoch 1 a straggler is slow: the others wait for it at the epoch barrier
   and all advance together;
4. in epoch 2 one is killed in the middle of its checkpoint upload: that step is aborted
   for every rank and never becomes visible; the survivors go on;
5. in epoch 3, right after a checkpoint, the whole job is killed and relaunched with one
   worker fewer than it started with: it resumes from that checkpoint's data position;
6. from every sample each worker trained, the demo checks that each sample of each epoch
   was trained exactly once relative to the model that was kept.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import numpy as np

from .checkpoint.commit import step_workers
from .checkpoint.ids import CheckpointId
from .checkpoint.manager import CheckpointManager
from .checkpoint.manifest import CheckpointInfo
from .coordination.rendezvous import Rendezvous
from .data.record import keep_whole
from .data.sharding import DatasetParams
from .errors import StrataError
from .job import Job, connect
from .orchestrator import TrainingOrchestrator
from .server import RedisServer
from .shard_manager import ShardManager

CTX = multiprocessing.get_context("spawn")
DATASET = "demo-images"
#: the dataset: samples, samples per shard; the loop's batch size and "training" per batch
SAMPLES, PER_SHARD, BATCH, WORK_S = 12_000, 100, 20, 0.01
#: epochs the job trains
EPOCHS = 4
#: the seeds' loop saves a checkpoint every this many steps
SAVE_EVERY = 100
MiB = 1024 * 1024


def say(text: str = "") -> None:
    """Print one line of the demo's story, at once."""
    print(text, flush=True)


# -- the worker process ---------------------------------------------------------------------


def _worker_main(
    url: str, job_id: str, worker_id: str, run: str, cfg: dict[str, Any], out: Connection
) -> None:
    """A demo worker: the seeds' loop through ``TrainingOrchestrator``, recording each batch.

    It logs every sample it trains to its own file and tells the main process what happens
    on ``out``, its own pipe (see ``_Inbox``). ``run`` is "a" for the first launch of the
    job, "b" for the relaunch.
    """
    logging.basicConfig(level=logging.ERROR)  # the main process tells the story
    lock = threading.Lock()  # the loop and the checkpoint threads both tell

    def tell(*message: Any) -> None:
        with lock:
            out.send(message)

    trained: list[int] = []  # this rank's "model": the samples it trained this epoch
    ballast: list[bytes] = []  # a big part: the save victim is slow enough to kill mid-upload

    def state() -> dict[str, bytes]:
        parts = {"model.bin": np.asarray(trained, dtype=np.int64).tobytes()}
        if ballast:
            parts["optimizer.bin"] = ballast.pop()
        return parts

    def saved(epoch: int, step: int, future: Future[CheckpointInfo]) -> None:
        try:
            info = future.result()
            tell("saved", worker_id, epoch, step, info.label, info.world_size, info.run)
        except StrataError as err:
            tell("save-failed", worker_id, epoch, step, f"{type(err).__name__}: {err}")

    tell("joining", worker_id, time.time())
    members = cfg["rendezvous"][run]
    # the relaunch restarts killed workers under their ids, whose registrations may still
    # look alive (the reaper has not declared them failed yet): it takes them over, as a
    # torchrun restart would (TORCHELASTIC_RESTART_COUNT > 0)
    orchestrator = TrainingOrchestrator(
        url, worker_id, job_id=job_id, replace=run == "b",
        checkpoint_path=cfg["checkpoint_path"], keep_count=3,
        min_workers=members[0], max_workers=members[1], last_call=cfg["last_call"],
        heartbeat_timeout=cfg["timeout"], heartbeat_interval=cfg["interval"],
        batch_size=BATCH, state_provider=state, commit_timeout=60.0, lease_ttl=5.0,
        on_round=lambda r: tell("round", worker_id, r.number, r.rank, r.world_size, time.time()),
    )  # fmt: skip
    model_epoch = -1
    with orchestrator, open(Path(cfg["logdir"], f"{run}-{worker_id}.log"), "a") as log:
        resumed = orchestrator.resumed
        tell("resumed", worker_id, resumed and resumed.label, orchestrator.epoch)
        # -- the seeds' loop --
        shard_info = orchestrator.get_shards(DATASET)
        for epoch in range(orchestrator.epoch, EPOCHS):
            for step, batch in enumerate(shard_info):
                time.sleep(WORK_S)  # "train" on the batch's samples
                if model_epoch != epoch:
                    trained.clear()
                    model_epoch = epoch
                trained.extend(batch.tolist())
                log.write(f"{epoch} {' '.join(map(str, batch.tolist()))}\n")
                log.flush()
                if step % SAVE_EVERY == 0:
                    if (worker_id, run, epoch, step) == (cfg["save_victim"], "a", 2, 0):
                        ballast.append(bytes(cfg["victim_part_mb"] * MiB))
                    future = orchestrator.save_checkpoint(step=step, epoch=epoch)
                    if future is not None:
                        tell("saving", worker_id, epoch, step, orchestrator.round.number)
                        future.add_done_callback(functools.partial(saved, epoch, step))
            if (worker_id, run, epoch) == (cfg["straggler"], "a", 1):
                tell("straggling", worker_id, time.time())
                time.sleep(cfg["straggle_s"])
            tell("arrived", worker_id, epoch, time.time())
            new = orchestrator.advance_epoch()
            tell("epoch", worker_id, new, time.time())
        orchestrator.wait_for_checkpoints(60)
    tell("finished", worker_id)


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

    def of(self, kind: str, since: int = 0) -> list[tuple[Any, ...]]:
        """The messages of ``kind`` read so far (from the ``since``-th message on)."""
        return [m for m in self.seen[since:] if m[0] == kind]

    def pause(self, seconds: float) -> None:
        """Let ``seconds`` pass, reading messages meanwhile (a pipe never fills up)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.drain(min(0.05, max(0.0, end - time.monotonic())))

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


class _Cluster:
    """The demo's worker processes and what they tell (``inbox``)."""

    def __init__(self, url: str, job_id: str, cfg: dict[str, Any]) -> None:
        self.url, self.job_id, self.cfg = url, job_id, cfg
        self.inbox = _Inbox()
        self.procs: dict[str, BaseProcess] = {}

    def start(self, worker_id: str, run: str) -> None:
        writer = self.inbox.channel(worker_id)
        proc: BaseProcess = CTX.Process(
            target=_worker_main, args=(self.url, self.job_id, worker_id, run, self.cfg, writer),
            name=f"strata-demo-{worker_id}", daemon=True,
        )  # fmt: skip
        proc.start()
        writer.close()  # the worker has its copy: its pipe ends when it does
        self.procs[worker_id] = proc

    def alive(self) -> list[str]:
        return [w for w, p in self.procs.items() if p.is_alive()]

    def pid(self, worker_id: str) -> int:
        return self.procs[worker_id].pid or 0

    def kill(self, worker_id: str) -> None:
        os.kill(self.pid(worker_id), signal.SIGKILL)
        self.procs[worker_id].join(10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.is_alive():
                proc.kill()
            proc.join(10)
        self.inbox.close()


def run_demo(
    redis_url: str | None = None, *, workers: int = 4, job_id: str = "demo",
    checkpoint_path: str | None = None, heartbeat_interval: float = 0.25,
    heartbeat_timeout: float = 2.0,
) -> int:  # fmt: skip
    """Run the demo; return the process exit code (0 when every check held).

    Args:
        redis_url: a Redis to use; default a private ``redis-server``.
        workers: worker processes (at least 4: two are killed on the way, and the job goes
            on with two).
        job_id: the job's id (it must be new to the Redis and to the checkpoint storage).
        checkpoint_path: where checkpoints go (a path or ``s3://`` URL); default a temporary
            directory, removed at the end.
        heartbeat_interval, heartbeat_timeout: the workers' heartbeats.
    """
    if workers < 4:
        raise ValueError(f"workers must be at least 4 (two are killed), got {workers}")
    ids = [f"worker-{i:02d}" for i in range(1, workers + 1)]
    with contextlib.ExitStack() as stack:
        logdir = tempfile.mkdtemp(prefix="strata-demo-samples-")
        stack.callback(shutil.rmtree, logdir, ignore_errors=True)
        if checkpoint_path is None:
            checkpoint_path = tempfile.mkdtemp(prefix="strata-demo-checkpoints-")
            stack.callback(shutil.rmtree, checkpoint_path, ignore_errors=True)
            stack.callback(
                say, "temporary checkpoint directory removed (--checkpoint-path keeps one)"
            )
        cfg = {
            "interval": heartbeat_interval, "timeout": heartbeat_timeout, "last_call": 5.0,
            # (min_workers, max_workers): the first launch waits for all of them and goes on
            # with two; the relaunch, one fewer than the first, waits for all of its own
            "rendezvous": {"a": (2, workers), "b": (workers - 1, workers - 1)},
            "victim": ids[-1], "straggler": ids[0], "save_victim": ids[-2], "straggle_s": 3.0,
            "victim_part_mb": 512, "checkpoint_path": checkpoint_path, "logdir": logdir,
        }  # fmt: skip
        return _run(redis_url, job_id, ids, cfg)


def _in_use(job: Job, path: str) -> str | None:
    """Why the job cannot be the demo's (it has state in Redis or storage), or None."""
    if job.current_epoch() or Rendezvous(job.context).current_round() or job.live_workers():
        return f"job {job.job_id!r} already has state in this Redis"
    with CheckpointManager(path, job_id=job.job_id, redis=job, worker_id="demo-reader") as ckpt:
        if ckpt.list():
            return f"{path} already holds checkpoints of job {job.job_id!r}"
    return None


def _run(redis_url: str | None, job_id: str, ids: list[str], cfg: dict[str, Any]) -> int:
    checks: list[tuple[str, bool]] = []
    with _redis(redis_url) as url:
        job = connect(url, job_id, heartbeat_timeout=cfg["timeout"])
        with contextlib.closing(job):
            why = _in_use(job, cfg["checkpoint_path"])
            if why is not None:
                say(f"{why}: pick another --job (or an empty --checkpoint-path)")
                return 2
            params = ShardManager(job).register_dataset_params(
                DATASET, SAMPLES, PER_SHARD, True, 42
            )
            # the closing checks read every epoch's per-shard record: keep them whole
            keep_whole(job.context, DATASET, EPOCHS)
            say(f"dataset {DATASET!r}: {params.total_samples} samples in {params.num_shards} "
                f"shards of {params.samples_per_shard}, shuffled per epoch (seed 42); batches "
                f"of {BATCH}; {EPOCHS} epochs; a checkpoint every {SAVE_EVERY} steps")  # fmt: skip
            cluster = _Cluster(url, job_id, cfg)
            try:
                checks += _staggered_start(job, cluster, ids)
                checks += _kill_mid_epoch(job, cluster, params)
                checks += _straggler(cluster)
                checks += _kill_mid_save(job, cluster)
                resumed, more = _restart(job, cluster, ids, params.num_shards)
                checks += more
            finally:
                cluster.stop()
            say("\n== 6. the summary")
            _table(job)
            say(f"  epoch: {job.current_epoch()}, membership generation "
                f"{job.membership_generation()}")  # fmt: skip
            checks.append((f"the job finished its {EPOCHS} epochs", job.current_epoch() == EPOCHS))
            checks += _exactly_once(job, cfg, params, resumed)
            checks += _checkpoints(job, cfg["checkpoint_path"])
        for what, ok in checks:
            say(f"  [{'OK' if ok else 'FAILED'}] {what}")
    return 0 if all(ok for _, ok in checks) else 1


def _staggered_start(job: Job, cluster: _Cluster, ids: list[str]) -> list[tuple[str, bool]]:
    cfg, inbox, first = cluster.cfg, cluster.inbox, ids[0]
    low, high = cfg["rendezvous"]["a"]
    say(f"\n== 1. {len(ids)} workers start 0.5s apart; the rendezvous waits for them")
    say(
        f"  a round closes when {high} workers are in, or {cfg['last_call']:g}s after "
        f"{low} are (min_workers={low}, max_workers={high}, last_call={cfg['last_call']:g})"
    )
    for i, wid in enumerate(ids):
        if i:
            inbox.pause(0.5)  # a staggered start: the first must not train alone
        cluster.start(wid, "a")
    inbox.wait("the first round", lambda: len(inbox.of("round")) == len(ids), 120)
    rounds = {m[1]: m for m in inbox.of("round")}
    joined = {m[1]: m[2] for m in inbox.of("joining")}
    waited = rounds[first][5] - joined[first]
    say(f"  round {rounds[first][2]} closed with all {len(ids)}: {first} waited {waited:.1f}s "
        f"in the rendezvous for {ids[-1]}; ranks "
        + ", ".join(f"{w}={rounds[w][3]}" for w in ids))  # fmt: skip
    _table(job)
    one = {(m[2], m[4]) for m in rounds.values()} == {(1, len(ids))}
    return [(f"staggered start: one round of all {len(ids)} workers, nobody trained alone", one)]


def _kill_mid_epoch(job: Job, cluster: _Cluster, params: DatasetParams) -> list[tuple[str, bool]]:
    num_shards = params.num_shards
    inbox, victim, timeout = cluster.inbox, cluster.cfg["victim"], cluster.cfg["timeout"]
    say("\n== 2. epoch 0: the workers drain the dataset through fenced shard leases")
    leases = job.leases(DATASET, 0, victim)
    inbox.wait("a quarter of epoch 0", lambda: leases.progress().done >= num_shards // 4, 60)
    held: list[int] = []
    pid = cluster.pid(victim)

    log = Path(cluster.cfg["logdir"], f"a-{victim}.log")

    def holding() -> bool:
        # Kill it mid-shard, having trained part of it: stop it, look at what it holds and
        # what it trained last (nothing can change while it is stopped); else let it go on.
        os.kill(pid, signal.SIGSTOP)
        held[:] = sorted(s for s, h in leases.holders().items() if h.worker_id == victim)
        lines = log.read_text().splitlines() if log.exists() else []
        last = {int(i) for i in lines[-1].split()[1:]} if lines else set()
        if not any(last <= set(params.shard(s, 0).indices().tolist()) for s in held):
            held.clear()
            os.kill(pid, signal.SIGCONT)
        return bool(held)

    inbox.wait(f"{victim} to hold a lease", holding, 30)
    say(
        f"  progress: {leases.progress().done}/{num_shards} shards; {victim} holds {held}, "
        "part of it trained"
    )
    say(f"  kill -9 {victim} (pid {pid}) mid-shard: no goodbye, no release")
    cluster.kill(victim)
    killed = time.monotonic()
    survivors = cluster.alive()

    def failed() -> bool:
        return {w.worker_id: w.status for w in job.workers()}[victim] == "failed"

    detected = inbox.wait("failure detection", failed, timeout * 4)

    def regrouped() -> bool:
        return {m[1] for m in inbox.of("round") if m[2] == 2} >= set(survivors)

    inbox.wait("the survivors' new round", regrouped, 60)
    rejoined = time.monotonic() - killed
    say(f"  {victim} declared failed {detected:.2f}s after the kill (heartbeat timeout "
        f"{timeout:g}s); the {len(survivors)} survivors were in round 2 {rejoined:.2f}s after "
        "it and went on where they were; its leases went back to the pool")  # fmt: skip
    inbox.wait("epoch 0 to end", lambda: len(inbox.of("epoch")) >= len(survivors), 120)
    record = leases.completions()
    redone = [s for s in held if s in record and record[s][0] != victim]
    epochs = {m[2] for m in inbox.of("epoch")}
    say(f"  epoch 0 record: {len(record)}/{num_shards} shards, each recorded once; "
        f"{victim}'s shards {redone} finished by others; the survivors advanced to epoch "
        f"{sorted(epochs)}")  # fmt: skip
    return [
        (f"{victim} declared failed within timeout + 1s ({detected:.2f}s)",
         detected <= timeout + 1),
        (f"survivors in a new round within timeout + 2s ({rejoined:.2f}s)",
         rejoined <= timeout + 2),
        ("epoch 0: every shard recorded once", sorted(record) == list(range(num_shards))),
        (f"{victim}'s leased shards finished by the others", redone == held and bool(held)),
    ]  # fmt: skip


def _straggler(cluster: _Cluster) -> list[tuple[str, bool]]:
    inbox, straggler = cluster.inbox, cluster.cfg["straggler"]
    say(f"\n== 3. epoch 1: {straggler} straggles before the epoch barrier")
    inbox.wait("the straggler", lambda: bool(inbox.of("straggling")), 120)
    say(f"  {straggler} is {cluster.cfg['straggle_s']:g}s late; the others wait for it at the "
        "barrier (nobody advances alone)")  # fmt: skip
    members = cluster.alive()
    inbox.wait("epoch 1 to end", lambda: len([m for m in inbox.of("epoch") if m[2] == 2])
               >= len(members), 60)  # fmt: skip
    arrived = {m[1]: m[3] for m in inbox.of("arrived") if m[2] == 1}
    advanced = {m[1]: m[3] for m in inbox.of("epoch") if m[2] == 2}
    waits = [advanced[w] - arrived[w] for w in members if w != straggler]
    say(f"  the others waited {min(waits):.1f}-{max(waits):.1f}s at the barrier; all "
        f"{len(members)} advanced to epoch 2 together, after {straggler} arrived")  # fmt: skip
    after = all(t >= arrived[straggler] for t in advanced.values())
    return [(f"nobody advanced before the straggler {straggler} arrived", after
             and set(advanced) == set(members))]  # fmt: skip


def _kill_mid_save(job: Job, cluster: _Cluster) -> list[tuple[str, bool]]:
    inbox, victim, timeout = cluster.inbox, cluster.cfg["save_victim"], cluster.cfg["timeout"]
    say(f"\n== 4. epoch 2, step 0's checkpoint: kill -9 {victim} in the middle of its upload")

    def saving() -> list[tuple[Any, ...]]:
        return [m for m in inbox.of("saving") if m[1:4] == (victim, 2, 0)]

    inbox.wait(f"{victim}'s upload", lambda: bool(saving()), 120)
    round_ = saving()[0][4]
    cid = CheckpointId(0, 2)  # epoch 2, step 0 of the job's first run
    pid = cluster.pid(victim)
    inbox.wait(f"{victim}'s upload", lambda: victim in step_workers(job.context, cid)[0], 60)
    os.kill(pid, signal.SIGSTOP)  # frozen mid-upload: check it has not acked yet
    if victim in step_workers(job.context, cid)[1]:
        os.kill(pid, signal.SIGCONT)
        say(f"  {victim} finished its upload before it could be stopped: nothing to show")
        return [(f"{victim} killed mid-save", False)]
    cluster.kill(victim)
    killed = time.monotonic()
    survivors = cluster.alive()

    def regrouped() -> bool:
        return {m[1] for m in inbox.of("round") if m[2] > round_} >= set(survivors)

    inbox.wait("the survivors' new round", regrouped, 60)
    took = time.monotonic() - killed
    savers = {m[1] for m in inbox.of("saving") if m[2:5] == (2, 0, round_)} & set(survivors)
    inbox.wait("the aborts", lambda: {m[1] for m in inbox.of("save-failed")
                                      if m[2:4] == (2, 0)} >= savers, 60)  # fmt: skip
    aborted = [m for m in inbox.of("save-failed") if m[2:4] == (2, 0)]
    say(f"  {victim} was declared failed and the round broke: every rank that had saved its "
        f"part ({', '.join(sorted(savers)) or 'none yet'}) was told, and the survivors were "
        f"in a new round {took:.2f}s after the kill (commit timeout 60s):")  # fmt: skip
    for m in aborted[:1]:
        say(f"    {m[4]}")
    told = all(m[4].startswith("CheckpointAbortedError") for m in aborted)
    path = cluster.cfg["checkpoint_path"]
    with CheckpointManager(path, job_id=job.job_id, redis=job, worker_id="demo-reader") as ckpt:
        visible = cid.label in {info.label for info in ckpt.list()}
    say(
        f"  that checkpoint is {'VISIBLE' if visible else 'not visible'}: "
        f"{'a partial step was published' if visible else 'never published'}"
    )
    return [
        (f"epoch 2's step 0 aborted for every rank when {victim} died mid-save ({took:.2f}s "
         "to a new round)", told and took <= timeout + 2),
        ("the aborted checkpoint never became visible", not visible),
    ]  # fmt: skip


def _restart(
    job: Job, cluster: _Cluster, ids: list[str], num_shards: int
) -> tuple[CheckpointId, list[tuple[str, bool]]]:
    inbox = cluster.inbox
    say(f"\n== 5. epoch 3: right after a checkpoint, the whole job is killed; relaunched "
        f"with {len(ids) - 1} workers")  # fmt: skip

    def committed() -> list[tuple[Any, ...]]:
        return [m for m in inbox.of("saved") if m[2] == 3 and m[3] > 0]

    inbox.wait("a checkpoint in the middle of epoch 3", lambda: bool(committed()), 120)
    running = cluster.alive()
    for wid in running:
        cluster.kill(wid)
    top = max(inbox.of("saved"), key=lambda m: (m[6], m[2], m[3]))  # (run, epoch, step)
    newest = CheckpointId(top[3], top[2], top[6])
    epoch, step = newest.epoch, newest.step
    done = job.leases(DATASET, 3, ids[0]).progress().done
    say(f"  checkpoint {newest.label} (epoch {epoch}, step {step}) committed by "
        f"{committed()[0][5]} ranks; kill -9 {', '.join(running)} at "
        f"{done}/{num_shards} shards of epoch 3")  # fmt: skip
    mark = len(inbox.seen)
    relaunched = ids[:-1]
    for wid in relaunched:
        cluster.start(wid, "b")
    inbox.wait("the relaunch", lambda: len(inbox.of("resumed", mark)) == len(relaunched), 120)
    resumed = {m[2] for m in inbox.of("resumed", mark)}
    say(
        f"  {', '.join(relaunched)} started again: a fresh round of {len(relaunched)}; they "
        f"resumed from checkpoint {sorted(resumed)} (epoch {epoch}, step {step}); their "
        "checkpoints from now on are run 1's"
    )
    inbox.wait("the end of the job", lambda: len(inbox.of("finished", mark)) == len(relaunched),
               180)  # fmt: skip
    for wid in relaunched:
        cluster.procs[wid].join(30)
    codes = [cluster.procs[w].exitcode for w in relaunched]
    say(f"  the relaunched job finished epoch 3; exit codes {codes}")
    return newest, [
        ("the whole-job kill came in the middle of epoch 3", 0 < done < num_shards),
        ("relaunched with one worker fewer, resumed from the newest checkpoint",
         resumed == {newest.label} and codes == [0] * len(relaunched)),
    ]  # fmt: skip


def _trained(logdir: str) -> dict[tuple[str, str], dict[int, list[int]]]:
    """(run, worker) -> epoch -> the samples it trained, in order, from the workers' logs."""
    out: dict[tuple[str, str], dict[int, list[int]]] = {}
    for path in Path(logdir).glob("*.log"):
        run, worker = path.stem.split("-", 1)
        epochs = out.setdefault((run, worker), {})
        for line in path.read_text().splitlines():
            epoch, *samples = line.split()
            epochs.setdefault(int(epoch), []).extend(int(s) for s in samples)
    return out


def _exactly_once(
    job: Job, cfg: dict[str, Any], params: DatasetParams, resumed: CheckpointId
) -> list[tuple[str, bool]]:
    """Each sample of each epoch trained exactly once relative to the model that was kept.

    A worker killed mid-shard takes the part of the shard it trained with it: that shard is
    not in its record, and whoever finishes it trains it whole; those samples are the only
    repeats. Epoch 3's model is the checkpoint the job resumed from (its ranks' samples),
    plus what the relaunched job trained after it; what the killed job trained after the
    checkpoint was lost with it.
    """
    say("\n  every sample each worker trained, epoch by epoch (from the workers' logs):")
    trained, everything = _trained(cfg["logdir"]), Counter(range(params.total_samples))
    checks = []
    for epoch in range(EPOCHS - 1):
        counts: Counter[int] = Counter()
        for (run, _), epochs in trained.items():
            counts.update(epochs.get(epoch, []) if run == "a" else [])
        record = job.leases(DATASET, epoch, cfg["straggler"]).completions()
        lost: Counter[int] = Counter()
        for victim in (cfg["victim"], cfg["save_victim"]):
            mine = {s for s, (w, _) in record.items() if w == victim}
            kept = {int(i) for s in mine for i in params.shard(s, epoch).indices()}
            lost.update(s for s in trained.get(("a", victim), {}).get(epoch, []) if s not in kept)
        relative = counts - lost
        say(
            f"    epoch {epoch}: {sum(counts.values())} trained, {sum(lost.values())} of them "
            f"in a killed worker's unfinished shard (trained again by whoever finished it)"
        )
        checks.append(
            (
                f"epoch {epoch}: each sample trained exactly once relative to the model",
                relative == everything and +(counts - everything) == lost,
            )
        )
    with CheckpointManager(cfg["checkpoint_path"], job_id=job.job_id, redis=job,
                           worker_id="demo-reader") as ckpt:  # fmt: skip
        info = ckpt.verify(resumed.step, epoch=resumed.epoch, run=resumed.run)
        model = Counter(
            int(s) for r in range(info.world_size)
            for s in np.frombuffer(
                ckpt.load(resumed.step, rank=r, epoch=resumed.epoch, run=resumed.run),
                dtype=np.int64,
            )
        )  # fmt: skip
    after: Counter[int] = Counter()
    for (run, _), epochs in trained.items():
        after.update(epochs.get(EPOCHS - 1, []) if run == "b" else [])
    say(
        f"    epoch {EPOCHS - 1}: {sum(model.values())} samples in the model the job resumed "
        f"from + {sum(after.values())} trained after the relaunch = {params.total_samples}"
    )
    checks.append((f"epoch {EPOCHS - 1}: each sample trained exactly once relative to the "
                   "checkpoint the job resumed from", model + after == everything))  # fmt: skip
    return checks


def _checkpoints(job: Job, path: str) -> list[tuple[str, bool]]:
    say("\n  checkpoints (keep_count=3):")
    with CheckpointManager(path, job_id=job.job_id, redis=job, worker_id="demo-reader") as ckpt:
        kept = ckpt.list()
        for info in kept:
            say(f"    epoch {info.epoch}, step {info.step:>3} (run {info.run}, {info.label}): "
                f"{info.world_size} ranks, "
                f"{info.nbytes / 1024:.0f} KiB, verified")  # fmt: skip
        latest = ckpt.latest()
        loaded = ckpt.load_checkpoint(rank=0) if latest else None
    return [
        ("the newest checkpoint loads and verifies",
         loaded is not None and latest is not None and loaded.info.step == latest.step),
    ]  # fmt: skip


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_demo())

"""One fault run: a Redis primary and replica behind proxies and a Sentinel watching them,
worker processes (reaching Redis through a virtual IP, or through Sentinel: drawn from the
seed) draining a dataset's epochs (the raw lease API, or the README's loop with
checkpoints), a schedule of faults played against them, then the history, the record and
the checkpoints checked (``checker``). A loop run whose job ended with a
``StateLostError``-family error then plays the documented recovery (``strata jobs rm``, the
dataset registered again, every worker relaunched: it resumes from the newest checkpoint)
and checks that too."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import redis

import strata_redis
from strata_redis.checkpoint.manifest import CheckpointInfo
from strata_redis.data.position import POSITION_PART, decode_positions
from strata_redis.data.record import keep_whole
from strata_redis.errors import DatasetNotFoundError
from strata_redis.keys import Keys
from strata_redis.status import GUARDS, GUARDS_ENV
from strata_redis.storage import Storage

from .checker import Report, check, check_loop
from .history import History, read_history
from .proxy import Proxy
from .schedule import CHECKPOINTED, WORKLOADS, Fault, draw
from .stand_in import S3StandIn, available
from .topology import SERVICE, Topology
from .worker import DATASET, STOPPED

__all__ = ["CLIENTS", "STORAGES", "Outcome", "RunConfig", "check_guards", "run"]

JOB = "chaos"
#: how the workers reach the primary: ``vip`` a proxy that a failover points at the new
#: primary (a virtual IP), ``sentinel`` a ``redis+sentinel://`` URL (the client asks the
#: Sentinel where the primary is whenever it connects)
CLIENTS = ("vip", "sentinel")
#: where the loop's checkpoints go: a local directory, or the S3 stand-in (moto's server)
STORAGES = ("local", "s3")


@dataclass
class RunConfig:
    """A run's knobs (the defaults make a run of about ``duration`` + 15 s)."""

    seed: int = 0
    duration: float = 20.0
    workers: int = 3
    epochs: int = 2
    samples_per_shard: int = 5
    sample_s: float = 0.02
    heartbeat_timeout: float = 3.0
    lease_ttl: float = 3.0
    redis_retry: float = 15.0
    workload: str = "leases"  # schedule.WORKLOADS: the raw lease API, the README loop, torch
    aof: str | None = None  # Redis' appendfsync: "always", "everysec" (None: from the seed)
    clients: str | None = None  # CLIENTS: how workers reach Redis (None: from the seed)
    storage: str | None = None  # STORAGES: the loop's checkpoints (None: from the seed)
    save_every: int = 8  # the loop's steps between checkpoint saves
    kinds: list[str] | None = None
    faults: int = 0
    schedule: list[Fault] | None = None  # play these faults instead of drawing them
    disable: str = ""  # guards switched off in the workers (status.GUARDS_ENV)
    keep: Path | None = None  # keep the history here


@dataclass
class Outcome:
    """A run's faults, report and history folder."""

    config: RunConfig
    faults: list[Fault]
    report: Report
    played: Counter[str] = field(default_factory=Counter)

    def lines(self) -> list[str]:
        r = self.report
        out = [f"violation (seed {self.config.seed}): {v}" for v in r.violations]
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.played.items())) or "none"
        ended = ", ".join(f"{e} {n}" for e, n in sorted(r.stopped.items()))
        out.append(
            f"seed {self.config.seed} ({self.config.workload}, appendfsync "
            f"{self.config.aof}, clients via {self.config.clients}"
            f"{f', storage {self.config.storage}' if self.config.workload in CHECKPOINTED else ''}"
            f"): faults {kinds}; "
            f"operations {r.operations} ({r.summary()}); "
            f"{f'stopped with {ended}; ' if ended else ''}"
            f"{'recovered from the newest checkpoint; ' if r.recovered else ''}"
            f"violations {len(r.violations)}"
        )
        return out


class _Workers:
    """The worker processes, each slot behind a proxy of its own (to cut one worker off): in
    front of the clients' proxy (``vip``), or of the Sentinel (``sentinel``: the worker then
    talks to the primary directly, where the Sentinel says it is)."""

    def __init__(self, topo: Topology, cfg: RunConfig, folder: Path, s3: S3StandIn | None) -> None:
        self.cfg, self.folder, self.s3 = cfg, folder, s3
        upstream = topo.sentinel.port if cfg.clients == "sentinel" else topo.clients.port
        self.proxies = [Proxy(("127.0.0.1", upstream)) for _ in range(cfg.workers)]
        self.scheme = "redis+sentinel" if cfg.clients == "sentinel" else "redis"
        self.path = f"{SERVICE}/0" if cfg.clients == "sentinel" else "0"
        self.ids = [f"w{i}" for i in range(cfg.workers)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}  # "<id>#<n>" -> process
        self.current: list[str] = [""] * cfg.workers
        self.phase = ""  # "" the run, "b-" the relaunch after a recovery (history files)
        self._judged: set[str] = set()  # stopped processes relaunch_restarted looked at
        self._n = itertools.count()
        self.start()

    def start(self) -> None:
        """Launch a process in every slot."""
        for slot in range(self.cfg.workers):
            self.launch(slot)

    def launch(self, slot: int, new_id: bool = False) -> None:
        if new_id:
            self.ids[slot] = f"w{slot}-{next(self._n)}"
        wid = self.ids[slot]
        env = dict(os.environ)
        if self.s3 is not None:
            env.update(self.s3.env)
        if self.cfg.disable:
            env[GUARDS_ENV] = self.cfg.disable
        cfg = self.cfg
        cmd = [
            sys.executable, "-m", f"strata_redis.chaos.{WORKLOADS[cfg.workload]}",
            "--url", f"{self.scheme}://{self.proxies[slot].address}/{self.path}",
            "--job", JOB, "--id", wid,
            "--history", str(self.folder / f"{self.phase}{wid}.jsonl"),
            "--epochs", str(cfg.epochs), "--sample-s", str(cfg.sample_s),
            "--heartbeat-timeout", str(cfg.heartbeat_timeout),
            "--lease-ttl", str(cfg.lease_ttl), "--redis-retry", str(cfg.redis_retry),
        ]  # fmt: skip
        if cfg.workload in CHECKPOINTED:
            ckpt = self.s3.url if self.s3 is not None else str(self.folder / "ckpt")
            cmd += ["--ckpt", ckpt, "--save-every", str(cfg.save_every)]
        key = f"{self.phase}{wid}#{next(self._n)}"
        log = open(self.folder / f"{wid}.log", "ab")  # noqa: SIM115
        self.procs[key] = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
        log.close()
        self.current[slot] = key

    def proc(self, slot: int) -> subprocess.Popen[bytes]:
        return self.procs[self.current[slot]]

    def relaunch_restarted(self) -> None:
        """Relaunch, under its id, a slot's process that stopped with
        ``RoundRestartedError`` (its round was fresh: no member held the job's state): the
        documented recovery, a supervisor's restart; relaunched, it resumes."""
        ended = [slot for slot in range(self.cfg.workers) if self.current[slot] not in
                 self._judged and self.proc(slot).poll() == STOPPED]  # fmt: skip
        if not ended:
            return
        restarted = {(e["who"], e["pid"]) for e in read_history(self.folder)
                     if e["ev"] == "stopped" and e["error"] == "RoundRestartedError"}  # fmt: skip
        for slot in ended:
            self._judged.add(self.current[slot])  # (its history is read once)
            if (self.ids[slot], self.proc(slot).pid) in restarted:
                self.launch(slot)

    def live(self) -> list[subprocess.Popen[bytes]]:
        """The current process of every slot that is still running."""
        return [p for p in (self.proc(slot) for slot in range(self.cfg.workers))
                if p.poll() is None]  # fmt: skip

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs.values())

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait(10)
        for proxy in self.proxies:
            proxy.close()


def _keys_named(keys: Keys, name: str, epochs: int) -> list[str]:
    """The keys a ``del-key`` fault deletes (``schedule.DELETABLE``)."""
    if not name.startswith("lease."):
        return [str(getattr(keys, name))]
    what = name.removeprefix("lease.")
    out = []
    for epoch in range(epochs):
        lease_keys = keys.lease_keys(DATASET, epoch)
        out.append(lease_keys.record(0) if what == "record" else getattr(lease_keys, what))
    return out


def _kill(workers: _Workers, slot: int) -> bool:
    """kill -9 the slot's process; whether it was running."""
    proc = workers.proc(slot)
    if proc.poll() is not None:
        return False
    proc.kill()
    proc.wait(10)
    return True


def _cut_direct(topo: Topology, proc: subprocess.Popen[bytes], hold: float) -> None:
    """Cut a worker that reaches Redis through Sentinel (its proxy to the Sentinel is cut
    already): for ``hold`` seconds, close every connection it has to the primary (its
    client asks the Sentinel before it connects again, and cannot reach it)."""
    import psutil  # type: ignore[import-untyped]  # a dev dependency, as the fault run is

    deadline = time.monotonic() + hold
    while time.monotonic() < deadline:
        try:
            conns = psutil.Process(proc.pid).net_connections(kind="tcp")
        except psutil.Error:
            return  # it ended
        addrs = [f"{c.laddr.ip}:{c.laddr.port}" for c in conns
                 if c.raddr and c.raddr.port == topo.primary.port]  # fmt: skip
        with contextlib.suppress(redis.RedisError), redis.Redis(port=topo.primary.port) as r:
            for addr in addrs:
                r.execute_command("CLIENT", "KILL", "ADDR", addr)
        time.sleep(0.05)


def _play(fault: Fault, topo: Topology, workers: _Workers, folder: Path) -> None:
    """Play one fault (blocking for as long as it lasts)."""
    proc = workers.proc(fault.slot)
    hold = float(fault.params.get("hold", 0))
    epochs = workers.cfg.epochs
    if fault.kind in ("kill", "kill-new-id"):
        if _kill(workers, fault.slot):
            time.sleep(0.2)
            workers.launch(fault.slot, new_id=fault.kind == "kill-new-id")
    elif fault.kind == "node-loss":
        # a node of several ranks lost at once (the world shrinks), relaunched after a while
        # (it grows again)
        n = workers.cfg.workers
        slots = [(fault.slot + i) % n for i in range(max(1, min(n - 1, n // 2 + 1)))]
        killed = [slot for slot in slots if _kill(workers, slot)]
        time.sleep(hold)
        for slot in killed:
            workers.launch(slot)
    elif fault.kind in ("stop", "pause"):
        if proc.poll() is None:
            proc.send_signal(signal.SIGSTOP)
            time.sleep(hold)
            proc.send_signal(signal.SIGCONT)
    elif fault.kind == "cut":
        workers.proxies[fault.slot].cut()
        if workers.cfg.clients == "sentinel":
            _cut_direct(topo, proc, hold)
        else:
            time.sleep(hold)
        workers.proxies[fault.slot].cut(False)
    elif fault.kind == "stall" and workers.cfg.clients == "sentinel":
        # the workers talk to the primary directly: it holds every client's commands back
        with redis.Redis(port=topo.primary.port) as client:
            client.execute_command("CLIENT", "PAUSE", int(hold * 1000), "ALL")
        time.sleep(hold)
    elif fault.kind == "stall":
        topo.clients.stall()
        time.sleep(hold)
        topo.clients.stall(False)
    elif fault.kind == "cut-replica":
        assert topo.link is not None
        topo.link.cut()
        time.sleep(hold)
        topo.link.cut(False)
    elif fault.kind == "restart-aof":
        topo.restart()
    elif fault.kind == "restart-empty":
        topo.restart(wipe=True)
    elif fault.kind == "restart-rdb":
        topo.snapshot(folder / "older.rdb")
        time.sleep(float(fault.params["age"]))
        topo.restart(snapshot=folder / "older.rdb")
    elif fault.kind == "failover":
        topo.synced()
        topo.lag()
        time.sleep(float(fault.params["lag"]))
        topo.failover()
    elif fault.kind == "sentinel-failover":
        topo.synced()
        topo.lag()
        time.sleep(float(fault.params["lag"]))
        topo.sentinel_failover()
    elif fault.kind == "masked-failover":
        # only the target makes calls while the replica lags (the others are stopped), then
        # it stops; after the failover the others, which saw none of the lost ticks, raise
        # the clock back past its mark; then it runs again: a height check alone passes it
        others = [p for p in workers.live() if p is not proc]
        topo.synced()
        for other in others:
            other.send_signal(signal.SIGSTOP)
        topo.lag()
        time.sleep(float(fault.params["lag"]))
        if proc.poll() is None:
            proc.send_signal(signal.SIGSTOP)
        if fault.params.get("by") == "sentinel":
            topo.sentinel_failover()
        else:
            topo.failover()
        for other in others:
            other.send_signal(signal.SIGCONT)
        time.sleep(hold)
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
    elif fault.kind == "memory-full":
        topo.config(maxmemory=str(topo.used_memory()))  # noeviction: every write refused
        time.sleep(hold)
        topo.config(maxmemory="0")
    elif fault.kind == "evicting-policy":
        topo.config(maxmemory="1gb", maxmemory_policy="allkeys-lru")
    elif fault.kind in ("storage-fail", "storage-stall") and workers.s3 is not None:
        # the S3 stand-in's link cut (every request refused), or stalled from inside the
        # first request after now (a save is under way: one every few batches)
        link = workers.s3.proxy
        assert link is not None
        if fault.kind == "storage-fail":
            link.cut()
        else:
            link.stall_next()
            deadline = time.monotonic() + 10
            while not link.stalled and time.monotonic() < deadline:
                time.sleep(0.005)
        time.sleep(hold)
        link.cut(False)
        link.stall(False)
    elif fault.kind == "storage-stall":  # pragma: no cover - run() puts it on S3
        raise ValueError("storage-stall needs the S3 stand-in")
    elif fault.kind == "storage-fail":
        # the checkpoint directory replaced by a file: every write under it fails, then it
        # comes back as it was
        ckpt = folder / "ckpt"
        ckpt.rename(folder / "ckpt.away")
        ckpt.write_bytes(b"")
        time.sleep(hold)
        ckpt.unlink()
        (folder / "ckpt.away").rename(ckpt)
    elif fault.kind == "del-key":
        with strata_redis.connect(topo.url, JOB) as job:  # the keys as the schema names them
            job.client.delete(*_keys_named(job.keys, fault.params["key"], epochs))
    else:  # pragma: no cover - draw() refuses unknown kinds
        raise ValueError(f"no such fault kind {fault.kind!r}")


def _record(url: str, cfg: RunConfig) -> dict[int, dict[int, tuple[str, int]]] | None:
    """The completion record of every epoch, as Redis holds it (None: the state is lost)."""
    try:
        with strata_redis.connect(url, JOB) as job:
            return {e: job.leases(DATASET, e, "reader").completions() for e in range(cfg.epochs)}
    except (strata_redis.StateLostError, DatasetNotFoundError):
        return None  # lost, or Redis came back empty (the dataset is not there either)


def _register(url: str, cfg: RunConfig, shards: int) -> strata_redis.DatasetParams:
    """Register the run's dataset (the launcher's line), every epoch's record kept whole."""
    with strata_redis.connect(url, JOB) as job:
        params = strata_redis.ShardManager(job).register_dataset_params(
            DATASET, shards * cfg.samples_per_shard, cfg.samples_per_shard, True, cfg.seed
        )
        keep_whole(job.context, DATASET, cfg.epochs)  # every epoch's record, for the check
    return params


def _checkpoints(url: str, folder: Path, s3: S3StandIn | None) -> tuple[set[str], list[str]]:
    """Verify every committed checkpoint of the run (each file's size and checksum) and
    decode every rank's data position; their labels, and the failures. Storage holds the
    truth: the Redis index (a cache of it, which a ``del-key`` may have emptied) is rebuilt
    from it first."""
    if s3 is not None:
        with s3.credentials():
            return _verify(url, s3.storage())
    return _verify(url, folder / "ckpt")


def _verify(url: str, storage: Storage | Path) -> tuple[set[str], list[str]]:
    manager = strata_redis.CheckpointManager(storage, job_id=JOB, redis=url)

    def one(info: CheckpointInfo) -> str | None:
        try:
            manager.verify(info.step, epoch=info.epoch, run=info.run)
            for rank in range(info.world_size):
                raw = manager.load(info.step, POSITION_PART, rank, epoch=info.epoch,
                                   run=info.run)  # fmt: skip
                decode_positions(raw)
        except (strata_redis.StrataError, ValueError) as exc:
            return f"{info.label}: {type(exc).__name__}: {exc}"
        return None

    try:
        manager.rebuild_index()
        infos = manager.list()
        # a few at once: the S3 stand-in takes tens of ms a request
        with ThreadPoolExecutor(4) as pool:
            failures = [f for f in pool.map(one, infos) if f is not None]
    finally:
        manager.close()
    return {info.label for info in infos}, failures


def _recover(url: str) -> None:
    """The documented recovery after a lost or rolled-back state: delete the job's state in
    Redis (its checkpoints in storage are kept; a Redis that came back empty has none)."""
    done = subprocess.run(
        [sys.executable, "-m", "strata_redis", "jobs", "rm", JOB, "--yes", "--force",
         "--redis-url", url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if done.returncode and "nothing to delete" not in done.stderr:
        raise RuntimeError(f"strata jobs rm exited {done.returncode}: {done.stderr}")


def check_guards(disable: str) -> None:
    """Raise ``ValueError`` for a name in ``disable`` that is no guard (the workers would
    each crash on it, which the checker reports as violations)."""
    for name in (part.strip() for part in disable.split(",")):
        if name and name not in GUARDS:
            raise ValueError(f"no such guard {name!r} (guards: {', '.join(GUARDS)})")


def _started(workers: _Workers, folder: Path, timeout: float = 60.0) -> None:
    """Wait until every worker process is up (its ``start`` event: its imports done), at
    most ``timeout``: the schedule's times count from there, so a loaded machine's slow
    start does not move the faults into the workers' start-up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and workers.running():
        up = {e["who"] for e in read_history(folder) if e["ev"] == "start"}
        if up >= set(workers.ids):
            return
        time.sleep(0.05)


def _wait(workers: _Workers, seconds: float, folder: Path, stall: float | None = None) -> None:
    """Wait for every process to end, at most ``seconds`` (one that stopped with
    ``RoundRestartedError`` is relaunched meanwhile, as its supervisor would); with
    ``stall``, also stop waiting once no process has written to the history for that long
    (the run is stuck)."""
    start = time.monotonic()
    seen, moved = -1, start
    while time.monotonic() < start + seconds:
        workers.relaunch_restarted()
        if not workers.running():
            return
        if stall is not None:
            size = sum(f.stat().st_size for f in folder.glob("*.jsonl"))
            if size != seen:
                seen, moved = size, time.monotonic()
            elif time.monotonic() - moved > stall:
                return
        time.sleep(0.2)


def run(cfg: RunConfig, progress: bool = False) -> Outcome:
    """Play one seed's schedule against real processes and check the history."""
    check_guards(cfg.disable)
    if cfg.workload not in WORKLOADS:
        raise ValueError(f"no such workload {cfg.workload!r} (workloads: {', '.join(WORKLOADS)})")
    if cfg.aof is None:
        cfg.aof = random.Random(f"aof-{cfg.seed}").choice(["always", "everysec"])
    if cfg.clients is None:
        cfg.clients = random.Random(f"clients-{cfg.seed}").choice(CLIENTS)
    if cfg.clients not in CLIENTS:
        raise ValueError(f"no such clients {cfg.clients!r} (clients: {', '.join(CLIENTS)})")
    faults = cfg.schedule or draw(
        cfg.seed, cfg.duration, cfg.workers, cfg.kinds, cfg.faults, cfg.workload
    )
    if cfg.storage is None:
        # a local directory cannot stall: a schedule that stalls storage writes to S3
        stalls = any(f.kind == "storage-stall" for f in faults)
        drawn = random.Random(f"storage-{cfg.seed}").choice(STORAGES)
        cfg.storage = "s3" if stalls or (drawn == "s3" and available()) else "local"
    if cfg.storage not in STORAGES:
        raise ValueError(f"no such storage {cfg.storage!r} (storages: {', '.join(STORAGES)})")
    # the dataset: enough work for the run's duration with every worker busy
    per_shard = cfg.samples_per_shard * cfg.sample_s
    shards = max(cfg.workers * 2, int(cfg.duration * cfg.workers / per_shard / cfg.epochs))
    played: Counter[str] = Counter()
    with contextlib.ExitStack() as stack:
        folder = cfg.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="strata-chaos-")))  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "ckpt").mkdir(exist_ok=True)
        s3 = None
        if cfg.workload in CHECKPOINTED and cfg.storage == "s3":
            s3 = stack.enter_context(S3StandIn())  # (it imports while Redis starts)
        topo = stack.enter_context(Topology(aof=cfg.aof))
        if s3 is not None:
            s3.start()
        params = _register(topo.url, cfg, shards)
        controller = History(folder / "controller.jsonl", "controller")
        workers = _Workers(topo, cfg, folder, s3)
        recovered = False
        try:
            _started(workers, folder)
            start = time.monotonic()
            for fault in faults:
                while time.monotonic() < start + fault.at:
                    workers.relaunch_restarted()
                    time.sleep(min(0.2, max(0.0, start + fault.at - time.monotonic())))
                if not workers.running():
                    break
                if progress:
                    print(f"  seed {cfg.seed}: {fault.describe()}", flush=True)
                controller.add("fault", kind=fault.kind, slot=fault.slot, **fault.params)
                _play(fault, topo, workers, folder)
                played[fault.kind] += 1
            # every process ends: finished, or stopped by a named error, within the budget
            _wait(workers, cfg.duration + 4 * cfg.redis_retry, folder)
            topo.config(maxmemory="0", maxmemory_policy="noeviction")  # as the operator would
            exits = {k: p.poll() for k, p in workers.procs.items()}
            events = read_history(folder)
            lost = any(e["ev"] == "stopped" and e.get("family") == "state-lost" for e in events)
            if cfg.workload in CHECKPOINTED and lost and not any(v is None for v in exits.values()):
                # the documented recovery: the job's state removed, the launcher's line run
                # again, every worker relaunched (it resumes from the newest checkpoint)
                if progress:
                    print(f"  seed {cfg.seed}: recovery (jobs rm, relaunch)", flush=True)
                controller.add("recovery")
                _recover(topo.url)
                _register(topo.url, cfg, shards)
                workers.phase = "b-"
                workers.start()
                recovered = True
                # a round grows at an epoch boundary only: the first to resume may train the
                # rest of an epoch alone while the others wait to be admitted. So the wait is
                # for as long as one worker needs for all the work, unless nothing moves
                alone = shards * per_shard * cfg.epochs
                _wait(workers, alone + 4 * cfg.redis_retry, folder, stall=4 * cfg.redis_retry)
                exits = {k: p.poll() for k, p in workers.procs.items()}
            # what runs on past its wait is a hang: stopped before storage and histories are
            # read, so they are one snapshot (a save finishing later is not judged missing)
            workers.close()
            if cfg.workload in CHECKPOINTED:
                checkpoints = _checkpoints(topo.url, folder, s3)
            else:
                record = _record(topo.url, cfg)
        finally:
            workers.close()
            controller.close()
        events = read_history(folder)
        if cfg.workload in CHECKPOINTED:
            report = check_loop(events, params, cfg.epochs, exits, checkpoints, recovered)
        else:
            report = check(events, record, shards, cfg.epochs, exits)
    return Outcome(cfg, faults, report, played)

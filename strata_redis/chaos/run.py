"""One fault run: a Redis primary and replica behind proxies, worker processes draining a
dataset's epochs through the lease API, a schedule of faults played against them, then the
history and the record checked (``checker.check``)."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import strata_redis
from strata_redis.data.leases import keep_whole
from strata_redis.keys import Keys
from strata_redis.status import GUARDS, GUARDS_ENV

from .checker import Report, check
from .history import History, read_history
from .proxy import Proxy
from .schedule import Fault, draw
from .topology import Topology

__all__ = ["Outcome", "RunConfig", "check_guards", "run"]

JOB = "chaos"


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
        out.append(
            f"seed {self.config.seed}: faults {kinds}; operations {r.operations} (grants "
            f"{r.grants}, completions {r.completions}); "
            f"{'ended with StateLostError; ' if r.lost else ''}violations {len(r.violations)}"
        )
        return out


class _Workers:
    """The worker processes, each slot behind a proxy of its own (to cut one worker off)."""

    def __init__(self, topo: Topology, cfg: RunConfig, folder: Path) -> None:
        self.cfg, self.folder = cfg, folder
        self.proxies = [Proxy(("127.0.0.1", topo.clients.port)) for _ in range(cfg.workers)]
        self.ids = [f"w{i}" for i in range(cfg.workers)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}  # "<id>#<n>" -> process
        self.current: list[str] = [""] * cfg.workers
        self._n = itertools.count()
        for slot in range(cfg.workers):
            self.launch(slot)

    def launch(self, slot: int, new_id: bool = False) -> None:
        if new_id:
            self.ids[slot] = f"w{slot}-{next(self._n)}"
        wid = self.ids[slot]
        env = dict(os.environ)
        if self.cfg.disable:
            env[GUARDS_ENV] = self.cfg.disable
        cmd = [
            sys.executable, "-m", "strata_redis.chaos.worker",
            "--url", f"redis://{self.proxies[slot].address}/0", "--job", JOB, "--id", wid,
            "--history", str(self.folder / f"{wid}.jsonl"), "--epochs", str(self.cfg.epochs),
            "--sample-s", str(self.cfg.sample_s),
            "--heartbeat-timeout", str(self.cfg.heartbeat_timeout),
            "--lease-ttl", str(self.cfg.lease_ttl), "--redis-retry", str(self.cfg.redis_retry),
        ]  # fmt: skip
        key = f"{wid}#{next(self._n)}"
        log = open(self.folder / f"{wid}.log", "ab")  # noqa: SIM115
        self.procs[key] = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
        log.close()
        self.current[slot] = key

    def proc(self, slot: int) -> subprocess.Popen[bytes]:
        return self.procs[self.current[slot]]

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
        lease_keys = keys.lease_keys("ds", epoch)
        out.append(lease_keys.record(0) if what == "record" else getattr(lease_keys, what))
    return out


def _play(fault: Fault, topo: Topology, workers: _Workers, epochs: int) -> None:
    """Play one fault (blocking for as long as it lasts)."""
    proc = workers.proc(fault.slot)
    hold = float(fault.params.get("hold", 0))
    if fault.kind in ("kill", "kill-new-id"):
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
            time.sleep(0.2)
            workers.launch(fault.slot, new_id=fault.kind == "kill-new-id")
    elif fault.kind in ("stop", "pause"):
        if proc.poll() is None:
            proc.send_signal(signal.SIGSTOP)
            time.sleep(hold)
            proc.send_signal(signal.SIGCONT)
    elif fault.kind == "cut":
        workers.proxies[fault.slot].cut()
        time.sleep(hold)
        workers.proxies[fault.slot].cut(False)
    elif fault.kind == "stall":
        topo.clients.stall()
        time.sleep(hold)
        topo.clients.stall(False)
    elif fault.kind == "restart-aof":
        topo.restart()
    elif fault.kind == "failover":
        topo.synced()
        topo.lag()
        time.sleep(float(fault.params["lag"]))
        topo.failover()
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
        topo.failover()
        for other in others:
            other.send_signal(signal.SIGCONT)
        time.sleep(hold)
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
    elif fault.kind == "del-key":
        with strata_redis.connect(topo.url, JOB) as job:  # the keys as the schema names them
            job.client.delete(*_keys_named(job.keys, fault.params["key"], epochs))


def _record(url: str, cfg: RunConfig) -> dict[int, dict[int, tuple[str, int]]] | None:
    """The completion record of every epoch, as Redis holds it (None: the state is lost)."""
    try:
        with strata_redis.connect(url, JOB) as job:
            return {e: job.leases("ds", e, "reader").completions() for e in range(cfg.epochs)}
    except strata_redis.StateLostError:
        return None


def check_guards(disable: str) -> None:
    """Raise ``ValueError`` for a name in ``disable`` that is no guard (the workers would
    each crash on it, which the checker reports as violations)."""
    for name in (part.strip() for part in disable.split(",")):
        if name and name not in GUARDS:
            raise ValueError(f"no such guard {name!r} (guards: {', '.join(GUARDS)})")


def run(cfg: RunConfig, progress: bool = False) -> Outcome:
    """Play one seed's schedule against real processes and check the history."""
    check_guards(cfg.disable)
    faults = cfg.schedule or draw(cfg.seed, cfg.duration, cfg.workers, cfg.kinds, cfg.faults)
    # the dataset: enough work for the run's duration with every worker busy
    per_shard = cfg.samples_per_shard * cfg.sample_s
    shards = max(cfg.workers * 2, int(cfg.duration * cfg.workers / per_shard / cfg.epochs))
    played: Counter[str] = Counter()
    with contextlib.ExitStack() as stack:
        folder = cfg.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="strata-chaos-")))  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        topo = stack.enter_context(Topology(aof="always"))
        with strata_redis.connect(topo.url, JOB) as job:
            strata_redis.ShardManager(job).register_dataset_params(
                "ds", shards * cfg.samples_per_shard, cfg.samples_per_shard, True, cfg.seed
            )
            keep_whole(job.context, "ds", cfg.epochs)  # every epoch's record, for the check
        controller = History(folder / "controller.jsonl", "controller")
        workers = _Workers(topo, cfg, folder)
        start = time.monotonic()
        try:
            for fault in faults:
                time.sleep(max(0.0, start + fault.at - time.monotonic()))
                if not workers.running():
                    break
                if progress:
                    print(f"  seed {cfg.seed}: {fault.describe()}", flush=True)
                controller.add("fault", kind=fault.kind, slot=fault.slot, **fault.params)
                _play(fault, topo, workers, cfg.epochs)
                played[fault.kind] += 1
            # every process ends: finished, or stopped by a named error, within the budget
            deadline = time.monotonic() + cfg.duration + 4 * cfg.redis_retry
            while workers.running() and time.monotonic() < deadline:
                time.sleep(0.2)
            exits = {k: p.poll() for k, p in workers.procs.items()}
            record = _record(topo.url, cfg)
        finally:
            workers.close()
            controller.close()
        report = check(read_history(folder), record, shards, cfg.epochs, exits)
    return Outcome(cfg, faults, report, played)

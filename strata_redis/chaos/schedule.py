"""Fault schedules drawn from a seed: which fault, when, against which worker, for how long."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CHECKPOINTED", "DELETABLE", "KINDS", "LOOP_ONLY", "WORKLOADS", "Fault", "draw"]

#: the workloads a run can drive, and the worker module of each: the raw lease API, the
#: README loop, PyTorch's guide loop (``LeaseBatchSampler``, ``strata_redis.torch.save``)
WORKLOADS: dict[str, str] = {"leases": "worker", "loop": "loop_worker", "torch": "torch_worker"}
#: the workloads that save checkpoints (and are checked against the one kept)
CHECKPOINTED = frozenset({"loop", "torch"})

#: every kind of fault the run can play, and what it does
KINDS: dict[str, str] = {
    "kill": "kill -9 a worker, relaunch it under the same id",
    "kill-new-id": "kill -9 a worker, relaunch it under a new id",
    "node-loss": "kill -9 more than half the workers at once (the world shrinks), relaunch "
    "them a few seconds later (it grows again)",
    "stop": "SIGSTOP a worker past its lease ttl and heartbeat timeout, then SIGCONT it",
    "pause": "SIGSTOP a worker for less than its heartbeat timeout",
    "cut": "cut one worker's link to Redis for a while (shorter than redis_retry)",
    "stall": "stall every client's link to Redis for a while (shorter than redis_retry)",
    "cut-replica": "cut Redis from its replica for a while (it resyncs after)",
    "restart-aof": "kill -9 Redis and start it again from its AOF (appendfsync always or "
    "everysec, drawn for the run: everysec may lose the last second)",
    "restart-empty": "kill -9 Redis and start it with nothing (no persistence)",
    "restart-rdb": "snapshot Redis (RDB), let the job run a few seconds, kill -9 Redis and "
    "start it from that older snapshot",
    "memory-full": "set maxmemory to what Redis uses (noeviction: every write refused) for "
    "a while (shorter than redis_retry), then lift it",
    "evicting-policy": "switch Redis to an evicting maxmemory-policy (allkeys-lru) for good",
    "storage-fail": "fail every checkpoint write for a while (the loop workload only: a local "
    "directory replaced by a file; the S3 stand-in's link cut)",
    "storage-stall": "stall the S3 stand-in's link for a while, from the moment a checkpoint "
    "save starts (the loop workload only; its checkpoints go to S3 then)",
    "failover": "fail over to a replica that lagged (the replication link stalled first), "
    "by hand: the clients' proxy switched (a virtual IP), the Sentinel told",
    "sentinel-failover": "kill -9 the primary while the replica lags (the replication link "
    "stalled first) and let the Sentinel promote it; the clients reach it through Sentinel "
    "or through the virtual IP moved where Sentinel says",
    "masked-failover": "stop a worker, fail over to a replica that lagged while it made "
    "calls (by hand, or by the Sentinel: drawn), let the others run, then let it run again "
    "(the masked rollback)",
    "del-key": "delete one key of the job's state (an operator's DEL, an eviction): an anchor, "
    "a key of the worker registry, or one structure of every epoch's leases",
}

#: the keys a ``del-key`` fault may delete: the job's (``Keys``' names), and ``lease.<name>``
#: for that structure of every epoch of the run (``LeaseKeys``' names; ``record``: segment 0)
DELETABLE = (
    "fence", "generation", "epoch", "era", "clock", "history", "datasets",
    "heartbeats", "status", "incarnation", "info", "rendezvous", "checkpoints",
    "lease.meta", "lease.taken", "lease.done", "lease.holders", "lease.expiry",
    "lease.record", "lease.workers",
)  # fmt: skip


#: the kinds that may end a run (a StateLostError: the state went back or lost an anchor;
#: a RedisConfigError: an evicting policy): a schedule plays them after the others, so
#: those are played too
TERMINAL = frozenset({
    "failover", "sentinel-failover", "masked-failover", "del-key", "restart-empty",
    "restart-rdb", "evicting-policy",
})  # fmt: skip
#: the kinds only the checkpointed workloads have something for
LOOP_ONLY = frozenset({"storage-fail", "storage-stall"})


@dataclass(frozen=True)
class Fault:
    """One fault: its kind, when (seconds from the start), the worker slot it targets, and
    its parameters (``hold``: how long it lasts; ``lag``: replication lag, s; ``key``)."""

    kind: str
    at: float
    slot: int = 0
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.at:5.1f}s {self.kind} slot={self.slot} {extra}".rstrip()


def draw(
    seed: int,
    duration: float,
    workers: int,
    kinds: list[str] | None = None,
    count: int = 0,
    workload: str = "leases",
) -> list[Fault]:
    """A schedule for ``seed``: ``count`` faults (default: one per 6 s of ``duration``, at
    least 2) of ``kinds`` (default: all the workload has something for), spread over the
    run's first ``duration`` seconds.

    Raises:
        ValueError: an unknown kind, or one the workload has nothing for.
    """
    pool = list(kinds or [k for k in KINDS if workload in CHECKPOINTED or k not in LOOP_ONLY])
    for kind in pool:
        if kind not in KINDS:
            raise ValueError(f"no such fault kind {kind!r} (kinds: {', '.join(KINDS)})")
        if kind in LOOP_ONLY and workload not in CHECKPOINTED:
            raise ValueError(f"fault kind {kind!r} needs --workload loop or torch")
    rng = random.Random(seed)
    n = count or max(2, int(duration // 6))
    kinds_drawn = sorted((rng.choice(pool) for _ in range(n)), key=lambda k: k in TERMINAL)
    if "evicting-policy" in kinds_drawn:
        # it stops every process with RedisConfigError, not a loss: a fault after it (a
        # failover that loses writes only stopped processes saw) is the documented limit of
        # detection, not a check
        kinds_drawn = kinds_drawn[: kinds_drawn.index("evicting-policy") + 1]
    faults = []
    for i, kind in enumerate(kinds_drawn):
        # one fault per slice of the run, at a random moment inside it (faults don't overlap)
        at = duration * (i + rng.uniform(0.2, 0.8)) / n
        params: dict[str, Any] = {}
        if kind in ("stop",):
            params["hold"] = round(rng.uniform(5.0, 7.0), 2)
        elif kind == "pause":
            params["hold"] = round(rng.uniform(0.3, 1.2), 2)
        elif kind in ("cut", "stall", "memory-full"):
            params["hold"] = round(rng.uniform(0.3, 2.0), 2)
        elif kind in ("cut-replica", "node-loss", "storage-fail", "storage-stall"):
            params["hold"] = round(rng.uniform(1.0, 4.0), 2)
        elif kind == "restart-rdb":
            params["age"] = round(rng.uniform(0.5, 3.0), 2)
        elif kind in ("failover", "sentinel-failover"):
            params["lag"] = round(rng.uniform(0.005, 0.5), 3)
        elif kind == "masked-failover":
            params["lag"] = round(rng.uniform(0.3, 0.8), 3)
            params["hold"] = round(rng.uniform(1.0, 2.0), 2)
            # (from a generator of its own: the draws after it stay what they were)
            params["by"] = random.Random(f"by-{seed}-{i}").choice(["hand", "sentinel"])
        elif kind == "del-key":
            params["key"] = rng.choice(DELETABLE)
        faults.append(Fault(kind, round(at, 2), rng.randrange(workers), params))
    return faults

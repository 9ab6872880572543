"""A job: one training run's coordination state in Redis, and the handle every part hangs off."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson
import redis

from .connection import describe, make_client
from .errors import StrataError
from .keys import PREFIX, Keys
from .scripts import Call, Scripts, check
from .validate import check_id, check_int, check_seconds
from .workers import Worker, WorkerInfo

if TYPE_CHECKING:
    from .barrier import Barrier
    from .latency import BarrierLatency
    from .leases import ShardLeases

JOB_ENV = "STRATA_JOB_ID"
DEFAULT_JOB = "default"
REAP_BATCH = 1000


class Job:
    """The coordination state of one job (training run) in one Redis.

    Args:
        redis: a Redis URL (``redis://``, ``rediss://``, ``unix://``), ``host:port``, a
            ``redis.Redis``, or another ``Job`` (its client is shared). Default:
            ``$STRATA_REDIS_URL`` or ``redis://localhost:6379/0``.
        job_id: the job's id. Default: ``$STRATA_JOB_ID`` or ``"default"``.
        heartbeat_timeout: seconds without a heartbeat after which the reaper declares a
            worker failed. Every process of a job should use the same value.
        events_cap: approximate length at which the membership event stream is trimmed.
    """

    def __init__(
        self,
        redis: str | redis.Redis | Job | None = None,
        job_id: str | None = None,
        *,
        heartbeat_timeout: float = 10.0,
        events_cap: int = 10_000,
    ) -> None:
        if job_id is None:
            job_id = redis.job_id if isinstance(redis, Job) else os.environ.get(JOB_ENV)
            job_id = job_id or DEFAULT_JOB
        self.job_id: str = check_id("job_id", job_id, job=True)
        self.heartbeat_timeout = check_seconds("heartbeat_timeout", heartbeat_timeout, high=86400)
        self.events_cap = check_int("events_cap", events_cap, low=100, high=10_000_000)
        self.keys: Keys = Keys(self.job_id)
        if isinstance(redis, Job):
            self.client: Any = redis.client
            self.scripts: Scripts = redis.scripts
        else:
            self.client = make_client(redis)
            self.scripts = Scripts(self.client)

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, redis={describe(self.client)!r})"

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- workers ---------------------------------------------------------------------------
    def register_worker(
        self,
        worker_id: str,
        *,
        host: str | None = None,
        address: str | None = None,
        gpu_count: int = 0,
        labels: Mapping[str, str] | None = None,
        replace: bool = False,
        heartbeat_interval: float | None = 2.0,
        on_lost: Callable[[StrataError], None] | None = None,
    ) -> Worker:
        """Register a worker (or re-register one that failed or left) and start heartbeats.

        Args:
            worker_id: the worker's id (see ``strata_redis.validate`` for what is allowed).
            host, address: where it runs, for people reading the state.
            gpu_count: GPUs it has (0..1024).
            labels: free-form str -> str labels.
            replace: take over the id if it is registered and alive (a restarted process).
            heartbeat_interval: seconds between background heartbeats; ``None`` for none
                (then call ``heartbeat()`` yourself more often than the timeout).
            on_lost: called from the heartbeat thread if the worker is declared failed.

        Returns:
            The worker handle; its ``incarnation`` is the new membership generation.

        Raises:
            WorkerExistsError: the id is registered and alive, and ``replace`` is false.
            ValueError, TypeError: a bad argument, named in the message.
        """
        check_id("worker_id", worker_id)
        gpu_count = check_int("gpu_count", gpu_count, low=0, high=1024)
        info = {
            "host": _optional_text("host", host),
            "address": _optional_text("address", address),
            "gpu_count": gpu_count,
            "labels": _labels(labels),
        }
        if heartbeat_interval is not None:
            check_seconds("heartbeat_interval", heartbeat_interval, high=self.heartbeat_timeout)
        k = self.keys
        generation, _now = self.scripts.run(
            "register_worker",
            [k.heartbeats, k.status, k.incarnation, k.info, k.generation, k.events],
            [worker_id, orjson.dumps(info), "1" if replace else "0", self.events_cap],
            {"job_id": self.job_id, "worker_id": worker_id},
        )
        worker = Worker(self, worker_id, int(generation), on_lost=on_lost)
        if heartbeat_interval is not None:
            worker.start_heartbeat(heartbeat_interval)
        return worker

    def workers(self) -> list[WorkerInfo]:
        """Every worker the job has seen, sorted by id, with ages on Redis' clock."""
        k = self.keys
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(k.status)
            pipe.hgetall(k.info)
            pipe.hgetall(k.incarnation)
            pipe.zrange(k.heartbeats, 0, -1, withscores=True)
            pipe.time()
            status, info, incarnation, beats, (sec, usec) = pipe.execute()
        now_ms = sec * 1000 + usec / 1000
        last = dict(beats)
        out = []
        for worker_id in sorted(status):
            meta = orjson.loads(info[worker_id]) if worker_id in info else {}
            seen = last.get(worker_id)
            out.append(
                WorkerInfo(
                    worker_id=worker_id,
                    status=status[worker_id],
                    last_seen_s=None if seen is None else max(0.0, (now_ms - seen) / 1000),
                    host=meta.get("host"),
                    address=meta.get("address"),
                    gpu_count=int(meta.get("gpu_count", 0)),
                    labels=dict(meta.get("labels", {})),
                    incarnation=int(incarnation.get(worker_id, 0)),
                )
            )
        return out

    def live_workers(self) -> list[str]:
        """Ids of the workers that are registered and not failed or left, sorted."""
        return sorted(self.client.zrange(self.keys.heartbeats, 0, -1))

    def membership_generation(self) -> int:
        """The membership generation: moves by one on every join, leave and failure."""
        return int(self.client.get(self.keys.generation) or 0)

    def reap_call(self) -> Call:
        """One reaper step as a script call, to batch with other calls (see ``reap``)."""
        k = self.keys
        return (
            "reap_workers",
            [k.heartbeats, k.status, k.generation, k.events],
            [int(self.heartbeat_timeout * 1000), self.events_cap, REAP_BATCH],
        )

    def check_reaped(self, reply: list[Any]) -> list[str]:
        """The ids newly declared failed, from a reaper step's reply."""
        return [str(x) for x in check(reply, {"job_id": self.job_id})[1:]]

    def reap(self) -> list[str]:
        """Declare failed every worker silent for longer than ``heartbeat_timeout``.

        Atomic and safe to run from any number of processes at once; every live worker's
        heartbeat thread runs it too, so no extra daemon is needed.

        Returns:
            The ids this call declared failed (each failure is reported once, to one caller).
        """
        ids: list[str] = []
        while True:
            batch = self.check_reaped(self.scripts.call(*self.reap_call()))
            ids += batch
            if len(batch) < REAP_BATCH:
                return ids

    def events(self, count: int = 100) -> list[dict[str, str]]:
        """The newest membership events (join, replace, leave, fail), oldest first."""
        count = check_int("count", count, low=1, high=100_000)
        entries = self.client.xrevrange(self.keys.events, count=count)
        return [{"id": entry_id, **fields} for entry_id, fields in reversed(entries)]

    # -- datasets and shard leases ---------------------------------------------------------
    def leases(self, dataset: str, epoch: int, worker_id: str, **options: Any) -> ShardLeases:
        """``worker_id``'s leases on ``dataset``'s ``epoch``: iterate to drain the epoch.

        ``options`` are those of ``ShardLeases`` (``ttl``, ``steal``, ``on_lost``).

        Raises:
            DatasetNotFoundError: the dataset is not registered.
        """
        from .datasets import ShardManager
        from .leases import ShardLeases

        params = ShardManager(self).get_dataset(dataset)
        return ShardLeases(self, params, epoch, worker_id, **options)

    # -- barriers and epochs ---------------------------------------------------------------
    def barrier(
        self, name: str, expected: int | str = "live", *, timeout: float = 300.0
    ) -> Barrier:
        """A named, reusable barrier: ``job.barrier("step-100", expected=4).wait("w-01")``.

        Args:
            name: the barrier's name (names starting with ``strata:`` are reserved).
            expected: a count of workers, or ``"live"``: every live registered worker.
            timeout: the default timeout of ``wait``, seconds.

        Returns:
            The barrier handle (see ``strata_redis.barrier.Barrier``).
        """
        from .barrier import Barrier

        return Barrier(self, name, expected, timeout=timeout)

    def advance_epoch(self, worker_id: str, timeout: float = 60.0) -> int:
        """Meet every live worker and move to the next epoch; returns it (the same for all).

        See ``strata_redis.epochs.advance_epoch``.
        """
        from .epochs import advance_epoch

        return advance_epoch(self, worker_id, timeout)

    def current_epoch(self) -> int:
        """The job's epoch: 0 until the first ``advance_epoch``."""
        from .epochs import current_epoch

        return current_epoch(self)

    def epoch_barrier(self, timeout: float = 60.0) -> Barrier:
        """The barrier behind ``advance_epoch``, e.g. to ``reset(err.generation)`` it."""
        from .epochs import epoch_barrier

        return epoch_barrier(self, timeout)

    def barrier_latencies(self, count: int = 1000) -> list[BarrierLatency]:
        """The newest barrier releases with their release latency, oldest first."""
        from .latency import barrier_latencies

        return barrier_latencies(self, count)


def connect(
    redis: str | redis.Redis | Job | None = None, job_id: str | None = None, **options: Any
) -> Job:
    """Connect to a job's coordination state. See ``Job`` for the arguments."""
    return Job(redis, job_id, **options)


def _optional_text(arg: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{arg} must be a str or None, got {type(value).__name__} {value!r}")
    if len(value) > 1024:
        raise ValueError(f"{arg} must be at most 1024 characters, got {len(value)}")
    return value


def _labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise TypeError(f"labels must be a mapping of str to str, got {type(labels).__name__}")
    out = {}
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"labels must map str to str, got {key!r}: {value!r}")
        out[key] = value
    if len(orjson.dumps(out)) > 16_384:
        raise ValueError("labels must serialize to at most 16 KiB")
    return out


def list_jobs(client: Any) -> list[str]:
    """The ids of every job with state in this Redis (a ``SCAN``: for operators, not hot paths)."""
    jobs = set()
    for key in client.scan_iter(match=f"{PREFIX}:{{*}}:generation", count=1000):
        start, end = key.index("{") + 1, key.rindex("}")
        jobs.add(key[start:end])
    return sorted(jobs)

"""``Job``: the user-facing handle of one training run: a thin facade on the features."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import redis

from .connection import DEFAULT_MAX_CONNECTIONS, describe
from .context import HasContext, JobContext
from .coordination import epochs, latency, lifecycle, registry
from .coordination.barrier import Barrier
from .coordination.heartbeats import heartbeat_workers
from .coordination.latency import BarrierLatency
from .coordination.registry import WorkerInfo
from .coordination.workers import Worker, register_worker
from .data.datasets import get_dataset
from .data.leases import ShardLeases
from .era import EraScripts
from .errors import StrataError
from .keys import Keys
from .outage import ride_out, riding_out
from .scripts import Call

__all__ = ["Job", "connect"]


class Job:
    """The coordination state of one job (training run) in one Redis.

    Args:
        redis: a Redis URL (``redis://``, ``rediss://``, ``unix://``), ``host:port``, a
            ``redis.Redis``, or another ``Job`` (its client is shared). Default:
            ``$STRATA_REDIS_URL`` or ``redis://localhost:6379/0``.
        job_id: the job's id. Default: the process's default job, the same for every entry
            point (``$STRATA_JOB_ID``, else torchrun's run id, else ``<script>-<8 hex>``
            derived from the launch, logged once: ``identity.job_id``).
        heartbeat_timeout: seconds without a heartbeat after which the reaper declares a
            worker failed (default 10, or the shared job's). Every process of a job should
            use the same value.
        events_cap: approximate length at which the membership event stream is trimmed
            (default 10,000, or the shared job's).
        max_connections: the most connections this process opens to Redis for this job's
            client (default 1000; each thread blocked in a barrier or checkpoint wait holds
            one). See ``JobContext``.
        min_replicas: the durability knob for leases and commits: ``WAIT`` for this many
            replicas after each (default 0: no wait, or the shared job's). See
            ``JobContext``.
        replica_timeout: seconds each such ``WAIT`` waits for them. See ``JobContext``.
        durability: ``"default"`` or ``"replicated"``: lease calls and checkpoint commits
            are acknowledged only once ``min_replicas`` (default 1) replicas confirmed them,
            else ``NotReplicatedError`` (default: the shared job's, else
            ``$STRATA_DURABILITY``, else ``"default"``). See ``strata_redis.durability``.
        retention: seconds an ended job's keys are kept (default: the shared job's, else
            ``$STRATA_JOB_RETENTION``, else 3 days; see ``end``).
        redis_retry: seconds blocking calls (barrier, epoch, rendezvous and checkpoint
            waits) ride out an unreachable Redis before ``RedisUnavailableError`` (default
            60, or the shared job's). See ``JobContext``.

    Attributes:
        context: the ``JobContext`` the features work on (ids, client, keys, scripts).
    """

    def __init__(
        self,
        redis: str | redis.Redis | JobContext | HasContext | None = None,
        job_id: str | None = None,
        *,
        heartbeat_timeout: float | None = None,
        events_cap: int | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        min_replicas: int | None = None,
        replica_timeout: float | None = None,
        durability: str | None = None,
        retention: float | None = None,
        redis_retry: float | None = None,
    ) -> None:
        self.context = JobContext(
            redis, job_id, heartbeat_timeout=heartbeat_timeout, events_cap=events_cap,
            max_connections=max_connections, min_replicas=min_replicas,
            replica_timeout=replica_timeout, durability=durability, retention=retention,
            redis_retry=redis_retry,
        )  # fmt: skip

    @property
    def job_id(self) -> str:
        """The job's id."""
        return self.context.job_id

    @property
    def keys(self) -> Keys:
        """The job's key schema (internal: for reading Redis by hand; it changes with the
        layout)."""
        return self.context.keys

    @property
    def client(self) -> Any:
        """The redis-py client (shared by every handle made from this job)."""
        return self.context.client

    @property
    def scripts(self) -> EraScripts:
        """The Lua scripts registered on the client (internal: the features run them)."""
        return self.context.scripts

    @property
    def heartbeat_timeout(self) -> float:
        """Seconds without a heartbeat after which a worker is declared failed."""
        return self.context.heartbeat_timeout

    @property
    def events_cap(self) -> int:
        """The approximate length of the membership event stream."""
        return self.context.events_cap

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, redis={describe(self.client)!r})"

    def close(self) -> None:
        """Close the client's connections."""
        self.context.close()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the job's lifecycle -------------------------------------------------------------
    @riding_out
    def end(self, retention: float | None = None) -> int:
        """End the job: it reads ``ended``, and every key of it expires ``retention``
        seconds from now (default: the job's ``retention``, 3 days unless set).

        The expiry is set in bounded steps over the job's keys. Checkpoints in storage are
        kept (a relaunch rebuilds the index from them). A worker that registers in an ended
        job opens it again (``running``, its keys' expiry cleared). Ending an ended job keeps
        its end and expiry. See ``strata_redis.coordination.lifecycle``.

        Returns:
            When the job's keys expire, ms on Redis' clock.

        Raises:
            StateLostError: the job's state in Redis is gone.
            ValueError, TypeError: a bad ``retention``.
        """
        expires = lifecycle.end_job(self.context, retention)
        assert expires is not None
        return expires

    @riding_out
    def state(self) -> str:
        """The job's state: ``running``, ``stale``, ``ended``, ``lost`` or ``idle`` (see
        ``strata_redis.coordination.lifecycle``), judged by the job's own heartbeat timeout."""
        (state,) = lifecycle.read_states(self.client, [self.job_id], self.heartbeat_timeout)
        return state.state

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

        See ``strata_redis.coordination.workers.register_worker`` for the arguments.

        Raises:
            WorkerExistsError: the id's holder looks alive (a fresh heartbeat, its process
                not known to be gone), and ``replace`` is false; a stale holder is taken over.
            ValueError, TypeError: a bad argument, named in the message.
        """
        return register_worker(
            self.context, worker_id, host=host, address=address, gpu_count=gpu_count,
            labels=labels, replace=replace, heartbeat_interval=heartbeat_interval,
            on_lost=on_lost,
        )  # fmt: skip

    def heartbeat_workers(self, workers: Iterable[Worker]) -> list[StrataError | None]:
        """Heartbeat several of this job's workers in one round trip (one script call per
        1,000); background heartbeats of one process are batched so already.

        See ``strata_redis.coordination.heartbeats.heartbeat_workers``.

        Returns:
            One verdict per worker, in order: None (recorded) or the exception a single
            ``Worker.heartbeat`` would have raised; a refused worker is never resurrected.
        """
        return heartbeat_workers(self.context, workers)

    @riding_out
    def workers(self) -> list[WorkerInfo]:
        """Every worker the job has seen, sorted by id, with ages on Redis' clock."""
        return registry.workers(self.context)

    @riding_out
    def live_workers(self) -> list[str]:
        """Ids of the workers that are registered and not failed or left, sorted."""
        return registry.live_workers(self.context)

    @riding_out
    def membership_generation(self) -> int:
        """The membership generation: moves by one on every join, leave and failure."""
        return registry.membership_generation(self.context)

    def reap_call(self) -> Call:
        """One reaper step as a script call, to batch with other calls (see ``reap``)."""
        return registry.reap_call(self.context)

    def reaped(self, reply: list[Any]) -> list[str]:
        """The ids newly declared failed, from the raw reply of a ``reap_call``."""
        return registry.reaped(self.context, reply)

    @riding_out
    def reap(self) -> list[str]:
        """Declare failed every worker silent for longer than ``heartbeat_timeout``.

        Atomic and safe to run from any number of processes at once; every live worker's
        heartbeat thread runs it too, so no extra daemon is needed.

        Returns:
            The ids this call declared failed (each failure is reported once, to one caller).
        """
        return registry.reap(self.context)

    @riding_out
    def events(self, count: int = 100) -> list[dict[str, str]]:
        """The newest membership events (join, replace, leave, fail), oldest first."""
        return registry.events(self.context, count)

    # -- datasets and shard leases ---------------------------------------------------------
    def leases(self, dataset: str, epoch: int, worker_id: str, **options: Any) -> ShardLeases:
        """``worker_id``'s leases on ``dataset``'s ``epoch``: iterate to drain the epoch.

        ``options`` are those of ``ShardLeases`` (``ttl``, ``steal``, ``on_lost``).

        Raises:
            DatasetNotFoundError: the dataset is not registered.
        """
        params = ride_out(self.context, "Job.leases", get_dataset, self.context, dataset)
        return ShardLeases(self.context, params, epoch, worker_id, **options)

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
            The barrier handle (see ``strata_redis.coordination.barrier.Barrier``).
        """
        return Barrier(self.context, name, expected, timeout=timeout)

    def advance_epoch(self, worker_id: str, timeout: float = 60.0) -> int:
        """Meet every live worker and move to the next epoch; returns it (the same for all).

        See ``strata_redis.coordination.epochs.advance_epoch``.
        """
        return epochs.advance_epoch(self.context, worker_id, timeout)

    @riding_out
    def current_epoch(self) -> int:
        """The job's epoch: 0 until the first ``advance_epoch``."""
        return epochs.current_epoch(self.context)

    def epoch_barrier(self, timeout: float = 60.0) -> Barrier:
        """The barrier behind ``advance_epoch``, e.g. to ``reset(err.generation)`` it."""
        return epochs.epoch_barrier(self.context, timeout)

    @riding_out
    def barrier_latencies(self, count: int = 1000) -> list[BarrierLatency]:
        """The newest barrier releases with their release latency, oldest first."""
        return latency.barrier_latencies(self.context, count)


def connect(
    redis: str | redis.Redis | JobContext | HasContext | None = None,
    job_id: str | None = None,
    **options: Any,
) -> Job:
    """Connect to a job's coordination state. See ``Job`` for the arguments."""
    return Job(redis, job_id, **options)

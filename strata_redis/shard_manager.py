"""The seeds' ``ShardManager``: datasets in Redis, shards assigned by consistent hashing."""

from __future__ import annotations

from typing import Any

import redis

from .context import HasContext
from .coordination.registry import live_workers
from .data import datasets
from .data.sharding import DatasetParams, Shard, assign, shards_for_worker
from .errors import WorkerNotRegisteredError
from .job import Job
from .outage import riding_out
from .validate import check_id


class ShardManager:
    """Register datasets and compute which worker reads which shard in an epoch.

    The assignment is a pure function of (dataset params, epoch, the live workers of one
    membership generation): every process that asks gets the same answer, with no further
    coordination. See ``strata_redis.sharding`` for the guarantees.

    Args:
        redis: a ``Job``, anything with its job's context (a ``TrainingOrchestrator``: its
            job), or what ``connect()`` takes (URL, ``host:port``, ``redis.Redis``).
        job_id: the job, when ``redis`` is a URL or client (default: the process's default
            job, as ``connect``'s and ``TrainingOrchestrator``'s: ``identity.job_id``).
    """

    def __init__(
        self,
        redis: str | redis.Redis | Job | HasContext | None = None,
        job_id: str | None = None,
        **options: Any,
    ) -> None:
        self.job = redis if isinstance(redis, Job) else Job(redis, job_id, **options)
        self.context = self.job.context

    def __repr__(self) -> str:
        return f"ShardManager({self.job!r})"

    @riding_out
    def register_dataset_params(
        self,
        name: str,
        total_samples: int,
        samples_per_shard: int,
        shuffle: bool = True,
        seed: int = 0,
        *,
        replace: bool = False,
    ) -> DatasetParams:
        """Register a dataset (positional or keyword arguments).

        Registering the same name with the same parameters again is a no-op.

        Returns:
            The registered parameters.

        Raises:
            DatasetConflictError: registered with other parameters and ``replace`` is false.
            ValueError, TypeError: bad parameters, named in the message; nothing is written.
        """
        params = DatasetParams(name, total_samples, samples_per_shard, shuffle, seed)
        datasets.register_dataset(self.context, params, replace=replace)
        return params

    @riding_out
    def get_dataset(self, name: str) -> DatasetParams:
        """The parameters of a registered dataset.

        Raises:
            DatasetNotFoundError: no dataset of that name.
        """
        return datasets.get_dataset(self.context, name)

    @riding_out
    def list_datasets(self) -> list[DatasetParams]:
        """Every registered dataset, sorted by name."""
        return datasets.list_datasets(self.context)

    def delete_dataset(self, name: str) -> bool:
        """Forget a dataset's registration; returns whether it existed."""
        return datasets.delete_dataset(self.context, name)

    @riding_out
    def assignment(self, dataset: str, epoch: int) -> dict[str, list[Shard]]:
        """Every live worker's shards for ``epoch``, in the order it should read them."""
        params = datasets.get_dataset(self.context, dataset)  # (ridden out here, not twice)
        workers = live_workers(self.context)
        return assign(params, workers, epoch)

    @riding_out
    def get_shard_for_worker(self, dataset: str, worker_id: str, epoch: int) -> list[Shard]:
        """The shards ``worker_id`` reads in ``epoch``, in this epoch's order.

        Raises:
            DatasetNotFoundError: unknown dataset.
            WorkerNotRegisteredError: ``worker_id`` is not a live worker of the job.
        """
        params = datasets.get_dataset(self.context, dataset)  # (ridden out here, not twice)
        check_id("worker_id", worker_id)
        workers = live_workers(self.context)
        if worker_id not in workers:
            raise WorkerNotRegisteredError(
                f"worker {worker_id!r} is not a live worker of job {self.context.job_id!r}",
                job_id=self.context.job_id,
                worker_id=worker_id,
            )
        return shards_for_worker(params, workers, worker_id, epoch)

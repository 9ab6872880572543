"""The seeds' ``ShardManager``: datasets in Redis, shards assigned by consistent hashing."""

from __future__ import annotations

from typing import Any

import orjson
import redis

from .errors import DatasetNotFoundError, WorkerNotRegisteredError
from .job import Job
from .sharding import DatasetParams, Shard, assign, shards_for_worker
from .validate import check_id


def _encode(params: DatasetParams) -> bytes:
    # Canonical JSON (sorted keys) so "same parameters" is a byte comparison in Lua.
    return orjson.dumps(
        {
            "total_samples": params.total_samples,
            "samples_per_shard": params.samples_per_shard,
            "shuffle": params.shuffle,
            "seed": params.seed,
        },
        option=orjson.OPT_SORT_KEYS,
    )


class ShardManager:
    """Register datasets and compute which worker reads which shard in an epoch.

    The assignment is a pure function of (dataset params, epoch, the live workers of one
    membership generation): every process that asks gets the same answer, with no further
    coordination. See ``strata_redis.sharding`` for the guarantees.

    Args:
        redis: a ``Job``, or what ``connect()`` takes (URL, ``host:port``, ``redis.Redis``).
        job_id: the job, when ``redis`` is not a ``Job``.
    """

    def __init__(
        self,
        redis: str | redis.Redis | Job | None = None,
        job_id: str | None = None,
        **options: Any,
    ) -> None:
        self.job = redis if isinstance(redis, Job) else Job(redis, job_id, **options)

    def __repr__(self) -> str:
        return f"ShardManager({self.job!r})"

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
        """Register a dataset (the seeds' call; positional or keyword arguments).

        Registering the same name with the same parameters again is a no-op.

        Returns:
            The registered parameters.

        Raises:
            DatasetConflictError: registered with other parameters and ``replace`` is false.
            ValueError, TypeError: bad parameters, named in the message; nothing is written.
        """
        params = DatasetParams(name, total_samples, samples_per_shard, shuffle, seed)
        self.job.scripts.run(
            "register_dataset",
            [self.job.keys.datasets],
            [name, _encode(params), "1" if replace else "0"],
            {"job_id": self.job.job_id, "dataset": name},
        )
        return params

    def get_dataset(self, name: str) -> DatasetParams:
        """The parameters of a registered dataset.

        Raises:
            DatasetNotFoundError: no dataset of that name.
        """
        check_id("name", name)
        raw = self.job.client.hget(self.job.keys.datasets, name)
        if raw is None:
            raise DatasetNotFoundError(
                f"dataset {name!r} is not registered in job {self.job.job_id!r}",
                job_id=self.job.job_id,
                dataset=name,
            )
        return DatasetParams(name=name, **orjson.loads(raw))

    def list_datasets(self) -> list[DatasetParams]:
        """Every registered dataset, sorted by name."""
        stored = self.job.client.hgetall(self.job.keys.datasets)
        return [DatasetParams(name=n, **orjson.loads(v)) for n, v in sorted(stored.items())]

    def delete_dataset(self, name: str) -> bool:
        """Forget a dataset's registration; returns whether it existed."""
        check_id("name", name)
        return bool(self.job.client.hdel(self.job.keys.datasets, name))

    def assignment(self, dataset: str, epoch: int) -> dict[str, list[Shard]]:
        """Every live worker's shards for ``epoch``, in the order it should read them."""
        params = self.get_dataset(dataset)
        workers = self.job.live_workers()
        return assign(params, workers, epoch)

    def get_shard_for_worker(self, dataset: str, worker_id: str, epoch: int) -> list[Shard]:
        """The shards ``worker_id`` reads in ``epoch``, in this epoch's order (the seeds' call).

        Raises:
            DatasetNotFoundError: unknown dataset.
            WorkerNotRegisteredError: ``worker_id`` is not a live worker of the job.
        """
        params = self.get_dataset(dataset)
        check_id("worker_id", worker_id)
        workers = self.job.live_workers()
        if worker_id not in workers:
            raise WorkerNotRegisteredError(
                f"worker {worker_id!r} is not a live worker of job {self.job.job_id!r}",
                job_id=self.job.job_id,
                worker_id=worker_id,
            )
        return shards_for_worker(params, workers, worker_id, epoch)

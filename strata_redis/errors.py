"""Every exception strata_redis raises, under one root.

The tree::

    StrataError                     root: catch this to catch everything of ours
    ├── WorkerError                 .job_id, .worker_id
    │   ├── WorkerNotRegisteredError    the id was never registered (or its record was deleted)
    │   ├── WorkerExistsError           the id is registered and alive; pass replace=True to take it
    │   ├── WorkerFailedError           declared failed by the reaper: re-register to come back
    │   ├── WorkerLeftError             deregistered: re-register to come back
    │   └── WorkerReplacedError         a newer registration of the same id took over
    ├── BarrierError                .job_id, .barrier
    │   ├── BarrierTimeoutError         .missing: the workers that did not arrive
    │   └── BarrierBrokenError          .culprit, .reason: a member failed or aborted
    ├── DatasetError                .job_id, .dataset
    │   ├── DatasetNotFoundError
    │   └── DatasetConflictError        same name registered with other parameters
    ├── LeaseError                  .job_id, .dataset, .epoch, .shard_id
    │   └── LeaseLostError              the lease expired, was taken over, or its token is stale
    ├── StorageError                .backend, .path (never credentials)
    │   ├── StorageNotFoundError        the object does not exist
    │   └── StorageExistsError          a create-only write found the object already there
    └── CheckpointError             .job_id, .step
        ├── CheckpointAbortedError      a participant's upload failed: the step never commits
        └── CheckpointNotFoundError     no committed step verifies

Bad arguments raise the builtin ``ValueError``/``TypeError`` naming the argument and the
value, and errors from redis-py (``redis.exceptions.RedisError``) pass through unwrapped.
"""

from __future__ import annotations

__all__ = [
    "BarrierBrokenError",
    "BarrierError",
    "BarrierTimeoutError",
    "CheckpointAbortedError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "DatasetConflictError",
    "DatasetError",
    "DatasetNotFoundError",
    "LeaseError",
    "LeaseLostError",
    "StorageError",
    "StorageExistsError",
    "StorageNotFoundError",
    "StrataError",
    "WorkerError",
    "WorkerExistsError",
    "WorkerFailedError",
    "WorkerLeftError",
    "WorkerNotRegisteredError",
    "WorkerReplacedError",
]


class StrataError(Exception):
    """Root of every strata_redis error."""


class WorkerError(StrataError):
    """A worker-registry error about one worker of one job."""

    def __init__(self, message: str, *, job_id: str, worker_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.worker_id = worker_id


class WorkerNotRegisteredError(WorkerError):
    """The worker id is not registered in this job."""


class WorkerExistsError(WorkerError):
    """The worker id is registered and alive; ``replace=True`` takes it over."""


class WorkerFailedError(WorkerError):
    """The reaper declared this worker failed; it must re-register to take part again."""


class WorkerLeftError(WorkerError):
    """The worker deregistered; it must re-register to take part again."""


class WorkerReplacedError(WorkerError):
    """A newer registration of the same worker id superseded this handle."""


class BarrierError(StrataError):
    """A barrier error about one barrier of one job."""

    def __init__(self, message: str, *, job_id: str, barrier: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.barrier = barrier


class BarrierTimeoutError(BarrierError):
    """The barrier did not release within the timeout.

    Attributes:
        missing: ids of the live workers that had not arrived.
        missing_count: how many arrivals were missing (a count barrier may miss workers
            that are not registered yet, so this can exceed ``len(missing)``).
        generation: the barrier generation that timed out (pass it to ``reset``).
    """

    def __init__(
        self,
        message: str,
        *,
        job_id: str,
        barrier: str,
        missing: list[str],
        generation: int,
        missing_count: int | None = None,
    ) -> None:
        super().__init__(message, job_id=job_id, barrier=barrier)
        self.missing = missing
        self.generation = generation
        self.missing_count = len(missing) if missing_count is None else missing_count


class BarrierBrokenError(BarrierError):
    """A member of the barrier failed or aborted, so this generation can never release.

    Attributes:
        culprit: the worker that failed or aborted.
        reason: why (``"failed"`` for a worker the reaper declared failed, else the abort reason).
        generation: the barrier generation that broke (pass it to ``reset``).
    """

    def __init__(
        self, message: str, *, job_id: str, barrier: str, culprit: str, reason: str, generation: int
    ) -> None:
        super().__init__(message, job_id=job_id, barrier=barrier)
        self.culprit = culprit
        self.reason = reason
        self.generation = generation


class DatasetError(StrataError):
    """A dataset-registry error about one dataset of one job."""

    def __init__(self, message: str, *, job_id: str, dataset: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.dataset = dataset


class DatasetNotFoundError(DatasetError):
    """No dataset of that name is registered in this job."""


class DatasetConflictError(DatasetError):
    """A dataset of that name is registered with different parameters."""


class LeaseError(StrataError):
    """A shard-lease error about one shard of one dataset epoch."""

    def __init__(
        self, message: str, *, job_id: str, dataset: str, epoch: int, shard_id: int
    ) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.dataset = dataset
        self.epoch = epoch
        self.shard_id = shard_id


class LeaseLostError(LeaseError):
    """The lease expired, was granted to another worker, or the fencing token is stale."""


class StorageError(StrataError):
    """A storage backend could not complete an operation.

    Attributes:
        backend: a short description such as ``"s3://bucket"`` or ``"file:///root"``.
        path: the object path inside the backend, if any.
    """

    def __init__(self, message: str, *, backend: str, path: str | None = None) -> None:
        super().__init__(message)
        self.backend = backend
        self.path = path


class StorageNotFoundError(StorageError):
    """The object does not exist."""


class StorageExistsError(StorageError):
    """A create-only write (``write_if_absent``) found the object already there."""


class CheckpointError(StrataError):
    """A checkpoint error about one step of one job."""

    def __init__(self, message: str, *, job_id: str, step: int | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.step = step


class CheckpointAbortedError(CheckpointError):
    """A participant aborted this step (its upload failed); the step never becomes visible."""


class CheckpointNotFoundError(CheckpointError):
    """No committed checkpoint step verifies."""

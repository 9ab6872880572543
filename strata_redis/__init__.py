"""strata_redis: coordination for distributed ML training through Redis."""

from .errors import (
    BarrierBrokenError,
    BarrierError,
    BarrierTimeoutError,
    CheckpointAbortedError,
    CheckpointError,
    CheckpointNotFoundError,
    DatasetConflictError,
    DatasetError,
    DatasetNotFoundError,
    LeaseError,
    LeaseLostError,
    StorageError,
    StorageNotFoundError,
    StrataError,
    WorkerError,
    WorkerExistsError,
    WorkerFailedError,
    WorkerLeftError,
    WorkerNotRegisteredError,
    WorkerReplacedError,
)
from .job import Job, connect
from .keys import Keys
from .workers import Worker, WorkerInfo

__version__ = "0.1.0"

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
    "Job",
    "Keys",
    "LeaseError",
    "LeaseLostError",
    "StorageError",
    "StorageNotFoundError",
    "StrataError",
    "Worker",
    "WorkerError",
    "WorkerExistsError",
    "WorkerFailedError",
    "WorkerInfo",
    "WorkerLeftError",
    "WorkerNotRegisteredError",
    "WorkerReplacedError",
    "__version__",
    "connect",
]

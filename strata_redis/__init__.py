"""strata_redis: coordination for distributed ML training through Redis."""

from .barrier import LIVE, Barrier, BarrierLatency, BarrierState, Release
from .datasets import ShardManager
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
from .leases import EpochProgress, Lease, ShardLeases
from .sharding import DatasetParams, Shard
from .workers import Worker, WorkerInfo

__version__ = "0.1.0"

__all__ = [
    "LIVE",
    "Barrier",
    "BarrierBrokenError",
    "BarrierError",
    "BarrierLatency",
    "BarrierState",
    "BarrierTimeoutError",
    "CheckpointAbortedError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "DatasetConflictError",
    "DatasetError",
    "DatasetNotFoundError",
    "DatasetParams",
    "EpochProgress",
    "Job",
    "Keys",
    "Lease",
    "LeaseError",
    "LeaseLostError",
    "Release",
    "Shard",
    "ShardLeases",
    "ShardManager",
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

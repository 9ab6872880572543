"""strata_redis: coordination for distributed ML training through Redis."""

from .barrier import LIVE, Barrier, BarrierState, Release
from .checkpoint import CheckpointManager, SaveFuture
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
    StorageExistsError,
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
from .latency import BarrierLatency
from .leases import EpochProgress, Lease, ShardLeases
from .manifest import CheckpointInfo, FileEntry
from .reader import CheckpointSkippedWarning, LoadedCheckpoint
from .records import SaveRecord
from .sharding import DatasetParams, Shard
from .storage import (
    LocalStorage,
    S3Storage,
    Storage,
    open_storage,
    storage_from_env,
    storage_from_url,
)
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
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointNotFoundError",
    "CheckpointSkippedWarning",
    "DatasetConflictError",
    "DatasetError",
    "DatasetNotFoundError",
    "DatasetParams",
    "EpochProgress",
    "FileEntry",
    "Job",
    "Keys",
    "Lease",
    "LeaseError",
    "LeaseLostError",
    "LoadedCheckpoint",
    "LocalStorage",
    "Release",
    "S3Storage",
    "SaveFuture",
    "SaveRecord",
    "Shard",
    "ShardLeases",
    "ShardManager",
    "Storage",
    "StorageError",
    "StorageExistsError",
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
    "open_storage",
    "storage_from_env",
    "storage_from_url",
]

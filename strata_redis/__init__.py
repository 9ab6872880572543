"""strata_redis: coordination for distributed ML training through Redis."""

from .checkpoint.ids import CheckpointId
from .checkpoint.manager import CheckpointManager
from .checkpoint.manifest import CheckpointInfo, FileEntry
from .checkpoint.pipeline import SaveFuture
from .checkpoint.reader import CheckpointSkippedWarning, LoadedCheckpoint
from .checkpoint.records import SaveRecord
from .context import JobContext
from .coordination.barrier import LIVE, Barrier, BarrierState, Release
from .coordination.latency import BarrierLatency
from .coordination.registry import WorkerInfo
from .coordination.rendezvous import Rendezvous, Round
from .coordination.workers import Worker
from .data.leases import Lease, ShardLeases
from .data.record import EpochProgress
from .data.sharding import DatasetParams, Shard
from .data.stream import ShardStream
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
    EpochUnfinishedError,
    JobLayoutError,
    LeaseError,
    LeaseLostError,
    NotReplicatedError,
    RedisConfigError,
    RedisMemoryFullError,
    RedisUnavailableError,
    RendezvousEndedError,
    RendezvousError,
    RendezvousTimeoutError,
    RestartLimitError,
    RoundBrokenError,
    StateLostError,
    StateRolledBackError,
    StepNotForwardError,
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
from .orchestrator import TrainingOrchestrator
from .shard_manager import ShardManager
from .storage import (
    LocalStorage,
    S3Storage,
    Storage,
    open_storage,
    storage_from_env,
    storage_from_url,
)

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
    "CheckpointId",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointNotFoundError",
    "CheckpointSkippedWarning",
    "DatasetConflictError",
    "DatasetError",
    "DatasetNotFoundError",
    "DatasetParams",
    "EpochProgress",
    "EpochUnfinishedError",
    "FileEntry",
    "Job",
    "JobContext",
    "JobLayoutError",
    "Keys",
    "Lease",
    "LeaseError",
    "LeaseLostError",
    "LoadedCheckpoint",
    "LocalStorage",
    "NotReplicatedError",
    "RedisConfigError",
    "RedisMemoryFullError",
    "RedisUnavailableError",
    "Release",
    "Rendezvous",
    "RendezvousEndedError",
    "RendezvousError",
    "RendezvousTimeoutError",
    "RestartLimitError",
    "Round",
    "RoundBrokenError",
    "S3Storage",
    "SaveFuture",
    "SaveRecord",
    "Shard",
    "ShardLeases",
    "ShardManager",
    "ShardStream",
    "StateLostError",
    "StateRolledBackError",
    "StepNotForwardError",
    "Storage",
    "StorageError",
    "StorageExistsError",
    "StorageNotFoundError",
    "StrataError",
    "TrainingOrchestrator",
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

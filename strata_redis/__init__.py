"""strata_redis: coordination for distributed ML training through Redis.

``__all__`` is what a training script and an operator use: the training loop
(``TrainingOrchestrator``), a job's handle (``connect``, ``Job``), the facades
(``ShardManager``, ``CheckpointManager``), what they return, the storage backends, and the
errors worth catching. The rest is one import further:

- ``strata_redis.coordination``: workers, barriers, the rendezvous (``Worker``, ``Barrier``,
  ``Rendezvous``, ...)
- ``strata_redis.data``: shard leases and progress (``ShardLeases``, ``EpochProgress``)
- ``strata_redis.checkpoint``: checkpoint ids, file entries, save records
- ``strata_redis.errors``: every exception (the tree is drawn there)
- ``strata_redis.storage``, ``strata_redis.torch``, ``strata_redis.dashboard``,
  ``strata_redis.testing``

A name that moved out of ``__all__`` still imports from here, with a ``DeprecationWarning``
naming its new import path (``_MOVED``).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from ._version import __version__
from .checkpoint.manager import CheckpointManager
from .checkpoint.manifest import CheckpointInfo
from .checkpoint.pipeline import SaveFuture
from .checkpoint.reader import CheckpointSkippedWarning, LoadedCheckpoint
from .data.leases import Lease
from .data.sharding import DatasetParams, Shard
from .data.stream import ShardStream
from .errors import (
    BarrierError,
    CheckpointError,
    CheckpointNotFoundError,
    DatasetError,
    LeaseError,
    LeaseLostError,
    NotReplicatedError,
    RedisMemoryFullError,
    RedisUnavailableError,
    RendezvousError,
    StateLostError,
    StateRolledBackError,
    StorageError,
    StrataError,
    WorkerError,
)
from .job import Job, connect
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

__all__ = [
    "BarrierError",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointNotFoundError",
    "CheckpointSkippedWarning",
    "DatasetError",
    "DatasetParams",
    "Job",
    "Lease",
    "LeaseError",
    "LeaseLostError",
    "LoadedCheckpoint",
    "LocalStorage",
    "NotReplicatedError",
    "RedisMemoryFullError",
    "RedisUnavailableError",
    "RendezvousError",
    "S3Storage",
    "SaveFuture",
    "Shard",
    "ShardManager",
    "ShardStream",
    "StateLostError",
    "StateRolledBackError",
    "Storage",
    "StorageError",
    "StrataError",
    "TrainingOrchestrator",
    "WorkerError",
    "__version__",
    "connect",
    "open_storage",
    "storage_from_env",
    "storage_from_url",
]

#: names that were in ``__all__`` before, and the module to import each from now
_MOVED: dict[str, str] = {
    **dict.fromkeys(
        ["LIVE", "Barrier", "BarrierLatency", "BarrierState", "Release", "Rendezvous", "Round",
         "Worker", "WorkerInfo"],
        "strata_redis.coordination",
    ),
    **dict.fromkeys(["EpochProgress", "ShardLeases"], "strata_redis.data"),
    **dict.fromkeys(["CheckpointId", "FileEntry", "SaveRecord"], "strata_redis.checkpoint"),
    "JobContext": "strata_redis.context",
    "Keys": "strata_redis.keys",
    **dict.fromkeys(
        ["BarrierBrokenError", "BarrierTimeoutError", "CheckpointAbortedError",
         "DatasetConflictError", "DatasetNotFoundError", "EpochUnfinishedError",
         "JobLayoutError", "RedisConfigError", "RendezvousEndedError", "RendezvousTimeoutError",
         "RestartLimitError", "RoundBrokenError", "StepNotForwardError", "StorageExistsError",
         "StorageNotFoundError", "WorkerExistsError", "WorkerFailedError", "WorkerLeftError",
         "WorkerNotRegisteredError", "WorkerReplacedError"],
        "strata_redis.errors",
    ),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    """A name that moved out of ``__all__``: still there, with a warning naming its new path.
    (Anything else is no attribute: ``from strata_redis import <submodule>`` then imports it.)"""
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"strata_redis.{name} is no longer part of strata_redis' public names: import it "
        f"from {module} (from {module} import {name})",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), name)

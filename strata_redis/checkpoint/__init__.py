"""Checkpoints: the save pipeline, the all-or-nothing commit of a step, the checkpoint index,
verified reads, retention, and the round-scoped protocol the training loop composes.

``__all__`` is what other packages and users may import from here: ``CheckpointManager`` and
what it returns (``SaveFuture``, ``CheckpointInfo``, ``FileEntry``, ``LoadedCheckpoint``,
``CheckpointId``, ``SaveRecord``, ``CheckpointSkippedWarning``), ``RoundCheckpoints`` (the
training loop's), and the owner modules other packages call or read through (``commit``,
``ids``, ``index``, ``manifest``: the storage layout, ``records``, ``rounds``, ``snapshot``,
``checksum``: the CRC-32 a shard's index records too). ``pipeline``, ``retention`` and
``reader`` are this package's own beyond those names.
"""

from . import checksum, commit, ids, index, manifest, records, rounds, snapshot
from .ids import CheckpointId
from .manager import CheckpointManager
from .manifest import CheckpointInfo, FileEntry
from .pipeline import SaveFuture
from .reader import CheckpointSkippedWarning, LoadedCheckpoint
from .records import SaveRecord
from .rounds import RoundCheckpoints

__all__ = [
    "CheckpointId",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointSkippedWarning",
    "FileEntry",
    "LoadedCheckpoint",
    "RoundCheckpoints",
    "SaveFuture",
    "SaveRecord",
    "checksum",
    "commit",
    "ids",
    "index",
    "manifest",
    "records",
    "rounds",
    "snapshot",
]

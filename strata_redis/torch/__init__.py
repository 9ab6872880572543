"""PyTorch integration (extra ``torch``): batches from fenced leases, torch state in strata
checkpoints, and ``torch.distributed`` started from strata's rendezvous.

::

    orch = strata_redis.TrainingOrchestrator(coordinator_url=..., worker_id=...)
    strata_redis.torch.init_process_group(orch, backend="gloo")   # rank/world from the round
    sampler = strata_redis.torch.LeaseBatchSampler(orch, "my-dataset", batch_size=64)
    loader = strata_redis.torch.DataLoader(dataset, batch_sampler=sampler, num_workers=2)
    strata_redis.torch.load(orch, model=model, optimizer=opt)      # after a resume
    for epoch in range(orch.epoch, epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            ...                                                    # train
            strata_redis.torch.save(orch, step=step, epoch=epoch, model=model, optimizer=opt)
        orch.advance_epoch()

The core package never imports this one: ``import strata_redis`` works without torch.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "strata_redis.torch needs PyTorch: pip install 'strata-redis[torch]' (or pip install torch)"
    ) from exc

from .dcp import DistributedCheckpointError, StrataStorageReader, StrataStorageWriter
from .distributed import RedisStore, init_process_group, store_of
from .sampler import DataLoader, LeaseBatchSampler
from .shards import ShardDataset
from .staging import StagingArea
from .state import SavedFuture, close, load, save, staging_area, wait

__all__ = [
    "DataLoader",
    "DistributedCheckpointError",
    "LeaseBatchSampler",
    "RedisStore",
    "SavedFuture",
    "ShardDataset",
    "StagingArea",
    "StrataStorageReader",
    "StrataStorageWriter",
    "close",
    "init_process_group",
    "load",
    "save",
    "staging_area",
    "store_of",
    "wait",
]

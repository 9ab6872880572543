"""``ShardDataset``: a sharded dataset in storage through a ``DataLoader`` with worker
processes, its leases held in the training process.

Why a map-style dataset with its own batch sampler, not an ``IterableDataset``: a
``DataLoader`` runs an ``IterableDataset``'s iterator once per worker process, each with no
way to share one set of leases; a batch sampler runs in the main process. So the leases, the
data position and the prefetch stay there (``ShardBatchSampler``: a ``LeaseBatchSampler``
that hands out ``WorkItem``\\ s — a batch's sample ids and their byte spans in a local copy of
the shard), and the worker processes read and decode the samples (``__getitems__``). What
the training step consumed is counted as for any ``LeaseBatchSampler``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import torch.utils.data

from ..orchestrator import TrainingOrchestrator
from ..shards.feed import ShardFeed, WorkItem
from ..storage import Storage
from .sampler import LeaseBatchSampler

__all__ = ["ShardBatchSampler", "ShardDataset"]


class ShardBatchSampler(LeaseBatchSampler):
    """A ``LeaseBatchSampler`` whose batches are ``WorkItem``\\ s of a sharded dataset (its
    shards' bytes fetched ahead to local files)."""

    def __init__(
        self,
        orchestrator: TrainingOrchestrator,
        dataset: str,
        storage: Storage,
        batch_size: int | None = None,
        **fetch: Any,
    ) -> None:
        super().__init__(orchestrator, dataset, batch_size)
        self.feed = ShardFeed(
            self.stream, storage, members=lambda: orchestrator.round.members,
            worker_id=orchestrator.worker_id, **fetch,
        )  # fmt: skip

    def _items(self, walk: Iterator[Any]) -> Iterator[Any]:
        return self.feed.items(walk)

    def consumed(self) -> None:
        self.feed.consumed()


class ShardDataset(torch.utils.data.Dataset):  # type: ignore[misc]
    """A dataset of shard objects in storage (``strata_redis.shards``), read by lease.

    Iterate it through ``strata_redis.torch.DataLoader(dataset, num_workers=...,
    pin_memory=..., collate_fn=...)``: each batch is one lease's samples in the epoch's
    shuffled order (a batch never spans two shards), as dicts ``{"__key__", "__id__",
    field: bytes}`` or what ``decode`` makes of them, collated by ``collate_fn``. Each
    iteration of the loader walks the job's current epoch (``set_epoch`` as
    ``LeaseBatchSampler``'s). Nothing is trained twice or skipped when a loader worker dies
    or the job is killed: the data position counts what the loop consumed, and a resume
    fetches only what is left of a part-done shard (ranged reads), never a done one.

    Example::

        ds = ShardDataset(orch, "my-data", storage, batch_size=64, decode=my_decode)
        loader = strata_redis.torch.DataLoader(ds, num_workers=4, pin_memory=True)
        for epoch in range(orch.epoch, epochs):
            ds.set_epoch(epoch)
            for batch in loader:
                ...
            orch.advance_epoch()

    Args:
        orchestrator: this worker's ``TrainingOrchestrator``.
        dataset_id: the dataset (registered: ``strata_redis.shards.register_shards``).
        storage: where its shards are.
        batch_size: samples per batch (default: the orchestrator's).
        prefetch: shards fetched ahead of use at most (to local files, in the background).
        cache_dir: keep whole shards in this directory between uses and runs; None: a
            temporary directory, each shard's file deleted once its batches are consumed (a
            ``LocalStorage``'s shards are then read in place: never copied).
        cache_bytes: ``cache_dir``'s size limit (least recently used shards evicted).
        decode: applied to each sample (dict, or ``field``'s bytes) in the loader's worker
            processes (picklable when they are spawned).
        storage_wait: seconds a fetch retries while the storage fails.
        processes: from a remote storage (S3), helper processes that copy the shards
            (default 2; 0: the fetch threads copy them).
        field: each sample is this field's bytes (``"bin"``, ``"jpg"``), not a dict: no
            dict is made per sample (as webdataset's ``to_tuple`` of one field); a sample
            without it raises ``ShardFormatError``.

    Raises:
        DatasetNotFoundError: not registered. StorageNotFoundError: no manifest.
        ShardManifestError: registered with other counts than its manifest's.
    """

    def __init__(
        self,
        orchestrator: TrainingOrchestrator,
        dataset_id: str,
        storage: Storage,
        *,
        batch_size: int | None = None,
        prefetch: int = 2,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int | None = None,
        decode: Callable[[dict[str, Any]], Any] | None = None,
        storage_wait: float = 60.0,
        field: str | None = None,
        processes: int = 2,
    ) -> None:
        if decode is not None and not callable(decode):
            raise TypeError(f"decode must be callable, got {type(decode).__name__}")
        if field is not None and (not isinstance(field, str) or not field):
            raise TypeError(f"field must be a field's name (str), got {field!r}")
        self.decode = decode
        self.field = field
        self.lease_sampler: ShardBatchSampler | None = ShardBatchSampler(
            orchestrator, dataset_id, storage, batch_size, prefetch=prefetch,
            cache_dir=cache_dir, cache_bytes=cache_bytes, storage_wait=storage_wait,
            field=field, processes=processes,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"ShardDataset({self.sampler.dataset!r})"

    @property
    def sampler(self) -> ShardBatchSampler:
        if self.lease_sampler is None:
            raise RuntimeError("a ShardDataset's copy in a loader worker holds no leases")
        return self.lease_sampler

    def __getitems__(self, item: WorkItem) -> list[Any]:
        """One batch's samples, read from the local copy (in a loader worker process)."""
        samples: list[Any] = item.samples() if self.field is None else item.field(self.field)
        decode = self.decode
        return samples if decode is None else [decode(s) for s in samples]

    def __getitem__(self, item: WorkItem) -> Any:
        raise TypeError(
            "a ShardDataset is read in batches: iterate strata_redis.torch.DataLoader(dataset)"
        )

    def __getstate__(self) -> dict[str, Any]:
        # a loader worker needs only the decoder: the leases stay in the training process
        return {"decode": self.decode, "field": self.field, "lease_sampler": None}

    def set_epoch(self, epoch: int) -> None:
        """As ``LeaseBatchSampler.set_epoch``."""
        self.sampler.set_epoch(epoch)

    def stats(self) -> dict[str, Any]:
        """The prefetch bound (``prefetch_shards``), what is held now and at most
        (``held_shards``, ``held_bytes``, ``max_held_*``), and the storage reads of shard
        bytes (``fetched_shards``, ``fetched_bytes``, ``reads``): ``ShardFetcher.stats``."""
        return self.sampler.feed.stats()

    def state_dict(self) -> dict[str, Any]:
        """As ``LeaseBatchSampler.state_dict``."""
        return self.sampler.state_dict()

    def close(self) -> None:
        """Stop fetching; delete the temporary files."""
        if self.lease_sampler is not None:
            self.lease_sampler.feed.close()

"""``ShardReader``: a plain loop's batches of samples from a sharded dataset, by lease."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from ..orchestrator import TrainingOrchestrator
from ..storage import Storage
from .feed import ShardFeed

__all__ = ["ShardReader"]


class ShardReader:
    """Batches of samples of a dataset written by ``ShardWriter`` (or indexed in place by
    ``index_tar_shards``), from this worker's fenced leases: the ``get_shards`` loop with
    samples in place of indices.

    Each ``batches()`` walks the job's current epoch once, as iterating ``get_shards``
    does, and a batch counts as trained once the loop has it (a checkpoint saved after it
    includes it). Shards' bytes are fetched ahead (``prefetch`` shards at most) to local
    files, read in this process. For ``DataLoader`` worker processes use
    ``strata_redis.torch.ShardDataset``.

    Example::

        reader = ShardReader(orchestrator, "my-data", storage, batch_size=32)
        for epoch in range(orchestrator.epoch, epochs):
            for batch in reader.batches():      # [{"__key__":..., "bin": b"...", ...}, ...]
                train(batch)
            orchestrator.advance_epoch()

    Args:
        orchestrator: this worker's ``TrainingOrchestrator``.
        dataset_id: the dataset (registered: ``register_shards``).
        storage: where its shards are.
        batch_size: samples per batch (default: the orchestrator's); a batch never spans
            two shards.
        prefetch: shards fetched ahead at most.
        cache_dir: a local cache directory of whole shards (None: temporary files; a
            ``LocalStorage``'s shards are then read in place, never copied).
        cache_bytes: the cache's size limit (least recently used evicted first).
        decode: applied to each sample (a dict of its fields) before it is handed out.
        storage_wait: seconds a fetch retries while the storage fails.
        processes: from a remote storage (S3), helper processes that copy the shards
            (default 2; 0: the fetch threads copy them).

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
        processes: int = 2,
    ) -> None:
        if not isinstance(orchestrator, TrainingOrchestrator):
            raise TypeError(
                f"orchestrator must be a TrainingOrchestrator, got {type(orchestrator).__name__}"
            )
        if decode is not None and not callable(decode):
            raise TypeError(f"decode must be callable, got {type(decode).__name__}")
        self.orchestrator = orchestrator
        self.decode = decode
        stream = orchestrator.get_shards(dataset_id, batch_size)
        self.feed = ShardFeed(
            stream, storage, members=lambda: orchestrator.round.members,
            worker_id=orchestrator.worker_id, prefetch=prefetch, cache_dir=cache_dir,
            cache_bytes=cache_bytes, storage_wait=storage_wait, processes=processes,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"ShardReader({self.feed.params.name!r})"

    def batches(self) -> Iterator[list[Any]]:
        """One walk of the job's current epoch: lists of samples (decoded, if ``decode``)."""
        decode = self.decode
        for item in self.feed.items(iter(self.feed.stream)):
            samples = item.samples()
            yield samples if decode is None else [decode(s) for s in samples]
            self.feed.consumed()  # the loop asked for the next: it has this one

    def stats(self) -> dict[str, Any]:
        """The prefetch bound and what was fetched (``ShardFetcher.stats``)."""
        return self.feed.stats()

    def close(self) -> None:
        """Stop fetching; delete the temporary files."""
        self.feed.close()

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Datasets as shard objects in storage (``{dataset_id}/shards/``), read by lease.

Write a dataset as webdataset-compatible tars with ``ShardWriter`` (or index tars already
there with ``index_tar_shards``), register it with ``register_shards``, and read it: a plain
loop with ``ShardReader``, PyTorch with ``strata_redis.torch.ShardDataset``. Modules, one
concept each: ``index`` (the layout, a shard's index, the manifest), ``tarball`` (the tar
format), ``writer``, ``catalog`` (indexing in place, registering), ``fetcher`` (prefetch and
cache), ``feed`` (a lease walk as work items), ``reader`` (the plain loop).
"""

from .catalog import index_tar_shards, register_shards
from .feed import ShardFeed, WorkItem
from .fetcher import ShardFetcher
from .index import Manifest, ShardEntry, ShardIndex, read_manifest
from .reader import ShardReader
from .writer import ShardSet, ShardWriter

__all__ = [
    "Manifest",
    "ShardEntry",
    "ShardFeed",
    "ShardFetcher",
    "ShardIndex",
    "ShardReader",
    "ShardSet",
    "ShardWriter",
    "WorkItem",
    "index_tar_shards",
    "read_manifest",
    "register_shards",
]

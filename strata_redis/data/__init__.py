"""Data: datasets and their shards, fenced shard leases, a worker's stream of batches, and the
data position a checkpoint records.

``__all__`` is what other packages and users may import from here: the classes a training
script meets (``DatasetParams``, ``Shard``, ``Lease``, ``ShardLeases``, ``EpochProgress``,
``ShardStream``), and the owner modules other packages call (``datasets``, ``leases``,
``position``, ``record``, ``sharding``). ``walks/`` (how an epoch is walked) and ``hashring``
are this package's own.
"""

from . import datasets, leases, position, record, sharding
from .leases import Lease, ShardLeases
from .record import EpochProgress
from .sharding import DatasetParams, Shard
from .stream import ShardStream

__all__ = [
    "DatasetParams",
    "EpochProgress",
    "Lease",
    "Shard",
    "ShardLeases",
    "ShardStream",
    "datasets",
    "leases",
    "position",
    "record",
    "sharding",
]

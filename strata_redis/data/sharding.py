"""Static shard assignment: dataset params, shard ranges, worker assignment and per-epoch order.

This module is pure (no Redis): every answer is a function of its arguments only, identical in
any process on any machine (stable BLAKE2b/SplitMix64 hashing, never Python's ``hash()``, no
dependence on numpy's random generators or sort algorithm).

Guarantees, for ``DatasetParams(name, total_samples, samples_per_shard, shuffle, seed)``:

* **Shards.** Shard ``i`` holds sample indices ``[i * samples_per_shard, min((i + 1) *
  samples_per_shard, total_samples))``; the last shard is simply shorter. No padding, no
  drops: the shards tile ``range(total_samples)`` exactly.
* **Exactly once per epoch.** ``assign(params, workers, epoch)`` gives every shard to exactly
  one worker, so across all workers every sample index appears exactly once per epoch.
* **Assignment.** Which worker holds which shard depends on the dataset name, the number of
  shards and the *set* of live workers (not their order, not the epoch: a worker keeps its
  shards from epoch to epoch, so a local cache of them stays warm). Consistent hashing with
  bounded loads (``strata_redis.data.hashring``):

  - no worker holds more than ``hashring.max_load(num_shards, num_workers)`` shards: at most
    1.25x the mean with 8 or more shards per worker, never more than ``ceil(1.25 * mean)``;
  - when a worker fails, its shards move and few others do: with 10,000 shards over 1,000
    workers 99.8% keep their worker (the bar is ``(1 - 1/n) - 2%``); in small clusters the
    busiest worker holds at most ~1% of all shards above the mean so that its failure, too,
    stays near ``1/n`` (see ``tests/test_sharding.py`` for the sizes checked);
  - a joining worker takes about ``1/n`` of the shards (up to ~3/n between 200 and 900
    workers);
  - with fewer shards than workers some workers hold none (and when the two counts are
    close, a few may hold two: the slack that keeps a membership change from reshuffling).
* **Order.** With ``shuffle=False`` a worker's shards come in ascending shard id and the
  samples of each shard in ascending index. With ``shuffle=True`` both change every epoch,
  seeded by ``(seed, epoch)``: the shard order is one global permutation of shard ids
  (``shard_order``) that each worker reads its own shards in, and each shard's samples are
  permuted by ``(seed, epoch, shard_id)``.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..validate import check_id, check_int
from . import hashring

__all__ = [
    "MAX_EPOCH",
    "MAX_SEED",
    "MAX_SHARDS",
    "MAX_TOTAL_SAMPLES",
    "Assignment",
    "DatasetParams",
    "Shard",
    "assign",
    "assignment",
    "clear_cache",
    "shard_order",
    "shards_for_worker",
]

I64Array = npt.NDArray[np.int64]

#: most samples in one dataset
MAX_TOTAL_SAMPLES = 2**48
#: most shards in one dataset (``ceil(total_samples / samples_per_shard)``)
MAX_SHARDS = 2**24
#: seeds and epochs are non-negative 63-bit ints
MAX_SEED = 2**63 - 1
MAX_EPOCH = 2**63 - 1

_SHARD_DOMAIN = b"strata-shards"
_ORDER_TAG = 0x6A09E667F3BCC909  # shard order of an epoch
_SAMPLES_TAG = 0xBB67AE8584CAA73B  # sample order within one shard of an epoch


def _combine(tag: int, *values: int) -> int:
    """A 64-bit key from ``tag`` and ``values``, stable everywhere."""
    key = tag
    for value in values:
        key = hashring.mix64(key ^ hashring.mix64(value + hashring.GOLDEN))
    return key


@dataclass(frozen=True)
class Shard:
    """One shard of one epoch: a contiguous range of sample indices.

    Attributes:
        shard_id: ``0 <= shard_id < num_shards``.
        start: the first sample index of the shard (natural order).
        stop: one past the last sample index.
        epoch: the epoch this shard's sample order belongs to.
        seed: the dataset seed when the dataset shuffles, ``None`` for natural order.
    """

    shard_id: int
    start: int
    stop: int
    epoch: int
    seed: int | None

    def __len__(self) -> int:
        return self.stop - self.start

    def indices(self) -> I64Array:
        """This epoch's sample indices of the shard, as int64.

        ``range(start, stop)`` in ascending order when ``seed`` is None, else a permutation
        of it determined by ``(seed, epoch, shard_id)`` alone.
        """
        if self.seed is None:
            return np.arange(self.start, self.stop, dtype=np.int64)
        args = (self.seed, self.epoch, self.shard_id, self.start, self.stop)
        if self.stop - self.start > _KEPT_SAMPLES:
            return _shuffle(*args)
        kept: I64Array = _kept(*args).copy()
        return kept


#: shards of at most this many samples keep their last few shuffled orders (16 x 512 KiB)
_KEPT_SAMPLES = 2**16


def _shuffle(seed: int, epoch: int, shard_id: int, start: int, stop: int) -> I64Array:
    """A shuffled shard's indices: the permutation of ``range(start, stop)`` of ``(seed, epoch,
    shard_id)``."""
    key = _combine(_SAMPLES_TAG, seed, epoch, shard_id)
    order = np.argsort(hashring.stream(key, np.arange(stop - start)))
    indices: I64Array = order.astype(np.int64)
    indices += start
    return indices


@functools.lru_cache(maxsize=16)
def _kept(seed: int, epoch: int, shard_id: int, start: int, stop: int) -> I64Array:
    """``_shuffle``, the last few kept (a shard's walk and its reader each ask for its
    order), read-only."""
    indices = _shuffle(seed, epoch, shard_id, start, stop)
    indices.flags.writeable = False
    return indices


@dataclass(frozen=True)
class DatasetParams:
    """What defines a dataset's shards: ``register_dataset_params``'s arguments.

    Attributes:
        name: the dataset id (a ``validate.check_id`` id).
        total_samples: samples in the dataset, ``1..MAX_TOTAL_SAMPLES``.
        samples_per_shard: samples per shard, at least 1; more than ``total_samples`` gives
            one shard.
        shuffle: reorder shards and samples every epoch (seeded), or keep natural order.
        seed: the shuffle seed, ``0..MAX_SEED``.

    Raises:
        TypeError: an argument of the wrong type (``bool`` is not an int here).
        ValueError: an argument out of range, or more than ``MAX_SHARDS`` shards.
    """

    name: str
    total_samples: int
    samples_per_shard: int
    shuffle: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        check_id("name", self.name)
        check_int("total_samples", self.total_samples, low=1, high=MAX_TOTAL_SAMPLES)
        check_int("samples_per_shard", self.samples_per_shard, low=1, high=MAX_TOTAL_SAMPLES)
        if not isinstance(self.shuffle, bool):
            raise TypeError(
                f"shuffle must be a bool, got {type(self.shuffle).__name__} {self.shuffle!r}"
            )
        check_int("seed", self.seed, low=0, high=MAX_SEED)
        if self.num_shards > MAX_SHARDS:
            raise ValueError(
                f"samples_per_shard={self.samples_per_shard} splits total_samples="
                f"{self.total_samples} into {self.num_shards} shards; at most {MAX_SHARDS}"
            )

    @property
    def num_shards(self) -> int:
        """``ceil(total_samples / samples_per_shard)``."""
        return -(-self.total_samples // self.samples_per_shard)

    def shard_range(self, shard_id: int) -> tuple[int, int]:
        """``(start, stop)`` sample indices of a shard; the last shard may be shorter.

        Raises:
            TypeError, ValueError: ``shard_id`` is not an int in ``[0, num_shards)``.
        """
        check_int("shard_id", shard_id, low=0, high=self.num_shards - 1)
        start = shard_id * self.samples_per_shard
        return start, min(start + self.samples_per_shard, self.total_samples)

    def shard(self, shard_id: int, epoch: int) -> Shard:
        """The ``Shard`` for ``shard_id`` in ``epoch`` (what ``indices()`` shuffles by).

        Raises:
            TypeError, ValueError: ``shard_id`` or ``epoch`` out of range.
        """
        check_int("epoch", epoch, low=0, high=MAX_EPOCH)
        start, stop = self.shard_range(shard_id)
        return Shard(shard_id, start, stop, epoch, self.seed if self.shuffle else None)


def _make_shards(params: DatasetParams, shard_ids: I64Array, epoch: int) -> list[Shard]:
    """Shards for already-validated ids and epoch, in the given order."""
    per, total = params.samples_per_shard, params.total_samples
    seed = params.seed if params.shuffle else None
    return [Shard(i, i * per, min(i * per + per, total), epoch, seed) for i in shard_ids.tolist()]


def _order_keys(params: DatasetParams, epoch: int, shard_ids: I64Array) -> npt.NDArray[np.uint64]:
    """Each shard's sort key in this epoch's order (distinct for distinct ids)."""
    return hashring.stream(_combine(_ORDER_TAG, params.seed, epoch), shard_ids)


def shard_order(params: DatasetParams, epoch: int) -> I64Array:
    """Every shard id in this epoch's order.

    Ascending when ``params.shuffle`` is False; otherwise a permutation seeded by
    ``(params.seed, epoch)``. Each worker reads its own shards in this relative order.

    Raises:
        TypeError, ValueError: ``epoch`` is not an int in ``[0, MAX_EPOCH]``.
    """
    check_int("epoch", epoch, low=0, high=MAX_EPOCH)
    ids = np.arange(params.num_shards, dtype=np.int64)
    if not params.shuffle:
        return ids
    return np.argsort(_order_keys(params, epoch, ids)).astype(np.int64)


@dataclass(frozen=True, eq=False)
class Assignment:
    """Which worker holds which shard of a dataset, for one membership (any epoch).

    Made by ``assignment()``. Read-only.

    Attributes:
        params: the dataset.
        workers: the live worker ids, sorted (a worker's index is its position here).
        owner: ``owner[shard_id]`` is the index in ``workers`` of the shard's worker.
    """

    params: DatasetParams
    workers: tuple[str, ...]
    owner: npt.NDArray[np.intp]

    def index(self, worker_id: str) -> int:
        """The position of ``worker_id`` in ``workers``.

        Raises:
            TypeError: ``worker_id`` is not a str.
            ValueError: ``worker_id`` is not one of the workers.
        """
        check_id("worker_id", worker_id)
        i = bisect.bisect_left(self.workers, worker_id)
        if i == len(self.workers) or self.workers[i] != worker_id:
            raise ValueError(
                f"worker_id {worker_id!r} is not one of the {len(self.workers)} workers"
            )
        return i

    def loads(self) -> dict[str, int]:
        """Number of shards per worker (every worker present, possibly with 0)."""
        counts = np.bincount(self.owner, minlength=len(self.workers)).tolist()
        return dict(zip(self.workers, counts, strict=True))

    def worker_of(self, shard_id: int) -> str:
        """The worker that holds ``shard_id``."""
        check_int("shard_id", shard_id, low=0, high=self.params.num_shards - 1)
        return self.workers[int(self.owner[shard_id])]

    def shard_ids(self, worker_id: str, epoch: int) -> I64Array:
        """The shard ids ``worker_id`` holds, in this epoch's order.

        Raises:
            TypeError, ValueError: unknown ``worker_id`` or bad ``epoch``.
        """
        check_int("epoch", epoch, low=0, high=MAX_EPOCH)
        ids = np.flatnonzero(self.owner == self.index(worker_id)).astype(np.int64)
        if self.params.shuffle:
            ids = ids[np.argsort(_order_keys(self.params, epoch, ids))]
        return ids

    def shards(self, worker_id: str, epoch: int) -> list[Shard]:
        """The shards ``worker_id`` holds, in this epoch's order."""
        return _make_shards(self.params, self.shard_ids(worker_id, epoch), epoch)

    def grouped(self, epoch: int) -> tuple[I64Array, npt.NDArray[np.intp]]:
        """Every shard id grouped by worker (in ``workers`` order), each group in this epoch's
        order; and beside each id, its owner's index."""
        order = shard_order(self.params, epoch)
        owners = self.owner[order]
        grouped = np.argsort(owners, kind="stable")  # stable: keeps the epoch order per worker
        return order[grouped], owners[grouped]

    def by_worker(self, epoch: int) -> dict[str, list[Shard]]:
        """Every worker's shards in this epoch's order (workers with none map to ``[]``)."""
        ids, owners = self.grouped(epoch)
        shards = _make_shards(self.params, ids, epoch)
        ends = np.cumsum(np.bincount(owners, minlength=len(self.workers))).tolist()
        result: dict[str, list[Shard]] = {}
        start = 0
        for worker, end in zip(self.workers, ends, strict=True):
            result[worker] = shards[start:end]
            start = end
        return result


def assignment(params: DatasetParams, workers: Iterable[str]) -> Assignment:
    """Assign every shard of ``params`` to one of ``workers`` (the core, epoch-independent).

    The ring of a membership is cached (LRU), so a repeat call with the same workers skips
    hashing them.

    Args:
        params: the dataset.
        workers: the live worker ids, in any order (the result depends on the set).

    Returns:
        The assignment.

    Raises:
        TypeError: ``params`` is not a ``DatasetParams``; ``workers`` is a str or holds a
            non-str.
        ValueError: ``workers`` is empty, holds an invalid id or the same id twice.
    """
    if not isinstance(params, DatasetParams):
        raise TypeError(f"params must be a DatasetParams, got {type(params).__name__}")
    ring = hashring.ring_for(workers)
    num_shards = params.num_shards
    keys = hashring.stream(
        hashring.string_key(params.name, _SHARD_DOMAIN), np.arange(num_shards, dtype=np.int64)
    )
    owner = hashring.place(ring, keys, hashring.capacities(num_shards, ring))
    owner.flags.writeable = False
    return Assignment(params, ring.workers, owner)


def assign(params: DatasetParams, workers: Iterable[str], epoch: int) -> dict[str, list[Shard]]:
    """Every live worker's shards for ``epoch``, in that epoch's order.

    Args:
        params: the dataset.
        workers: the live worker ids, in any order.
        epoch: the epoch, ``0..MAX_EPOCH``.

    Returns:
        ``{worker_id: [Shard, ...]}`` with every worker as a key (``[]`` if it holds none).
        Across all lists every shard appears exactly once.

    Raises:
        TypeError, ValueError: as ``assignment``, or a bad ``epoch``.
    """
    check_int("epoch", epoch, low=0, high=MAX_EPOCH)
    return assignment(params, workers).by_worker(epoch)


def shards_for_worker(
    params: DatasetParams, workers: Iterable[str], worker_id: str, epoch: int
) -> list[Shard]:
    """The shards ``worker_id`` reads in ``epoch``, in order: ``assign(...)[worker_id]``.

    Args:
        params: the dataset.
        workers: the live worker ids, in any order; must include ``worker_id``.
        worker_id: the worker asking.
        epoch: the epoch, ``0..MAX_EPOCH``.

    Raises:
        TypeError, ValueError: as ``assignment``, a bad ``epoch``, or ``worker_id`` not among
            ``workers``.
    """
    check_int("epoch", epoch, low=0, high=MAX_EPOCH)
    return assignment(params, workers).shards(worker_id, epoch)


def clear_cache() -> None:
    """Forget every cached membership ring."""
    hashring.clear_cache()

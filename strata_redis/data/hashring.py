"""Consistent hashing with bounded loads: a virtual-node ring over worker ids, placed in numpy.

Everything here is a pure function of its inputs and identical on every machine: hashes come
from BLAKE2b (worker ids) and SplitMix64 (everything derived), never from Python's ``hash()``,
and every argsort runs on keys that are distinct by construction (or is stable), so no
result depends on the sort algorithm numpy picks.

How an item (a shard) finds its worker:

1. **Ring.** Worker ``w`` owns ``vnodes_per_worker(n)`` points of the 64-bit ring, the first
   outputs of a SplitMix64 stream seeded by BLAKE2b(``w``). The count shrinks as the cluster
   grows (about 390 per worker below ~10 workers, 144 at 200, 32 from 900 on), so small
   clusters get an even ring and big ones a cheap ring, while a change of one worker changes
   every other worker's count by at most ``min(0.5%, 1/n)`` (points are only added or dropped
   at the end of each stream, so the rest of the ring stays where it was).
2. **Primary.** An item goes to the owner of the first point clockwise from its own hash.
3. **Bounded loads.** No worker takes more than its cap (``capacities``). A worker with
   more primaries than that keeps the ones closest to its points (ring distance) and rejects
   the rest; a rejected item walks clockwise to the next point whose owner still has room.
   This runs in vectorised rounds over the rejected items only (a few percent of them).

Measured (``tests/test_sharding.py``, ``perf/bench_sharding.py``): the busiest worker stays
within ``max_load``; when a worker fails, its items move and typically well under 2% of the
others do (the worst seen: 1.8% with 10,000+ items over 3 or 4 workers, where the ring is
least even; ~0.1% at 1,000 workers); a join moves about ``1/n`` of the items, up to ~3/n in
the 200..900 range where the point count per worker is still shrinking.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..validate import check_id

__all__ = [
    "MAX_WORKERS",
    "Ring",
    "capacities",
    "clear_cache",
    "max_load",
    "mix64",
    "place",
    "ring_for",
    "stream",
    "string_key",
    "vnodes_per_worker",
]

U64Array = npt.NDArray[np.uint64]
IntArray = npt.NDArray[np.intp]

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB

#: a ring point keeps the top 44 bits of its hash and the worker's index in the low 20 bits
_INDEX_BITS = 20
_LOW = np.uint64((1 << _INDEX_BITS) - 1)
_HIGH = np.uint64(MASK64 ^ ((1 << _INDEX_BITS) - 1))

#: most workers one ring takes (the index must fit below the low-bit mask, with room to spare)
MAX_WORKERS = 100_000

_RING_DOMAIN = b"strata-ring"
_COUNT_TAG = 0x5851F42D4C957F2D
_RANK_TAG = 0x14057B7EF767814F

# vnode schedule (see vnodes_per_worker): 32.32 fixed point so every machine agrees bit for bit
_VNODES_MIN = 32
_VNODES_FLAT_FROM = 900
_VNODES_KNEE = 200
_VNODES_DECAY = (995, 1000)  # below the knee: 0.5% more points per worker removed


def mix64(x: int) -> int:
    """SplitMix64's finaliser on a Python int, modulo 2**64 (a bijection of 64-bit values)."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * _M1) & MASK64
    x = ((x ^ (x >> 27)) * _M2) & MASK64
    return x ^ (x >> 31)


def _mix_array(x: U64Array) -> U64Array:
    """``mix64`` over a uint64 array, in place (numpy integer arrays wrap silently)."""
    x ^= x >> np.uint64(30)
    x *= np.uint64(_M1)
    x ^= x >> np.uint64(27)
    x *= np.uint64(_M2)
    x ^= x >> np.uint64(31)
    return x


def stream(seed: int, counters: npt.ArrayLike) -> U64Array:
    """Outputs ``counters`` (0-based) of the SplitMix64 generator seeded with ``seed``.

    Output ``i`` is ``mix64(seed + (i + 1) * GOLDEN)``: distinct counters give distinct
    outputs, so sorting by them never meets a tie.
    """
    x = np.asarray(counters, dtype=np.uint64) + np.uint64(1)
    x *= np.uint64(GOLDEN)
    x += np.uint64(seed & MASK64)
    return _mix_array(x)


def string_key(text: str, domain: bytes) -> int:
    """A stable 64-bit key for ``text``: BLAKE2b-64 of its UTF-8, personalised by ``domain``."""
    digest = hashlib.blake2b(text.encode(), digest_size=8, person=domain).digest()
    return int.from_bytes(digest, "little")


def _vnodes_fixed(num_workers: int) -> int:
    """Points per worker for a ring of ``num_workers``, in 32.32 fixed point."""
    flat = _VNODES_MIN * _VNODES_FLAT_FROM
    if num_workers >= _VNODES_FLAT_FROM:
        return _VNODES_MIN << 32
    if num_workers >= _VNODES_KNEE:
        return (flat << 32) // num_workers
    num, den = _VNODES_DECAY
    steps = _VNODES_KNEE - num_workers
    grow: int = den**steps
    shrink: int = num**steps
    return ((flat << 32) // _VNODES_KNEE) * grow // shrink


def vnodes_per_worker(num_workers: int) -> float:
    """Mean number of ring points per worker in a ring of ``num_workers`` workers.

    32 from 900 workers on; ``32 * 900 / n`` between 200 and 900 (a ring of ~28,800
    points); below 200 it grows by 0.5% per worker fewer, to about 389 for one worker.
    """
    return _vnodes_fixed(num_workers) / 2**32


@dataclass(frozen=True, eq=False)
class Ring:
    """The sorted ring of one membership. Build it with ``ring_for``; it is read-only.

    Attributes:
        workers: the worker ids, sorted; a worker's index is its position here.
        points: the ring, ascending: the top 44 bits are the position, the low 20 bits the
            owner's index (so equal positions sort by owner, on every machine).
        owner: ``owner[i]`` is the index of the worker that owns ``points[i]``.
        rank: ``rank[w]`` is worker ``w``'s place in an order fixed by hashes of the ids
            (who gets the spare capacity).
    """

    workers: tuple[str, ...]
    points: U64Array
    owner: IntArray
    rank: IntArray
    _padded: U64Array  # points plus a sentinel 2**64-1, so a scan never runs off the end
    _lut: IntArray  # _lut[b] = index of the first point whose top bits are >= b
    _shift: np.uint64

    @classmethod
    def build(cls, workers: tuple[str, ...]) -> Ring:
        """Build the ring of ``workers``, which must be sorted, unique and valid ids."""
        n = len(workers)
        base = hashlib.blake2b(digest_size=8, person=_RING_DOMAIN)
        digests = []
        for worker in workers:
            h = base.copy()
            h.update(worker.encode())
            digests.append(h.digest())
        keys = np.frombuffer(b"".join(digests), dtype="<u8").astype(np.uint64)

        # How many points each worker gets: the fractional part of the mean goes to the
        # workers whose own hash says so, so the total moves smoothly with n.
        fixed = _vnodes_fixed(n)
        frac = _mix_array(keys ^ np.uint64(_COUNT_TAG)) >> np.uint64(32)
        counts = (frac + np.uint64(fixed & 0xFFFFFFFF)) >> np.uint64(32)
        counts += np.uint64(fixed >> 32)
        width = int(counts.max())

        steps = (np.arange(1, width + 1, dtype=np.uint64)) * np.uint64(GOLDEN)
        grid = _mix_array(keys[:, None] + steps[None, :])
        grid &= _HIGH
        grid |= np.arange(n, dtype=np.uint64)[:, None]
        if int(counts.min()) < width:
            grid = grid[np.arange(width, dtype=np.uint64)[None, :] < counts[:, None]]
        # one array for the ring and its sentinel (2**64-1, never below a key): `points` is a
        # view without the sentinel
        padded = np.empty(grid.size + 1, dtype=np.uint64)
        padded[:-1] = grid.ravel()
        padded[:-1].sort()
        padded[-1] = MASK64
        points = padded[:-1]
        owner = (points & _LOW).astype(np.intp)

        # ~2 buckets per point (at most 2**20): a key's bucket holds its successor or one
        # of the next few points
        bits = max(1, min(len(points).bit_length() + 1, 20))
        shift = np.uint64(64 - bits)
        per_bucket = np.bincount((points >> shift).astype(np.intp), minlength=1 << bits)
        lut = np.zeros((1 << bits) + 1, dtype=np.intp)
        np.cumsum(per_bucket, out=lut[1:])
        rank = np.empty(n, dtype=np.intp)
        rank[np.argsort(_mix_array(keys ^ np.uint64(_RANK_TAG)), kind="stable")] = np.arange(n)
        for array in (padded, points, owner, rank, lut):
            array.flags.writeable = False
        return cls(workers, points, owner, rank, padded, lut, shift)

    def successor(self, keys: U64Array) -> IntArray:
        """Index of the first point clockwise from each key (keys must have the low 20 bits set).

        With the low bits of a key set, a point compares below it exactly when the point's
        top 44 bits are <= the key's, so the answer depends on positions only, not on the
        worker indices stored in the low bits.
        """
        i = self._lut[(keys >> self._shift).astype(np.intp)]
        active = (self._padded[i] < keys).nonzero()[0]
        while active.size:  # a few points per bucket at most
            i[active] += 1
            active = active[self._padded[i[active]] < keys[active]]
        i[i == len(self.points)] = 0
        return i


def max_load(num_items: int, num_workers: int) -> int:
    """The most items ``capacities`` lets one worker hold.

    ``max(ceil(m), floor(1.25 m), ceil(1.125 m))`` for the mean load ``m = items / workers``:
    at most ``1.25 m`` whenever ``m >= 8``, never more than ``ceil(1.25 m)``, and always
    ~12.5% above the mean or more, so no membership is packed so tight that a change of one
    worker would reshuffle everything.
    """
    ceil_mean = -(-num_items // num_workers)
    return max(
        ceil_mean,
        (5 * num_items) // (4 * num_workers),
        -(-9 * num_items // (8 * num_workers)),
    )


def capacities(num_items: int, ring: Ring) -> IntArray:
    """Each worker's cap for ``place``: ``c`` or ``c + 1``, never above ``max_load``.

    The caps add up to the number of items plus ``min(20, n)`` percent (``n`` workers): in
    small clusters the busiest worker holds at most ~1% of all items above the mean, so its
    failure moves little more than ``1/n`` of them. The ``+1`` caps go to the workers that
    rank first by a hash of their id, so the caps too change by a few workers, not all at
    once, when the membership changes by one.
    """
    n = len(ring.workers)
    total = num_items + (num_items * min(20, n)) // 100
    base, extra = divmod(total, n)
    caps = np.where(ring.rank < extra, base + 1, base)
    # at least 1: a cluster with fewer items than workers spreads them one per worker
    return np.clip(caps, 1, max_load(num_items, n)).astype(np.intp)


def place(ring: Ring, keys: U64Array, caps: IntArray) -> IntArray:
    """The owner (an index into ``ring.workers``) of every item, at most ``caps[w]`` on ``w``.

    Each item goes to the first point clockwise from its key whose owner has room. A worker
    offered more items than it has room for keeps those closest to its points (ties by
    item order) and rejects the others, which walk on. Deterministic: every sort is on
    unique keys, so no step depends on the sort algorithm numpy picks.

    Args:
        ring: the membership's ring.
        keys: one uint64 hash per item.
        caps: the most items per worker (see ``capacities``); they must add up to at least
            the number of items.

    Raises:
        ValueError: the caps cannot hold every item.
    """
    num_workers = len(ring.workers)
    if caps.shape != (num_workers,) or int(caps.sum()) < len(keys):
        raise ValueError(
            f"caps must be {num_workers} caps adding up to at least {len(keys)} items, "
            f"got shape {caps.shape} adding up to {int(caps.sum())}"
        )
    h = keys | _LOW
    points = ring.successor(h)
    out = ring.owner[points]
    counts = np.bincount(out, minlength=num_workers)
    if len(keys) == 0 or not (counts > caps).any():
        return out

    room = caps.astype(np.intp)  # a copy: place() consumes it
    items: IntArray | None = None  # None: every item (round one)
    owners = out
    while True:
        over = counts > room
        contested = over[owners].nonzero()[0]
        c_items = contested if items is None else items[contested]
        c_points = points[contested]
        rejected = _reject(ring, h, c_items, c_points, np.where(over, counts, 0), room)
        room -= np.minimum(counts, room)
        if not rejected.size:
            return out
        items = c_items[rejected]
        points = _advance(ring, c_points[rejected], room)
        owners = ring.owner[points]
        out[items] = owners
        counts = np.bincount(owners, minlength=num_workers)
        if not (counts > room).any():
            return out


def _reject(
    ring: Ring,
    h: U64Array,
    items: IntArray,
    points: IntArray,
    offered: IntArray,
    room: IntArray,
) -> IntArray:
    """Positions of the offers the over-full workers turn down.

    ``items`` are every offer to a worker with more offers (``offered[w]``, 0 for the
    others) than ``room[w]``. Each such worker keeps the ``room`` offers nearest its points.
    One sort does it: the key packs (worker, ring distance, position of the offer), so it is
    unique and the result does not depend on the sort algorithm.
    """
    n = len(items)
    owner_bits = max(1, (len(ring.workers) - 1).bit_length())
    index_bits = max(1, (n - 1).bit_length())
    dist_bits = 64 - owner_bits - index_bits  # >= 23: workers < 2**17, items <= 2**24
    values = ring.points[points]
    # distance in the top 44 bits: both low parts are _LOW after the |, so they cancel
    dist = (values | _LOW) - h[items]
    dist >>= np.uint64(64 - min(dist_bits, 64 - _INDEX_BITS))
    dist <<= np.uint64(index_bits)
    key = (values & _LOW) << np.uint64(64 - owner_bits)  # the owner, on top
    key |= dist
    key |= np.arange(n, dtype=np.uint64)
    key.sort()
    # sorted by owner, each over-full worker's offers form one run; keep its first `room`
    first = np.cumsum(offered) - offered
    keep_until = first + room
    owners = (key >> np.uint64(64 - owner_bits)).astype(np.intp)
    turned_down = key[np.arange(n) >= keep_until[owners]]
    rejected: IntArray = (turned_down & np.uint64((1 << index_bits) - 1)).astype(np.intp)
    return rejected


def _advance(ring: Ring, points: IntArray, room: IntArray) -> IntArray:
    """Move each point on to the next point (strictly after it) whose owner has room."""
    n = len(ring.points)
    points = points + 1
    points[points == n] = 0
    has_room = room > 0
    active = (~has_room[ring.owner[points]]).nonzero()[0]
    if active.size > 32:  # many: one pass over the ring beats walking them point by point
        free = has_room[ring.owner].nonzero()[0]
        if not free.size:  # unreachable while the caps cover every item
            raise RuntimeError("bounded-load placement ran out of room")
        j = np.searchsorted(free, points[active])
        j[j == free.size] = 0
        points[active] = free[j]
        return points
    while active.size:  # few: walk (each worker passed is full; some worker has room)
        step = points[active] + 1
        step[step == n] = 0
        points[active] = step
        active = active[~has_room[ring.owner[step]]]
    return points


def _check_workers(workers: tuple[object, ...]) -> tuple[str, ...]:
    """Validate worker ids and return them sorted; raise naming the bad entry."""
    if not workers:
        raise ValueError("workers must not be empty")
    if len(workers) > MAX_WORKERS:
        raise ValueError(f"workers must hold at most {MAX_WORKERS} ids, got {len(workers)}")
    for i, worker in enumerate(workers):
        check_id(f"workers[{i}]", worker)
    ordered: list[str] = sorted(workers)  # type: ignore[arg-type]  # all str, checked above
    for a, b in itertools.pairwise(ordered):
        if a == b:
            raise ValueError(f"workers must be unique, {a!r} appears more than once")
    return tuple(ordered)


@functools.lru_cache(maxsize=8)
def _cached_ring(workers: tuple[str, ...]) -> Ring:
    return Ring.build(_check_workers(workers))


def ring_for(workers: Iterable[str]) -> Ring:
    """The ring of a membership, from an LRU cache keyed by the ids as given.

    The ring depends on the set of ids only; their order does not matter.

    Raises:
        TypeError: ``workers`` is a ``str``, or an id is not a ``str``.
        ValueError: no ids, too many, an invalid id, or the same id twice.
    """
    if isinstance(workers, str):
        raise TypeError(f"workers must be a sequence of worker ids, not a str: {workers!r}")
    key = tuple(workers)
    try:
        hash(key)
    except TypeError:
        _check_workers(key)  # raises, naming the unhashable (non-str) entry
        raise
    return _cached_ring(key)


def clear_cache() -> None:
    """Forget every cached ring (for benchmarks and tests)."""
    _cached_ring.cache_clear()

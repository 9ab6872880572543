"""The bounded-load hash ring (``data/hashring.py``): caps, balance, stability."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_redis.data import hashring


def place(items: int, workers: list[str]) -> np.ndarray:
    ring = hashring.ring_for(workers)
    keys = hashring.stream(1234, np.arange(items, dtype=np.int64))
    return hashring.place(ring, keys, hashring.capacities(items, ring))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 2000), st.integers(1, 60))
def test_every_item_placed_and_no_worker_over_max_load(items: int, n: int) -> None:
    workers = [f"w{i}" for i in range(n)]
    owner = place(items, workers)
    assert owner.shape == (items,) and owner.min() >= 0 and owner.max() < n
    loads = np.bincount(owner, minlength=n)
    assert loads.max() <= hashring.max_load(items, n)


@given(st.integers(1, 10**6), st.integers(1, 10**4))
def test_max_load_bounds(items: int, n: int) -> None:
    m = items / n
    cap = hashring.max_load(items, n)
    assert cap >= -(-items // n)  # room for every item
    assert cap <= max(-(-items // n), int(1.25 * m) + 1)  # never past ceil(1.25 m)


def test_capacities_add_up_to_the_items_plus_slack() -> None:
    ring = hashring.ring_for([f"w{i}" for i in range(10)])
    caps = hashring.capacities(1000, ring)
    assert caps.sum() == 1000 + 1000 * 10 // 100
    assert set(caps.tolist()) <= {110, 111}


def test_removing_a_worker_moves_about_its_share() -> None:
    workers = [f"w{i}" for i in range(20)]
    before = place(4000, workers)
    after = place(4000, workers[:-1])
    names_before = np.array(hashring.ring_for(workers).workers)[before]
    names_after = np.array(hashring.ring_for(workers[:-1]).workers)[after]
    moved = np.count_nonzero(names_before != names_after) / 4000
    assert moved < 1 / 20 + 0.05  # its share and little more


def test_the_ring_depends_on_the_set_only() -> None:
    a = place(500, ["x", "y", "z"])
    b = hashring.ring_for(["z", "x", "y"])
    assert b.workers == ("x", "y", "z")
    keys = hashring.stream(1234, np.arange(500, dtype=np.int64))
    assert (hashring.place(b, keys, hashring.capacities(500, b)) == a).all()


@pytest.mark.parametrize(
    ("workers", "error", "match"),
    [("abc", TypeError, "not a str"), ([], ValueError, "must not be empty"),
     (["a", "a"], ValueError, "appears more than once"), (["a", 3], TypeError, "workers\\[1\\]"),
     ([" a"], ValueError, "whitespace")],
)  # fmt: skip
def test_bad_memberships(workers: object, error: type[Exception], match: str) -> None:
    hashring.clear_cache()
    with pytest.raises(error, match=match):
        hashring.ring_for(workers)  # type: ignore[arg-type]


def test_stream_outputs_are_distinct_and_stable() -> None:
    out = hashring.stream(7, np.arange(10_000))
    assert len(np.unique(out)) == 10_000
    assert int(out[0]) == hashring.mix64((7 + hashring.GOLDEN) & hashring.MASK64)


def test_vnodes_per_worker_curve() -> None:
    assert hashring.vnodes_per_worker(900) == 32 == hashring.vnodes_per_worker(50_000)
    assert hashring.vnodes_per_worker(450) == pytest.approx(64, rel=1e-9)
    assert 380 < hashring.vnodes_per_worker(1) < 400
    assert hashring.vnodes_per_worker(100) > hashring.vnodes_per_worker(199)

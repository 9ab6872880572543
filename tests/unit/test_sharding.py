"""Static shards (``data/sharding.py``): ranges, per-epoch order, assignment."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_redis.data.sharding import MAX_SHARDS, DatasetParams, assign, assignment, shard_order


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 700))
def test_shards_tile_the_dataset(total: int, per: int) -> None:
    p = DatasetParams("d", total, per, shuffle=False)
    ranges = [p.shard_range(i) for i in range(p.num_shards)]
    assert ranges[0][0] == 0 and ranges[-1][1] == total
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert all(0 < stop - start <= per for start, stop in ranges)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 300), st.integers(1, 40), st.integers(0, 2**63 - 1), st.integers(0, 50))
def test_shuffled_indices_are_a_permutation_of_the_range(
    total: int, per: int, seed: int, epoch: int
) -> None:
    p = DatasetParams("d", total, per, shuffle=True, seed=seed)
    shard = p.shard(p.num_shards - 1, epoch)
    assert sorted(shard.indices().tolist()) == list(range(shard.start, shard.stop))


def test_order_changes_with_the_epoch_and_is_stable() -> None:
    p = DatasetParams("d", 1000, 10, shuffle=True, seed=3)
    a, b = shard_order(p, 0), shard_order(p, 1)
    assert sorted(a.tolist()) == list(range(100)) and a.tolist() != b.tolist()
    assert shard_order(p, 0).tolist() == a.tolist()
    assert p.shard(4, 0).indices().tolist() != p.shard(4, 1).indices().tolist()
    plain = DatasetParams("d", 1000, 10, shuffle=False)
    assert shard_order(plain, 5).tolist() == list(range(100))
    assert plain.shard(4, 9).indices().tolist() == list(range(40, 50))


def test_assign_gives_every_shard_to_one_worker() -> None:
    p = DatasetParams("d", 1000, 7)
    plan = assign(p, ["c", "a", "b"], 2)
    counts = Counter(s.shard_id for shards in plan.values() for s in shards)
    assert set(plan) == {"a", "b", "c"} and counts == Counter(range(p.num_shards))


def test_assignment_does_not_depend_on_the_epoch_or_the_order_of_workers() -> None:
    p = DatasetParams("d", 1000, 7)
    one = assignment(p, ["a", "b", "c"])
    two = assignment(p, ["c", "b", "a"])
    assert (one.owner == two.owner).all()
    ids0 = set(one.shard_ids("a", 0).tolist())
    assert ids0 == set(one.shard_ids("a", 9).tolist())
    assert one.worker_of(next(iter(ids0))) == "a"
    assert sum(one.loads().values()) == p.num_shards


def test_fewer_shards_than_workers_leaves_some_idle() -> None:
    plan = assign(DatasetParams("d", 3, 1), [f"w{i}" for i in range(8)], 0)
    assert sum(len(v) for v in plan.values()) == 3 and sum(not v for v in plan.values()) >= 5


def test_unknown_worker_is_refused() -> None:
    plan = assignment(DatasetParams("d", 10, 1), ["a"])
    with pytest.raises(ValueError, match="'b' is not one of the 1 workers"):
        plan.index("b")


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [(("", 10, 1), ValueError, "name must not be empty"),
     (("d", 0, 1), ValueError, "total_samples must be between"),
     (("d", 10, 0), ValueError, "samples_per_shard must be between"),
     (("d", True, 1), TypeError, "total_samples must be an int"),
     (("d", MAX_SHARDS + 1, 1), ValueError, "at most"),
     (("d", 10, 1, 1), TypeError, "shuffle must be a bool"),
     (("d", 10, 1, True, -1), ValueError, "seed must be between")],
)  # fmt: skip
def test_bad_params(args: tuple[object, ...], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        DatasetParams(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("shard", "epoch"), [(-1, 0), (10, 0), (0, -1)])
def test_shard_bounds(shard: int, epoch: int) -> None:
    with pytest.raises(ValueError, match="must be between"):
        DatasetParams("d", 10, 1).shard(shard, epoch)


def test_assignment_needs_params() -> None:
    with pytest.raises(TypeError, match="params must be a DatasetParams"):
        assignment(("d", 10, 1), ["a"])  # type: ignore[arg-type]
    assert np.asarray(assignment(DatasetParams("d", 5, 1), ["a"]).owner).tolist() == [0] * 5

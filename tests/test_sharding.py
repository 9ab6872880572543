"""Static shard assignment (pure, no Redis): params, ranges, determinism, coverage, balance,
stability under membership change, per-epoch shuffling and bad input."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_redis.data import hashring
from strata_redis.data.sharding import (
    MAX_SEED,
    MAX_SHARDS,
    MAX_TOTAL_SAMPLES,
    Assignment,
    DatasetParams,
    Shard,
    assign,
    assignment,
    clear_cache,
    shard_order,
    shards_for_worker,
)

REPO = Path(__file__).resolve().parent.parent
PROPERTY = settings(max_examples=60, deadline=None)


def names(n: int, prefix: str = "worker-") -> list[str]:
    return [f"{prefix}{i:04d}" for i in range(n)]


def holders(a: Assignment) -> npt.NDArray[np.object_]:
    """The worker id holding each shard (comparable across memberships)."""
    return np.asarray(a.workers, dtype=object)[a.owner]


def kept_fraction(before: Assignment, after: Assignment) -> float:
    return float(np.mean(holders(before) == holders(after)))


# -- dataset params and shard ranges ------------------------------------------------------


def test_shard_ranges_tile_the_dataset_and_the_tail_is_shorter() -> None:
    params = DatasetParams("d", 25, 10)
    assert params.num_shards == 3
    assert [params.shard_range(i) for i in range(3)] == [(0, 10), (10, 20), (20, 25)]


def test_the_seeds_imagenet_example() -> None:
    params = DatasetParams("imagenet-1k", 1281167, 10000, True, 42)
    assert params.num_shards == 129
    assert params.shard_range(128) == (1280000, 1281167)
    assert len(params.shard(128, 0).indices()) == 1167


def test_samples_per_shard_above_total_is_one_shard() -> None:
    params = DatasetParams("d", 7, 1000, shuffle=False)
    assert params.num_shards == 1
    assert params.shard_range(0) == (0, 7)
    plan = assign(params, ["a", "b", "c"], 0)
    holder = assignment(params, ["a", "b", "c"]).worker_of(0)
    assert plan == {"a": [], "b": [], "c": [], holder: [Shard(0, 0, 7, 0, None)]}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"total_samples": 0}, ValueError, "total_samples must be between 1 and"),
        ({"total_samples": -5}, ValueError, "total_samples .* got -5"),
        ({"total_samples": MAX_TOTAL_SAMPLES + 1}, ValueError, "total_samples"),
        ({"total_samples": 10.0}, TypeError, "total_samples must be an int, got float"),
        ({"total_samples": True}, TypeError, "total_samples must be an int, got bool"),
        ({"samples_per_shard": 0}, ValueError, "samples_per_shard .* got 0"),
        ({"samples_per_shard": -1}, ValueError, "samples_per_shard .* got -1"),
        ({"samples_per_shard": "10"}, TypeError, "samples_per_shard must be an int, got str"),
        ({"shuffle": "yes"}, TypeError, "shuffle must be a bool, got str 'yes'"),
        ({"shuffle": 1}, TypeError, "shuffle must be a bool, got int 1"),
        ({"seed": -1}, ValueError, "seed .* got -1"),
        ({"seed": MAX_SEED + 1}, ValueError, "seed must be between 0 and"),
        ({"seed": 1.5}, TypeError, "seed must be an int, got float"),
        ({"seed": None}, TypeError, "seed must be an int, got NoneType"),
        ({"name": ""}, ValueError, "name must not be empty"),
        ({"name": 7}, TypeError, "name must be a str, got int"),
        ({"name": "bad\nname"}, ValueError, "name must be printable"),
        ({"name": " padded"}, ValueError, "name must not start or end with whitespace"),
        ({"name": "x" * 129}, ValueError, "name must be at most 128 characters"),
        (
            {"total_samples": MAX_SHARDS * 4 + 1, "samples_per_shard": 4},
            ValueError,
            f"samples_per_shard=4 .* into {MAX_SHARDS + 1} shards; at most {MAX_SHARDS}",
        ),
    ],
)
def test_bad_params_are_refused_naming_the_argument(
    kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    args: dict[str, object] = {
        "name": "d",
        "total_samples": 100,
        "samples_per_shard": 10,
        "shuffle": True,
        "seed": 1,
    }
    args.update(kwargs)
    with pytest.raises(error, match=match):
        DatasetParams(**args)  # type: ignore[arg-type]


def test_params_are_frozen_and_compare_by_value() -> None:
    params = DatasetParams("d", 100, 10, True, 3)
    assert params == DatasetParams("d", 100, 10, True, 3)
    assert hash(params) == hash(DatasetParams("d", 100, 10, True, 3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.seed = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("shard_id", "error"), [(-1, ValueError), (10, ValueError), ("1", TypeError)]
)
def test_bad_shard_id_is_refused(shard_id: object, error: type[Exception]) -> None:
    params = DatasetParams("d", 100, 10)
    with pytest.raises(error, match="shard_id"):
        params.shard_range(shard_id)  # type: ignore[arg-type]
    with pytest.raises(error, match="shard_id"):
        params.shard(shard_id, 0)  # type: ignore[arg-type]


# -- shards and their sample order ---------------------------------------------------------


def test_natural_order_without_shuffle() -> None:
    params = DatasetParams("d", 95, 10, shuffle=False, seed=5)
    workers = names(3)
    for epoch in (0, 1, 7):
        for worker in workers:
            shards = shards_for_worker(params, workers, worker, epoch)
            ids = [s.shard_id for s in shards]
            assert ids == sorted(ids)
            for shard in shards:
                assert shard.seed is None
                assert shard.indices().tolist() == list(range(shard.start, shard.stop))
    assert shard_order(params, 3).tolist() == list(range(10))


def test_shuffled_order_changes_every_epoch_and_is_reproducible() -> None:
    params = DatasetParams("d", 10_000, 100, shuffle=True, seed=42)
    workers = names(4)
    orders = [shard_order(params, epoch).tolist() for epoch in range(4)]
    assert len({tuple(o) for o in orders}) == 4
    assert all(sorted(o) == list(range(100)) for o in orders)
    assert shard_order(params, 2).tolist() == orders[2]

    by_epoch = [shards_for_worker(params, workers, "worker-0001", e) for e in range(4)]
    # the worker keeps the same shards from epoch to epoch; only their order changes
    assert len({frozenset(s.shard_id for s in shards) for shards in by_epoch}) == 1
    assert len({tuple(s.shard_id for s in shards) for shards in by_epoch}) == 4
    # and reads them in the global epoch order
    for epoch, shards in enumerate(by_epoch):
        mine = {s.shard_id for s in shards}
        assert [s.shard_id for s in shards] == [i for i in orders[epoch] if i in mine]

    shard = params.shard(17, 0)
    samples = [params.shard(17, e).indices().tolist() for e in range(3)]
    assert len({tuple(s) for s in samples}) == 3
    assert all(sorted(s) == list(range(1700, 1800)) for s in samples)
    assert shard.indices().tolist() == samples[0]
    assert shard.indices().dtype == np.int64
    assert samples[0] != list(range(1700, 1800))


def test_seed_changes_the_shuffle() -> None:
    a = DatasetParams("d", 1000, 10, True, 1)
    b = DatasetParams("d", 1000, 10, True, 2)
    assert shard_order(a, 0).tolist() != shard_order(b, 0).tolist()
    assert a.shard(3, 0).indices().tolist() != b.shard(3, 0).indices().tolist()


def test_shard_is_frozen_with_a_length() -> None:
    shard = DatasetParams("d", 25, 10).shard(2, 0)
    assert shard == Shard(2, 20, 25, 0, 0)
    assert len(shard) == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        shard.start = 0  # type: ignore[misc]


# -- determinism ---------------------------------------------------------------------------

FINGERPRINT_CASES = [
    (DatasetParams("imagenet-1k", 1281167, 10000, True, 42), 8),
    (DatasetParams("tiny", 5, 1, False, 0), 9),
    (DatasetParams("mid", 100_000, 37, True, 2**63 - 1), 37),
    (DatasetParams("big", 10_000, 1, True, 7), 1000),
]


def fingerprint(reverse: bool = False) -> str:
    """A digest of assignments, epoch orders and sample orders over several cases."""
    digest = hashlib.sha256()
    for params, n in FINGERPRINT_CASES:
        workers = names(n)
        if reverse:
            workers.reverse()
        a = assignment(params, workers)
        digest.update(repr(a.workers).encode())
        digest.update(a.owner.astype("<i8").tobytes())
        for epoch in (0, 1, 12345):
            digest.update(shard_order(params, epoch).astype("<i8").tobytes())
            first = shards_for_worker(params, workers, "worker-0000", epoch)
            digest.update(repr(first).encode())
            for shard in first[:2]:
                digest.update(shard.indices().astype("<i8").tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("hash_seed", ["1", "4242"])
def test_same_answer_in_another_process(hash_seed: str) -> None:
    """A fresh interpreter with another str-hash seed (and reversed worker lists) agrees."""
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    code = "from tests.test_sharding import fingerprint; print(fingerprint(reverse=True))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == fingerprint()


def test_known_answers() -> None:
    """Pinned values: a change here changes every deployed assignment, so it must be deliberate."""
    assert [int(x) for x in hashring.stream(0, [0, 1, 2])] == [  # SplitMix64, seed 0
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
        0x06C45D188009454F,
    ]
    params = DatasetParams("golden", 1000, 10, True, 7)
    a = assignment(params, ["a", "b", "c", "d"])
    assert a.loads() == {"a": 25, "b": 25, "c": 24, "d": 26}
    assert a.owner[:20].tolist() == [0, 3, 1, 1, 2, 0, 2, 2, 1, 0, 2, 0, 0, 2, 1, 1, 0, 3, 0, 3]
    assert shard_order(params, 3)[:10].tolist() == [46, 88, 22, 23, 7, 16, 56, 61, 33, 26]
    assert params.shard(5, 3).indices().tolist() == [53, 50, 57, 51, 58, 52, 59, 56, 54, 55]


@PROPERTY
@given(
    n=st.integers(1, 60),
    total=st.integers(1, 3000),
    per=st.integers(1, 200),
    data=st.data(),
)
def test_worker_order_does_not_matter(n: int, total: int, per: int, data: st.DataObject) -> None:
    params = DatasetParams("order", total, per, True, 3)
    workers = names(n)
    shuffled = data.draw(st.permutations(workers))
    a, b = assignment(params, workers), assignment(params, shuffled)
    assert a.workers == b.workers == tuple(sorted(workers))
    assert a.owner.tolist() == b.owner.tolist()
    assert assign(params, workers, 5) == assign(params, shuffled, 5)


def test_cache_gives_the_same_answer_as_a_fresh_build() -> None:
    params = DatasetParams("cache", 20_000, 2, True, 1)
    workers = names(300)
    clear_cache()
    cold = assignment(params, workers).owner.tolist()
    assert hashring.ring_for(workers) is hashring.ring_for(list(workers))
    warm = assignment(params, workers).owner.tolist()
    clear_cache()
    assert cold == warm == assignment(params, tuple(workers)).owner.tolist()


# -- coverage: every sample exactly once per epoch -------------------------------------------


@PROPERTY
@given(
    total=st.integers(1, 4000),
    per=st.integers(1, 700),
    n=st.integers(1, 40),
    epoch=st.integers(0, 2**40),
    shuffle=st.booleans(),
    seed=st.integers(0, MAX_SEED),
)
def test_every_sample_exactly_once_per_epoch(
    total: int, per: int, n: int, epoch: int, shuffle: bool, seed: int
) -> None:
    params = DatasetParams("cover", total, per, shuffle, seed)
    workers = names(n)
    plan = assign(params, workers, epoch)
    assert sorted(plan) == workers
    shards = [shard for shards in plan.values() for shard in shards]
    assert sorted(s.shard_id for s in shards) == list(range(params.num_shards))
    indices = np.concatenate([s.indices() for s in shards])
    assert len(indices) == total  # no padding, no drops
    assert np.array_equal(np.sort(indices), np.arange(total))  # none missing, none twice
    for worker, mine in plan.items():
        assert mine == shards_for_worker(params, workers, worker, epoch)


# -- balance ------------------------------------------------------------------------------


@PROPERTY
@given(num_shards=st.integers(1, 5000), n=st.integers(1, 400))
def test_balance_bound_holds(num_shards: int, n: int) -> None:
    params = DatasetParams("balance", num_shards, 1)
    a = assignment(params, names(n))
    loads = np.bincount(a.owner, minlength=n)
    mean = num_shards / n
    assert loads.sum() == num_shards
    assert loads.max() <= hashring.max_load(num_shards, n) <= math.ceil(1.25 * mean)
    if mean >= 8:
        assert loads.max() <= 1.25 * mean


def test_fewer_shards_than_workers_leaves_some_idle() -> None:
    params = DatasetParams("few", 30, 1)
    plan = assign(params, names(100), 0)
    assert len(plan) == 100
    assert sum(len(s) for s in plan.values()) == 30
    assert max(len(s) for s in plan.values()) == 1
    assert sum(1 for s in plan.values() if not s) == 70


# -- stability under membership change ----------------------------------------------------


def test_worker_failure_recovery() -> None:
    """1,000 workers, 10,000 shards: one fails (the busiest, and two others), one joins."""
    n = 1000
    params = DatasetParams("recovery", 10_000, 1)
    workers = names(n)
    before = assignment(params, workers)
    loads = before.loads()
    mean = params.num_shards / n
    balance = max(loads.values()) / mean
    bar = (1 - 1 / n) - 0.02
    busiest = max(loads, key=lambda w: (loads[w], w))
    for failed in (busiest, workers[0], workers[n // 2]):
        after = assignment(params, [w for w in workers if w != failed])
        kept = kept_fraction(before, after)
        after_balance = max(after.loads().values()) / (params.num_shards / (n - 1))
        print(
            f"\n{failed} fails: {kept:.4%} of shards keep their worker (bar {bar:.2%}); "
            f"balance {balance:.3f} -> {after_balance:.3f} x mean"
        )
        assert kept >= bar
        assert after_balance <= 1.25
        assert set(after.workers) == set(workers) - {failed}
    assert balance <= 1.25

    joined = assignment(params, [*workers, "worker-new"])
    moved = 1 - kept_fraction(before, joined)
    print(f"a join moves {moved:.4%} of shards (1/N = {1 / n:.4%})")
    assert moved <= 2 / n + 0.005
    assert joined.loads()["worker-new"] > 0


@pytest.mark.parametrize(
    ("n", "num_shards", "failures"),
    [
        (2, 10_000, None),
        (3, 10_000, None),
        (10, 10_000, None),
        (100, 10_000, 25),
        (1000, 30_000, 5),
        (1000, 1000, 5),  # one shard per worker: some hold two, some none
    ],
)
def test_stability_and_balance_hold_together(n: int, num_shards: int, failures: int | None) -> None:
    """Any one of n failing keeps >= (1 - 1/n) - 2% of shards in place, within the balance bar."""
    params = DatasetParams(f"stab-{n}", num_shards, 1)
    workers = names(n, prefix=f"host-{n}-")
    before = assignment(params, workers)
    bar = (1 - 1 / n) - 0.02
    bound = hashring.max_load(num_shards, n)
    assert max(before.loads().values()) <= bound
    rng = np.random.default_rng(n)
    chosen = workers if failures is None else list(rng.choice(workers, failures, replace=False))
    worst = 1.0
    for failed in chosen:
        rest = [w for w in workers if w != failed]
        after = assignment(params, rest)
        worst = min(worst, kept_fraction(before, after))
        assert max(after.loads().values()) <= hashring.max_load(num_shards, n - 1)
    joined = assignment(params, [*workers, "joiner"])
    moved = 1 - kept_fraction(before, joined)
    print(f"\nn={n}: worst kept on a failure {worst:.4f} (bar {bar:.4f}); a join moves {moved:.4f}")
    assert worst >= bar
    assert moved <= 2 / (n + 1) + 0.01


def test_only_the_failed_workers_shards_move_when_there_is_room() -> None:
    """With ample capacity (few shards per worker), a failure moves the failed worker's shards
    and almost nothing else."""
    params = DatasetParams("room", 2000, 1)
    workers = names(500)
    before = assignment(params, workers)
    after = assignment(params, workers[1:])
    old, new = holders(before), holders(after)
    moved_elsewhere = (old != new) & (old != workers[0])
    assert moved_elsewhere.sum() <= 0.01 * params.num_shards
    assert not (new == workers[0]).any()


# -- the ring and the placement -----------------------------------------------------------


def test_vnode_schedule_changes_slowly() -> None:
    assert hashring.vnodes_per_worker(900) == hashring.vnodes_per_worker(100_000) == 32
    assert hashring.vnodes_per_worker(200) == 144
    for n in range(1, 1200):
        now, nxt = hashring.vnodes_per_worker(n), hashring.vnodes_per_worker(n + 1)
        assert 0 <= now / nxt - 1 <= min(0.0051, 1 / n + 1e-9)


@PROPERTY
@given(n=st.integers(1, 50), num_items=st.integers(0, 600), seed=st.integers(0, 2**64 - 1))
def test_placement_walks_past_full_workers_only(n: int, num_items: int, seed: int) -> None:
    """Each item sits on the first worker clockwise from its hash that is full or is its own;
    every worker it walked past ended up full."""
    ring = hashring.ring_for(names(n, prefix="p-"))
    keys = hashring.stream(seed, np.arange(num_items))
    caps = hashring.capacities(num_items, ring)
    owner = hashring.place(ring, keys, caps)
    loads = np.bincount(owner, minlength=n)
    assert (loads <= caps).all()
    low = np.uint64((1 << 20) - 1)
    start = ring.successor(keys | low)
    top = ring.points >> np.uint64(20)
    assert np.array_equal(
        start, np.searchsorted(top, keys >> np.uint64(20), side="right") % len(top)
    )
    for item in range(num_items):
        i = int(start[item])
        while ring.owner[i] != owner[item]:
            assert loads[ring.owner[i]] == caps[ring.owner[i]]
            i = (i + 1) % len(ring.points)


def test_capacities_cover_every_item_and_respect_the_bound() -> None:
    for n in (1, 2, 3, 7, 10, 99, 1000):
        ring = hashring.ring_for(names(n, prefix="c-"))
        for items in (0, 1, n - 1, n, n + 1, 8 * n, 10 * n + 3, 12345):
            caps = hashring.capacities(items, ring)
            assert caps.sum() >= items
            assert caps.max() <= max(1, hashring.max_load(items, n))


# -- bad input to the assignment functions -------------------------------------------------

PARAMS = DatasetParams("d", 100, 10)


@pytest.mark.parametrize(
    ("workers", "error", "match"),
    [
        ([], ValueError, "workers must not be empty"),
        (["a", "b", "a"], ValueError, "workers must be unique, 'a' appears more than once"),
        ("worker-1", TypeError, "workers must be a sequence of worker ids, not a str"),
        (["ok", " padded"], ValueError, r"workers\[1\] must not start or end with whitespace"),
        (["ok", "bad\x00"], ValueError, r"workers\[1\] must be printable"),
        ([5, "a"], TypeError, r"workers\[0\] must be a str, got int"),
        ([["a"]], TypeError, r"workers\[0\] must be a str, got list"),
        (["a", ""], ValueError, r"workers\[1\] must not be empty"),
    ],
)
def test_bad_workers_are_refused(workers: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        assignment(PARAMS, workers)  # type: ignore[arg-type]
    with pytest.raises(error, match=match):
        assign(PARAMS, workers, 0)  # type: ignore[arg-type]


def test_too_many_workers_is_refused() -> None:
    with pytest.raises(ValueError, match="workers must hold at most 100000 ids, got 100001"):
        assignment(PARAMS, names(100_001))


@pytest.mark.parametrize(
    ("epoch", "error"), [(-1, ValueError), (2**63, ValueError), (1.0, TypeError), (True, TypeError)]
)
def test_bad_epoch_is_refused(epoch: object, error: type[Exception]) -> None:
    workers = ["a", "b"]
    with pytest.raises(error, match="epoch"):
        assign(PARAMS, workers, epoch)  # type: ignore[arg-type]
    with pytest.raises(error, match="epoch"):
        shards_for_worker(PARAMS, workers, "a", epoch)  # type: ignore[arg-type]
    with pytest.raises(error, match="epoch"):
        shard_order(PARAMS, epoch)  # type: ignore[arg-type]
    with pytest.raises(error, match="epoch"):
        PARAMS.shard(0, epoch)  # type: ignore[arg-type]


def test_unknown_worker_and_bad_params_are_refused() -> None:
    with pytest.raises(ValueError, match="worker_id 'c' is not one of the 2 workers"):
        shards_for_worker(PARAMS, ["a", "b"], "c", 0)
    with pytest.raises(TypeError, match="worker_id must be a str, got int"):
        shards_for_worker(PARAMS, ["a", "b"], 3, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="params must be a DatasetParams, got dict"):
        assignment({"name": "d"}, ["a"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shard_id"):
        assignment(PARAMS, ["a"]).worker_of(10)

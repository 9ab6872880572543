"""The walks (``data/walks/``) and ``ShardStream``'s bookkeeping, through a fake
``StreamHost`` and an in-memory lease pool: which samples each rank gets, in which batches,
what the data position says, and when leases complete or go back. (The lease scripts
themselves are the process tier's: tests/test_leases.py, tests/test_lockstep.py.)"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterator
from itertools import zip_longest
from pathlib import Path

import numpy as np
import pytest

from strata_redis.data import walks as walks_package
from strata_redis.data.sharding import DatasetParams, assignment
from strata_redis.data.stream import ShardStream
from strata_redis.data.walks import LockstepWalk, WalkSpec
from strata_redis.data.walks.leases import leases_walk
from strata_redis.data.walks.lockstep import agree_quota
from strata_redis.data.walks.static import static_walk
from strata_redis.errors import EpochUnfinishedError, RoundBrokenError

from .fakes import FakeHost, LeasePool, RecordingLedger, fake_context, use_pool

# 11 shards of 10 samples, the last of 3; batches of 4 cut shards unevenly
TOTAL, PER, BATCH = 103, 10, 4


@pytest.fixture
def params() -> DatasetParams:
    return DatasetParams("d", TOTAL, PER, shuffle=True, seed=7)


def samples(batches: list[np.ndarray]) -> Counter[int]:
    return Counter(int(i) for b in batches for i in b)


# -- ShardStream's arguments ------------------------------------------------------------------
def test_stream_refuses_a_bad_mode(params: DatasetParams) -> None:
    with pytest.raises(ValueError, match="mode must be 'leases' or 'static'"):
        ShardStream(FakeHost(LeasePool(params)), params, BATCH, mode="random")


@pytest.mark.parametrize("flag", ["track_consumption", "wait_for_others", "lockstep", "drop_last"])
def test_stream_flags_must_be_bools(params: DatasetParams, flag: str) -> None:
    with pytest.raises(TypeError, match=f"{flag} must be a bool"):
        ShardStream(FakeHost(LeasePool(params)), params, BATCH, **{flag: 1})  # type: ignore[arg-type]


def test_lockstep_needs_leases_mode(params: DatasetParams) -> None:
    with pytest.raises(ValueError, match="lockstep=True needs mode='leases'"):
        ShardStream(FakeHost(LeasePool(params)), params, BATCH, mode="static", lockstep=True)


@pytest.mark.parametrize("size", [0, -1, 2**31 + 1])
def test_stream_batch_size_bounds(params: DatasetParams, size: int) -> None:
    with pytest.raises(ValueError, match="batch_size must be between 1 and"):
        ShardStream(FakeHost(LeasePool(params)), params, size)


def test_lockstep_never_waits_for_others(params: DatasetParams) -> None:
    stream = ShardStream(FakeHost(LeasePool(params)), params, BATCH, lockstep=True)
    assert stream.walk == "lockstep" and stream.wait_for_others is False


# -- the leases walk ------------------------------------------------------------------------
def test_leases_walk_trains_every_sample_once(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    host = FakeHost(pool)
    stream = ShardStream(host, params, BATCH)
    assert stream.position is None
    batches = list(stream)
    assert samples(batches) == Counter(range(TOTAL))
    assert all(1 <= len(b) <= BATCH for b in batches)
    # a batch never spans shards here: 3 batches per shard of 10 (4, 4, 2), one of 3
    assert len(batches) == 10 * 3 + 1
    assert pool.done == set(range(params.num_shards)) and not pool.held
    assert [c[1] for c in pool.completed] == list(range(params.num_shards))
    assert all(prefetch for _, _, prefetch in pool.completed)  # the next lease rides along
    assert pool.kept == 1  # the drained epoch's record is kept once
    assert host.statuses == ["training", "idle"]
    assert stream.position is not None
    assert stream.position.own == set(range(params.num_shards)) and not stream.position.partial


def test_leases_walk_yields_each_shard_in_its_epoch_order(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params, epoch=3)
    use_pool(monkeypatch, pool)
    batches = list(ShardStream(FakeHost(pool, epoch=3), params, BATCH))
    flat = np.concatenate(batches)
    expected = np.concatenate([params.shard(s, 3).indices() for s in range(params.num_shards)])
    assert flat.tolist() == expected.tolist()


def test_leases_walk_starts_restored_shards_at_their_offset(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params, done={0, 1}, offsets={2: 6})
    use_pool(monkeypatch, pool)
    stream = ShardStream(FakeHost(pool), params, BATCH)
    it = iter(stream)
    first = next(it)
    position = stream.position
    assert position is not None and position.base == {0, 1}
    assert stream.starts == {2: 6}
    # shard 2 from sample 6 on: the restored part is in the model already
    assert first.tolist() == params.shard(2, 0).indices()[6:10].tolist()
    assert position.partial[2] == 10
    rest = list(it)
    seen = samples([first, *rest])
    skipped = {int(i) for s in (0, 1) for i in params.shard(s, 0).indices()}
    skipped |= {int(i) for i in params.shard(2, 0).indices()[:6]}
    assert set(seen) == set(range(TOTAL)) - skipped and max(seen.values()) == 1


def test_a_lease_taken_back_is_dropped_and_trained_by_whoever_holds_it(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    stream = ShardStream(FakeHost(pool), params, BATCH)
    it = iter(stream)
    next(it)  # shard 0's first batch
    pool.take_back(0)  # declared failed meanwhile: shard 0 is in the pool again
    rest = list(it)
    # shard 0 is trained again from its lease's start (this rank leases it again here)
    assert [s for _, s, _ in pool.completed].count(0) == 1
    assert pool.done == set(range(params.num_shards))
    assert samples(rest) == Counter(range(TOTAL))


def test_without_waiting_an_iteration_ends_when_others_hold_the_rest(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params)
    made = use_pool(monkeypatch, pool)
    other = FakeHost(pool, worker_id="w1", members=("w0", "w1"))
    theirs = iter(ShardStream(other, params, BATCH))
    next(theirs)  # w1 holds shard 0
    mine = list(ShardStream(FakeHost(pool, members=("w0", "w1")), params, BATCH,
                            wait_for_others=False))  # fmt: skip
    assert pool.waits == 0 and 0 in pool.held and made["w1"].pool is pool
    assert set(samples(mine)) == set(range(PER, TOTAL))


def test_waiting_picks_up_a_failed_holders_shard(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    dead = iter(ShardStream(FakeHost(pool, worker_id="w1", members=("w0", "w1")), params, 4))
    next(dead)  # w1 holds shard 0, then dies
    pool.on_wait = lambda worker: pool.take_back(0) if 0 in pool.held else None
    mine = list(ShardStream(FakeHost(pool, members=("w0", "w1")), params, BATCH))
    assert pool.waits == 1
    assert pool.done == set(range(params.num_shards))
    assert samples(mine) == Counter(range(TOTAL))


def test_a_broken_round_stops_the_walk_and_hands_its_lease_back(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    host = FakeHost(pool)
    it = iter(ShardStream(host, params, BATCH))
    next(it)
    host.break_round()
    with pytest.raises(RoundBrokenError, match="round 1"):
        next(it)
    assert not pool.held and pool.todo[0] == 0  # back in the pool, from the lease's start
    assert host.statuses == ["training"]


# -- consumption tracking ---------------------------------------------------------------------
def test_tracked_position_moves_only_with_consumed_batches(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    stream = ShardStream(FakeHost(pool), params, BATCH, track_consumption=True)
    it = iter(stream)
    got = [next(it) for _ in range(3)]  # shard 0 in full: 4 + 4 + 2
    position = stream.position
    assert position is not None
    assert sum(map(len, got)) == PER and stream.in_flight == 3
    assert position.partial == {} and pool.completed == []
    stream.consumed(2)
    assert position.partial == {0: 8} and pool.completed == [] and stream.in_flight == 1
    next(it)  # shard 1's first batch: shard 0's end waits behind its last batch
    stream.consumed(1)
    assert [s for _, s, _ in pool.completed] == [0]
    assert position.own == {0} and 0 not in position.partial


def test_consumed_more_than_handed_out_is_refused(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    stream = ShardStream(FakeHost(pool), params, BATCH, track_consumption=True)
    it = iter(stream)
    next(it)
    with pytest.raises(ValueError, match="2 batches reported consumed, but fewer"):
        stream.consumed(2)
    with pytest.raises(ValueError, match="batches must be between 0"):
        stream.consumed(-1)


def test_consumed_without_tracking_is_a_no_op(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    stream = ShardStream(FakeHost(pool), params, BATCH)
    stream.consumed(5)  # nothing handed out, nothing tracked: no error
    it = iter(stream)
    next(it)
    assert stream.in_flight == 0
    assert stream.position is not None and stream.position.partial == {0: 4}


def test_finish_now_completes_handed_out_shards_once(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    stream = ShardStream(FakeHost(pool), params, BATCH, track_consumption=True)
    it = iter(stream)
    for _ in range(4):
        next(it)  # shard 0 whole, shard 1's first batch
    assert pool.completed == []
    assert stream.finish_now() is True
    assert [s for _, s, _ in pool.completed] == [0]
    assert stream.finish_now() is False
    stream.consumed(3)  # the position still moves only now
    assert stream.position is not None and stream.position.own == {0}
    assert [s for _, s, _ in pool.completed] == [0]  # not completed twice


# -- round changes ----------------------------------------------------------------------------
def test_rebase_takes_the_done_shards_less_those_in_flight(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    host = FakeHost(pool)
    stream = ShardStream(host, params, BATCH, track_consumption=True)
    it = iter(stream)
    next(it)
    stream.rebase()  # the same round: nothing
    assert stream.position is not None and stream.position.base == set()
    pool.done |= {0, 5, 6}
    host.round_number = 2
    stream.rebase()
    assert stream.position.base == {5, 6}  # shard 0's batch is not consumed yet


def test_undone_counts_only_walks_that_did_not_wait(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params, done={1, 2})
    use_pool(monkeypatch, pool)
    waiting = ShardStream(FakeHost(pool), params, BATCH)
    assert waiting.undone() == 0
    hasty = ShardStream(FakeHost(pool), params, BATCH, wait_for_others=False)
    assert hasty.undone() == 0  # no walk yet
    next(iter(hasty))
    assert hasty.undone() == params.num_shards - 2


# -- the static walk --------------------------------------------------------------------------
def test_static_walks_cover_the_epoch_once_between_the_members(params: DatasetParams) -> None:
    members = ("a", "b", "c")
    plan = assignment(params, list(members))
    seen: Counter[int] = Counter()
    for me in members:
        host = FakeHost(LeasePool(params), worker_id=me, members=members)
        batches = list(ShardStream(host, params, BATCH, mode="static"))
        mine = {s.shard_id for s in plan.shards(me, 0)}
        expected = {int(i) for s in mine for i in params.shard(s, 0).indices()}
        assert set(samples(batches)) == expected
        seen.update(samples(batches))
    assert seen == Counter(range(TOTAL))


def test_static_walk_skips_done_shards_and_starts_at_offsets(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    members = ("a",)
    pool = LeasePool(params, done={3}, offsets={4: 7})
    made = use_pool(monkeypatch, pool)
    host = FakeHost(pool, worker_id="a", members=members)
    stream = ShardStream(host, params, BATCH, mode="static")
    got = samples(list(stream))
    assert not set(got) & {int(i) for i in params.shard(3, 0).indices()}
    assert set(got) & set(params.shard(4, 0).indices().tolist()) == set(
        params.shard(4, 0).indices()[7:].tolist()
    )
    assert not made and not pool.completed  # no leases
    assert stream.position is not None and stream.position.own == set(range(11)) - {3}


# -- the lockstep walk ------------------------------------------------------------------------
def lockstep_run(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch, drop_last: bool, world: int = 3
) -> tuple[list[list[np.ndarray]], list[ShardStream], LeasePool]:
    """``world`` ranks walking one epoch in turns, one batch each, on one pool."""
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    ctx = fake_context()
    members = tuple(f"w{i}" for i in range(world))
    streams = [
        ShardStream(FakeHost(pool, worker_id=m, members=members, context=ctx), params, BATCH,
                    lockstep=True, drop_last=drop_last)
        for m in members
    ]  # fmt: skip
    its: list[Iterator[np.ndarray]] = [iter(s) for s in streams]
    out: list[list[np.ndarray]] = [[] for _ in members]
    for step in zip_longest(*its):
        for rank, batch in enumerate(step):
            if batch is not None:
                out[rank].append(batch)
    return out, streams, pool


def test_lockstep_ranks_get_the_same_full_batches(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, streams, pool = lockstep_run(params, monkeypatch, drop_last=True)
    per_round = 3 * BATCH
    quota = TOTAL // per_round
    assert [s.quota for s in streams] == [quota] * 3
    assert [len(b) for b in out] == [quota] * 3
    assert all(len(b) == BATCH for batches in out for b in batches)
    seen = samples([b for batches in out for b in batches])
    assert max(seen.values()) == 1  # none twice
    assert TOTAL - len(seen) == TOTAL - quota * per_round < per_round  # dropped: under a round
    assert all(s.undone() == 0 for s in streams) and pool.kept == 3  # the quota was met


def test_lockstep_pads_instead_of_dropping(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, _, _ = lockstep_run(params, monkeypatch, drop_last=False)
    per_round = 3 * BATCH
    quota = -(-TOTAL // per_round)
    assert [len(b) for b in out] == [quota] * 3
    assert all(len(b) == BATCH for batches in out for b in batches)
    seen = samples([b for batches in out for b in batches])
    assert set(seen) == set(range(TOTAL))  # every sample
    assert sum(seen.values()) - TOTAL == quota * per_round - TOTAL < per_round


def test_lockstep_hands_back_what_its_quota_does_not_need(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, pool = lockstep_run(params, monkeypatch, drop_last=True)
    cut = [(w, s, o) for w, s, o in pool.released if o is not None]
    assert cut and all(0 < o < PER for _, _, o in cut)
    # completions made as batches go out never lease a shard the walk did not ask for
    assert pool.completed and not any(prefetch for _, _, prefetch in pool.completed)


def test_the_first_member_fixes_the_quota(params: DatasetParams) -> None:
    pool = LeasePool(params)
    ctx = fake_context()
    members = ("w0", "w1")
    first, late = FakeHost(pool, "w0", members, ctx), FakeHost(pool, "w1", members, ctx)
    assert agree_quota(WalkSpec(params, 0, BATCH), first) == 12
    # the late member's record has shards done already: it still gets the agreed quota
    done = frozenset({0, 1, 2, 3, 4})
    assert agree_quota(WalkSpec(params, 0, BATCH, done), late) == 12
    padded = WalkSpec(params, 0, BATCH, done, drop_last=False)
    assert agree_quota(padded, first) == -(-(TOTAL - 5 * PER) // (2 * BATCH))
    key = ctx.keys.lease_keys("d", 0).lockstep
    assert ctx.client.hgetall(key) == {"1": "12", "1:pad": "7"}
    assert ctx.client.ttl(key) > 0


def test_quota_counts_restored_offsets_as_trained(params: DatasetParams) -> None:
    spec = WalkSpec(params, 0, BATCH, starts={0: 9})  # 9 samples of shard 0 restored
    assert agree_quota(spec, FakeHost(LeasePool(params))) == (TOTAL - 9) // BATCH


def test_lockstep_ends_when_the_round_changes(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    host = FakeHost(pool)
    it = iter(ShardStream(host, params, BATCH, lockstep=True))
    for _ in range(3):  # shard 0's ten samples and two of shard 1
        next(it)
    host.round_number = 2
    with caplog.at_level(logging.WARNING, "strata_redis.data"):
        rest = list(it)
    # the lease in hand is cut to its end (8 samples of shard 1), then no other is taken
    assert [len(b) for b in rest] == [BATCH, BATCH]
    assert "the round changed mid-epoch" in caplog.text
    assert pool.done == {0, 1} and not pool.held and len(pool.todo) == params.num_shards - 2


def test_lockstep_refuses_a_pool_done_under_its_quota(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    stream = ShardStream(FakeHost(pool), params, BATCH, lockstep=True)
    it = iter(stream)
    next(it)
    pool.done = set(range(params.num_shards))  # another walk finished the epoch meanwhile
    pool.todo.clear()
    with pytest.raises(EpochUnfinishedError, match="quota unmet"):
        list(it)


def test_a_resumed_position_is_carried_until_its_shards_are_done(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The offsets a fresh round resumed from stay in the stream's position (before the
    first walk, and in each walk of that epoch) until those shards are done, so a checkpoint
    of a smaller round never drops a departed rank's half-read shard; a lease of one taken
    back falls back to the resumed offset (already in the model), not to nothing."""
    pool = LeasePool(params, done={0}, offsets={1: 3, 2: 7}, restored={1: 3, 2: 7})
    use_pool(monkeypatch, pool)
    host = FakeHost(pool, restored={params.name: (0, {0}, {1: 3, 2: 7})})
    stream = ShardStream(host, params, BATCH)
    before = stream.position
    assert before is not None and before.done() == {0} and before.partial == {1: 3, 2: 7}
    walk = iter(stream)
    next(walk)  # shard 1's first batch after its offset; shard 2 not leased by anyone yet
    assert stream.position is not None and stream.position.partial[2] == 7
    assert stream.position.partial[1] > 3
    pool.take_back(1)  # declared failed meanwhile: shard 1 goes back to the pool
    stream.dropped(1)
    assert stream.position.partial[1] == 3  # the resumed offset, not dropped


def test_a_worker_that_joined_without_resuming_carries_the_restored_offsets(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker admitted into a later round of the resumed epoch (its host resumed nothing)
    carries the epoch's restored offsets all the same (the epoch's record has them, not the
    resuming processes' memory): a checkpoint its round writes after the resumed members
    left still holds the half-read shards nobody leased yet."""
    pool = LeasePool(params, done={0, 1}, offsets={1: 3, 9: 7}, restored={1: 3, 9: 7})
    use_pool(monkeypatch, pool)  # (shard 1 was finished by a member of the resumed round)
    stream = ShardStream(FakeHost(pool), params, BATCH)
    assert stream.position is None  # (it resumed nothing)
    next(iter(stream))  # shard 2's first batch
    position = stream.position
    assert position is not None and position.partial[9] == 7  # not leased by anyone yet
    assert 1 not in position.partial and position.done() == {0, 1}


def test_the_restored_offsets_are_carried_in_their_epoch_only(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Epoch 0's restored offsets are not carried by a walk of epoch 1 (its positions would
    then claim samples of epoch 1 trained that nobody trained)."""
    pool = LeasePool(params, 1, restored={9: 7}, restored_epoch=0)
    use_pool(monkeypatch, pool)
    stream = ShardStream(FakeHost(pool, epoch=1), params, BATCH)
    next(iter(stream))
    assert stream.carried == {}
    assert stream.position is not None and 9 not in stream.position.partial


# -- the walks through their narrow interface (data/walks/base.py), no stream -----------------
def test_leases_walk_reports_each_batch_and_shard_end_to_its_ledger(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params, offsets={1: 6})
    use_pool(monkeypatch, pool)
    ledger = RecordingLedger()
    batches = list(leases_walk(WalkSpec(params, 0, BATCH), ledger, FakeHost(pool)))
    assert ledger.calls[:6] == [
        ("trained_before", 0), ("handed", [(0, 4)]), ("handed", [(0, 8)]),
        ("handed", [(0, 10)]), ("shard_end", 0), ("trained_before", 1),
    ]  # fmt: skip
    assert ledger.of("handed")[3:5] == [[(1, 10)], [(2, 4)]]  # shard 1 from its offset, 6
    assert ledger.of("shard_end") == list(range(params.num_shards))
    assert sum(map(len, batches)) == TOTAL - 6 and pool.kept == 1
    assert not ledger.of("dropped")


def test_leases_walk_reports_a_lease_taken_back_as_dropped(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    ledger = RecordingLedger()
    it = leases_walk(WalkSpec(params, 0, BATCH), ledger, FakeHost(pool))
    next(it)
    pool.take_back(0)
    list(it)
    assert ledger.of("dropped") == [0]
    # its end is reported once: when this walk leased it again and trained it whole
    assert ledger.of("shard_end").count(0) == 1 and ledger.of("shard_end")[-1] == 0


def test_leases_walk_runs_held_completions_before_it_waits(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the epoch's tail nothing can be leased while this walk's own completions wait for
    the trainer: the walk runs them (``finish_now``) instead of waiting on itself."""
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    ledger = RecordingLedger(hold=True)
    list(leases_walk(WalkSpec(params, 0, BATCH), ledger, FakeHost(pool)))
    assert ledger.of("finish_now") == [True, False]
    assert pool.done == set(range(params.num_shards)) and pool.waits == 0 and pool.kept == 1


def test_leases_walk_without_waiting_ends_when_others_hold_the_rest(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    other = leases_walk(WalkSpec(params, 0, BATCH), RecordingLedger(), FakeHost(pool, "w1"))
    next(other)  # w1 holds shard 0
    ledger = RecordingLedger()
    spec = WalkSpec(params, 0, BATCH, wait_for_others=False)
    list(leases_walk(spec, ledger, FakeHost(pool)))
    assert pool.waits == 0 and pool.kept == 0  # not drained: nothing kept
    assert ledger.of("shard_end") == list(range(1, params.num_shards))


def test_static_walk_reads_the_done_shards_and_offsets_from_its_spec(
    params: DatasetParams,
) -> None:
    members = ("a", "b")
    plan = assignment(params, list(members))
    mine = [s.shard_id for s in plan.shards("a", 0)]
    skip, start = mine[0], mine[1]
    ledger = RecordingLedger()
    spec = WalkSpec(params, 0, BATCH, frozenset({skip}), {start: 7})
    batches = list(static_walk(spec, ledger, FakeHost(LeasePool(params), "a", members)))
    assert ledger.of("shard_end") == mine[1:] == ledger.of("trained_before")
    first = ledger.of("handed")[0]
    assert first == [(start, 10)]  # from its offset: samples 7..9 of a shard of 10
    assert batches[0].tolist() == params.shard(start, 0).indices()[7:].tolist()


def test_lockstep_walk_keeps_its_quota_and_takings_between_walks(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A walk again in the same (epoch, round) takes only what is left of its quota: the
    walk's own state, not the stream's."""
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    host, walk = FakeHost(pool), LockstepWalk()
    assert walk.quota is None and not walk.quota_met
    first = walk(WalkSpec(params, 0, BATCH), RecordingLedger(), host)
    next(first), next(first)
    first.close()  # the loop left the walk: its lease goes back
    quota = TOTAL // BATCH
    # a lease counts whole once taken (shard 0's ten samples, its end still in the carry)
    assert walk.quota == quota and walk.taken == {(0, 1): PER} and not walk.quota_met
    again = list(walk(WalkSpec(params, 0, BATCH), RecordingLedger(), host))
    assert len(again) == (quota * BATCH - PER) // BATCH and walk.quota_met
    assert walk.taken == {(0, 1): quota * BATCH}


def test_a_tracked_stream_keeps_consumed_batches_of_a_lease_taken_back(
    params: DatasetParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``track_consumption`` the position moves only as batches are consumed: a lease
    taken back drops nothing the trainer already took."""
    pool = LeasePool(params)
    use_pool(monkeypatch, pool)
    stream = ShardStream(FakeHost(pool), params, BATCH, track_consumption=True)
    it = iter(stream)
    next(it)
    stream.consumed(1)
    pool.take_back(0)
    next(it)  # the walk sees the lease gone and goes on with shard 1
    assert stream.position is not None and stream.position.partial[0] == 4


def test_no_walk_imports_the_stream() -> None:
    """The stream imports the walks, never the other way (not even for annotations)."""
    walks = Path(walks_package.__file__).parent
    for path in sorted(walks.glob("*.py")):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import)\s+\S*stream\b", text, re.M), path
        assert "ShardStream" not in text and "StreamHost" not in text, path

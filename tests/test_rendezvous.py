"""The elastic rendezvous, call by call: ranks, the early close when everyone is back, a member
lost while a round joins or runs, late arrivals, and the same answers when the membership
events a round reads were trimmed from their stream before it read them (it then scans its
members in steps). Each join here is one script call (no waiting), so every step is seen."""

from __future__ import annotations

import time
from typing import Any

import pytest

import strata_redis
from strata_redis.coordination import Rendezvous, Round, Worker
from strata_redis.errors import RoundBrokenError
from strata_redis.scripts import check
from strata_redis.status import Status

pytestmark = pytest.mark.both_backends


def _join(
    rdzv: Rendezvous,
    worker: Worker,
    leaving: int = 0,
) -> Any:
    """One call of the join script for ``worker`` (following a moved round): its payload,
    or the error its status code maps to."""
    guess = rdzv.current_round()
    while True:
        reply = rdzv.join_step(worker.worker_id, worker.incarnation, guess, leaving)
        if int(reply[0]) == Status.ROUND_MOVED:
            guess = int(reply[1])
            continue
        return check(reply, {"job_id": rdzv.context.job_id, "worker_id": worker.worker_id})


def _workers(job: strata_redis.Job, n: int, prefix: str = "w") -> list[Worker]:
    return [job.register_worker(f"{prefix}{i:03d}", heartbeat_interval=None) for i in range(n)]


def _round_of(rdzv: Rendezvous, worker: Worker) -> Round:
    return rdzv.join(worker.worker_id, worker.incarnation)


def test_a_round_closes_with_dense_ranks_in_arrival_order(job: strata_redis.Job) -> None:
    workers = _workers(job, 5)
    rdzv = Rendezvous(job.context, min_workers=5, max_workers=5, timeout=5)
    for w in workers[:4]:
        assert _join(rdzv, w)[0] == "joining"
    closed = _join(rdzv, workers[4])
    assert closed[0] == "closed" and closed[1:4] == [1, 4, 5]  # round 1, rank 4 of 5
    for i, w in enumerate(workers):
        got = _round_of(rdzv, w)
        assert (got.number, got.rank, got.world_size, got.fresh) == (1, i, 5, True)
        assert got.members == tuple(w.worker_id for w in workers)
    assert job.client.hget(job.keys.round_ranks(1), "w002") == str(workers[2].incarnation)


def test_survivors_close_the_next_round_as_soon_as_all_are_back(job: strata_redis.Job) -> None:
    workers = _workers(job, 6)
    rdzv = Rendezvous(job.context, min_workers=2, max_workers=6, last_call=600, timeout=5)
    for w in workers:
        _join(rdzv, w)
    first = _round_of(rdzv, workers[0])
    assert first.world_size == 6
    workers[2].leave()
    with pytest.raises(RoundBrokenError) as err:
        rdzv.check(first)
    assert (err.value.culprit, err.value.reason) == ("w002", "left")
    survivors = [w for w in workers if w.worker_id != "w002"]
    replies = [_join(rdzv, w, leaving=1) for w in survivors]
    # no last-call wait (600 s): the round closed at the fifth survivor's join
    assert [r[0] for r in replies] == ["joining"] * 4 + ["closed"]
    second = [_round_of(rdzv, w) for w in survivors]
    assert {(r.number, r.world_size, r.fresh, r.failure_restarts) for r in second} == {
        (2, 5, False, 0)  # ended by a leave: not a failure restart
    }
    # the previous round's members keep their order
    assert second[0].members == tuple(w.worker_id for w in survivors)
    assert [r.rank for r in second] == [0, 1, 2, 3, 4]


def test_a_member_lost_while_the_round_joins_is_dropped(job: strata_redis.Job) -> None:
    workers = _workers(job, 4)
    rdzv = Rendezvous(job.context, min_workers=3, max_workers=3, timeout=5)
    assert _join(rdzv, workers[0])[0] == "joining"
    assert _join(rdzv, workers[1])[0] == "joining"
    workers[0].leave()
    assert _join(rdzv, workers[2])[:3] == ["joining", 1, 2]  # w000 dropped: 2 of 3
    closed = _join(rdzv, workers[3])
    assert closed[0] == "closed"
    assert rdzv.members(1) == ("w001", "w002", "w003")


def test_a_late_arrival_waits_then_breaks_a_round_that_lost_a_member(
    job: strata_redis.Job,
) -> None:
    workers = _workers(job, 4)
    rdzv = Rendezvous(job.context, min_workers=3, max_workers=3, timeout=5)
    for w in workers[:3]:
        _join(rdzv, w)
    assert _join(rdzv, workers[3])[0] == "waiting"  # round 1 runs whole
    first = _round_of(rdzv, workers[0])
    workers[1].leave()
    with pytest.raises(RoundBrokenError):
        rdzv.check(first)  # a member's heartbeat thread saw the loss first
    reply = _join(rdzv, workers[3])  # it sees the round broken: round 2 opens with it
    assert reply[:3] == ["joining", 2, 1]
    assert rdzv.state()["broken"] == "w001"


def test_a_loss_whose_event_was_trimmed_is_still_found(redis_url: str, job_id: str) -> None:
    """The membership stream keeps ~100 events here: the member's leave is trimmed away by
    300 registrations before any rendezvous call reads it; the round scans its members."""
    job = strata_redis.connect(redis_url, job_id, events_cap=100)
    try:
        workers = _workers(job, 3)
        rdzv = Rendezvous(job.context, min_workers=3, max_workers=3, timeout=5)
        for w in workers:
            _join(rdzv, w)
        first = _round_of(rdzv, workers[0])
        rdzv.check(first)  # whole
        workers[1].leave()
        _workers(job, 300, prefix="other")
        assert job.client.xlen(job.keys.events) < 300  # trimmed
        with pytest.raises(RoundBrokenError) as err:
            rdzv.check(first)
        assert err.value.culprit == "w001"
        # and while a round joins: w000 leaves, its event trimmed, before w002 joins
        _join(rdzv, workers[0], leaving=1)
        workers[0].leave()
        _workers(job, 300, prefix="more")
        assert _join(rdzv, workers[2], leaving=1)[:3] == ["joining", 2, 1]  # w000 dropped
    finally:
        job.close()


def test_review_grows_a_round_for_a_live_waiting_worker(job: strata_redis.Job) -> None:
    workers = _workers(job, 3)
    quick = Rendezvous(job.context, min_workers=2, max_workers=4, last_call=0.001)
    for w in workers[:2]:
        _join(quick, w)
    time.sleep(0.01)  # the last call (1 ms) passes
    first = _round_of(quick, workers[0])
    assert first.world_size == 2
    assert _join(quick, workers[2])[0] == "waiting"
    assert quick.review(first, epoch=1) is False  # it grows: w002 waits
    assert quick.review(first, epoch=1) is False  # decided once, the same for every member
    assert quick.current_round() == 2
    patient = Rendezvous(job.context, min_workers=2, max_workers=4, last_call=600, timeout=5)
    replies = [_join(patient, w) for w in workers]
    assert [r[0] for r in replies] == ["joining", "joining", "closed"]  # all in: no last call
    second = _round_of(patient, workers[2])
    assert (second.world_size, second.growth_restarts, second.rank) == (3, 1, 2)
    assert patient.review(second, epoch=2) is True  # nobody waits: it goes on


def test_a_member_replaced_while_the_round_joins_is_in_it_once(job: strata_redis.Job) -> None:
    workers = _workers(job, 3)
    rdzv = Rendezvous(job.context, min_workers=3, max_workers=3, timeout=5)
    _join(rdzv, workers[0])
    _join(rdzv, workers[1])
    again = job.register_worker("w001", heartbeat_interval=None, replace=True)
    assert _join(rdzv, again)[:3] == ["joining", 1, 2]  # its old incarnation is out
    assert _join(rdzv, workers[2])[0] == "closed"
    got = _round_of(rdzv, again)
    assert (got.members, got.rank) == (("w000", "w001", "w002"), 1)  # it joined anew
    rdzv.check(got)  # whole: the member is its new incarnation


def _carry_round(job: strata_redis.Job, workers: list[Worker]) -> tuple[Rendezvous, Round]:
    """Round 1 = w000 and w001 (fresh: both hold the job's state); w001 leaves, and round 2
    is w000 (who holds it) with w002, new (who gets it from w000 once they train)."""
    rdzv = Rendezvous(job.context, min_workers=2, max_workers=2, timeout=5)
    _join(rdzv, workers[0])
    _join(rdzv, workers[1])
    first = _round_of(rdzv, workers[0])
    assert first.fresh
    workers[1].leave()
    _join(rdzv, workers[0], leaving=1)
    assert _join(rdzv, workers[2])[0] == "closed"
    second = _round_of(rdzv, workers[2])
    assert (second.number, second.fresh, second.members) == (2, False, ("w000", "w002"))
    return rdzv, second


def _without_the_holder(rdzv: Rendezvous, workers: list[Worker], second: Round) -> Round:
    """w000 leaves round 2 (a SIGKILL, declared failed, is the same to the rendezvous); w002
    and w003 (new) make round 3: as w002 sees it."""
    workers[0].leave()
    with pytest.raises(RoundBrokenError):
        rdzv.check(second)
    _join(rdzv, workers[2], leaving=2)
    assert _join(rdzv, workers[3])[0] == "closed"
    return _round_of(rdzv, workers[2])


def test_a_round_whose_state_holders_all_died_is_fresh(job: strata_redis.Job) -> None:
    """w000, the one member of round 2 that held the job's state, is lost before round 2
    passed an epoch barrier (w002 may never have got the state from it): round 3, of w002
    and w003, is fresh (it resumes from the newest checkpoint), not a continuation of a
    model no member holds; w002 keeps its rank ahead of the new w003."""
    workers = _workers(job, 4)
    rdzv, second = _carry_round(job, workers)
    third = _without_the_holder(rdzv, workers, second)
    assert (third.number, third.fresh, third.members) == (3, True, ("w002", "w003"))
    # and a fresh round holds the state whole: its members carry it into round 4
    workers[3].leave()
    _join(rdzv, workers[2], leaving=3)
    late = job.register_worker("w004", heartbeat_interval=None)
    assert _join(rdzv, late)[0] == "closed"
    assert _round_of(rdzv, late).fresh is False


def test_a_round_past_an_epoch_barrier_carries_the_state_on(job: strata_redis.Job) -> None:
    """The same, but round 2 passed an epoch barrier (review_round, which runs after it):
    w002 trained with w000 and holds the state, so round 3 goes on from it (not fresh)."""
    workers = _workers(job, 4)
    rdzv, second = _carry_round(job, workers)
    assert rdzv.review(second, epoch=1) is True
    third = _without_the_holder(rdzv, workers, second)
    assert (third.number, third.fresh, third.members) == (3, False, ("w002", "w003"))

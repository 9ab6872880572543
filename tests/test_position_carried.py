"""A data position is never dropped (issue 33, 5): a checkpoint written by a smaller round
carries the positions of the ranks that left, so a later resume at any world size trains
every sample of the epoch once.

Three ranks train part of epoch 0 and checkpoint (each holds a shard part-way); two resume
from it and checkpoint again before they have leased every one of those half-read shards;
three resume from that and finish the epoch. What each round trained before its
checkpoint, and the last round's whole epoch, are every sample once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import strata_redis
from strata_redis.data.position import POSITION_PART, decode_positions, merge_positions
from strata_redis.errors import RoundRestartedError

JOB = "carried"
DATASET = "ds"
#: 12 shards of 10 samples; batches of 4: a shard is read part-way after one or two batches
TOTAL, PER_SHARD, BATCH = 120, 10, 4


def _round(url: str, ckpt: Path, ids: list[str]) -> list[strata_redis.TrainingOrchestrator]:
    """Orchestrators of one fresh round of ``ids`` (every member new: it resumes), made on
    threads (each waits in the rendezvous for the others)."""
    made: dict[str, strata_redis.TrainingOrchestrator] = {}
    errors: list[BaseException] = []

    def make(worker: str) -> None:
        try:
            made[worker] = strata_redis.TrainingOrchestrator(
                coordinator_url=url, worker_id=worker, job_id=JOB, checkpoint_path=str(ckpt),
                min_workers=len(ids), max_workers=len(ids), last_call=0.1,
                heartbeat_timeout=5.0, batch_size=BATCH, commit_timeout=30.0,
            )  # fmt: skip
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=make, args=(w,)) for w in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(made) == len(ids), errors
    assert all(o.round.fresh for o in made.values())
    return [made[w] for w in ids]


@contextlib.contextmanager
def _walks(orchs: list[strata_redis.TrainingOrchestrator]) -> Iterator[list[Iterator[Any]]]:
    """One walk of the current epoch per rank; closed (their leases back in the pool) at the
    end, then the orchestrators (the round is over)."""
    walks = [iter(o.get_shards(DATASET)) for o in orchs]
    try:
        yield walks
    finally:
        for walk in walks:
            walk.close()  # type: ignore[attr-defined]
        for o in orchs:
            o.close()


def _train(walks: list[Iterator[Any]], batches: int) -> Counter[int]:
    """``batches`` batches of each rank, in turn: the samples trained."""
    trained: Counter[int] = Counter()
    for _ in range(batches):
        for walk in walks:
            trained.update(next(walk).tolist())
    return trained


def _checkpoint(orchs: list[strata_redis.TrainingOrchestrator], step: int) -> None:
    futures = [o.save_checkpoint(step=step, epoch=0) for o in orchs]
    for future in futures:
        assert future is not None
        future.result(timeout=60)


def _saved(orchs: list[strata_redis.TrainingOrchestrator], step: int) -> tuple[set[int], dict]:
    ckpt = orchs[0].checkpoints
    info = next(i for i in ckpt.list() if i.step == step)
    parts = [ckpt.load(step, POSITION_PART, r, epoch=0, run=info.run) for r in range(len(orchs))]
    return merge_positions(p for raw in parts for p in decode_positions(raw)[0])


def _round_one(redis_url: str, ckpt: Path) -> tuple[Counter[int], dict[int, int]]:
    """Register the dataset; round 1: three ranks, one batch each (every rank holds a shard
    at 4 of 10), then a checkpoint at step 1: what they trained, and its offsets."""
    strata_redis.ShardManager(redis_url, job_id=JOB).register_dataset_params(
        DATASET, TOTAL, PER_SHARD, True, 7
    )
    orchs = _round(redis_url, ckpt, ["a", "b", "c"])
    with _walks(orchs) as walks:
        first = _train(walks, 1)
        _checkpoint(orchs, 1)
        done1, offsets1 = _saved(orchs, 1)
    assert not done1 and len(offsets1) == 3, offsets1
    return first, offsets1


@pytest.mark.timeout(120)
def test_a_smaller_rounds_checkpoint_carries_the_positions_of_the_ranks_that_left(
    redis_url: str, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    first, offsets1 = _round_one(redis_url, ckpt)

    # round 2: two ranks resume from it; one batch each leases at most two of the three
    # half-read shards, then they checkpoint
    orchs = _round(redis_url, ckpt, ["a", "b"])
    assert [o.resumed and o.resumed.step for o in orchs] == [1, 1]
    for o in orchs:  # a checkpoint before the first walk would hold the resumed position
        before = o.get_shards(DATASET).position
        assert before is not None and (before.epoch, before.partial) == (0, offsets1)
    with _walks(orchs) as walks:
        second = _train(walks, 1)
        _checkpoint(orchs, 2)
        done2, offsets2 = _saved(orchs, 2)
    # every shard the first checkpoint had part-way is still done or part-way, as far on
    for shard, offset in offsets1.items():
        assert shard in done2 or offsets2.get(shard, 0) >= offset, (shard, offsets1, offsets2)

    # round 3: three ranks resume from the smaller round's checkpoint and finish the epoch
    orchs = _round(redis_url, ckpt, ["a", "b", "c"])
    assert [o.resumed and o.resumed.step for o in orchs] == [2, 2, 2]
    _drain_once(orchs, first + second)


def _drain_once(orchs: list[strata_redis.TrainingOrchestrator], before: Counter[int]) -> None:
    """The round drains the epoch; with what was ``before`` it, every sample once."""
    rest: Counter[int] = Counter()
    with _walks(orchs) as walks:
        for walk in walks:  # (no collectives: one rank after another drains the pool)
            for batch in walk:
                rest.update(batch.tolist())
    trained = before + rest
    twice = sorted(s for s, n in trained.items() if n > 1)
    assert not twice, f"{len(twice)} samples trained twice: {twice}"
    assert trained == Counter(range(TOTAL))


def _wait(what: str, ready: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.timeout(180)
def test_a_joiner_left_alone_before_an_epoch_barrier_restarts_from_the_checkpoint(
    redis_url: str, tmp_path: Path
) -> None:
    """A worker admitted mid-epoch into a round with a resumed member (so it does not resume
    itself), left alone when the resumed members go before any epoch barrier, never held
    the job's state: its next round is fresh, not a continuation of a model nobody holds. It
    gets ``RoundRestartedError``; relaunched, the job resumes from the newest checkpoint at
    another world size and trains every sample of the epoch once relative to it."""
    ckpt = tmp_path / "ckpt"
    first, _ = _round_one(redis_url, ckpt)

    # round 2: "a" and "b" resume from it (the pool holds the three shards at 4); "d" arrives
    # and waits for the next round. (Its last call is long: the round it may open when "b"
    # leaves waits for "a", the live member left, instead of closing with "d" alone.)
    a, b = _round(redis_url, ckpt, ["a", "b"])
    assert a.resumed is not None and a.resumed.step == 1
    joined: list[strata_redis.TrainingOrchestrator] = []
    joiner = threading.Thread(target=lambda: joined.append(strata_redis.TrainingOrchestrator(
        coordinator_url=redis_url, worker_id="d", job_id=JOB, checkpoint_path=str(ckpt),
        min_workers=1, last_call=30.0, heartbeat_timeout=5.0, batch_size=BATCH,
        commit_timeout=30.0,
    )))  # fmt: skip
    joiner.start()
    # "b" leaves; "a" joins round 3 with "d" at its next step (the walk's check), draws one
    # batch and is gone before its step ends (not in any model: its lease goes back whole)
    b.close()
    stream = a.get_shards(DATASET)
    _wait("a's round to break", stream.host.interrupted)
    walk = iter(stream)
    next(walk)
    assert a.round.number == 3 and a.world_size == 2 and not a.round.fresh
    walk.close()  # type: ignore[attr-defined]
    a.close()
    joiner.join(60)
    (d,) = joined
    assert d.resumed is None and not d.round.fresh  # admitted mid-epoch: it did not resume

    # "d" alone: round 4 is fresh (it never passed an epoch barrier with "a"): not trained
    stream = d.get_shards(DATASET)
    _wait("d's round to break", stream.host.interrupted)
    with pytest.raises(RoundRestartedError) as err:
        next(iter(stream))
    assert (err.value.round, err.value.worker_id) == (4, "d")
    assert d.round.number == 4 and d.round.fresh
    d.close()

    # relaunched as two ranks: they resume from round 1's checkpoint and finish the epoch
    orchs = _round(redis_url, ckpt, ["a", "b"])
    assert [o.resumed and o.resumed.step for o in orchs] == [1, 1]
    _drain_once(orchs, first)

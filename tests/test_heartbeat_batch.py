"""Batched heartbeats (``lua/heartbeat_workers.lua``): many workers of one process in one
script call, by hand and from the one heartbeat thread they share; against a real server."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import strata_redis
from strata_redis.coordination import heartbeats as heartbeats_mod
from strata_redis.errors import WorkerFailedError, WorkerLeftError, WorkerReplacedError

from .procs import wait_for

pytestmark = pytest.mark.both_backends  # conftest: on one redis-server and on a Redis Cluster


def scores(raw: Any, job: strata_redis.Job, ids: list[str]) -> dict[str, float | None]:
    return {w: raw.zscore(job.keys.heartbeats, w) for w in ids}


def statuses(job: strata_redis.Job) -> dict[str, str]:
    return {w.worker_id: w.status for w in job.workers()}


def test_one_call_beats_the_live_and_reports_the_dead_without_reviving_them(
    job: strata_redis.Job, raw: Any
) -> None:
    ws = [job.register_worker(f"w{i}", heartbeat_interval=None) for i in range(5)]
    ids = [w.worker_id for w in ws]
    job.client.zadd(job.keys.heartbeats, {w: 1 for w in ids})  # every heartbeat: long ago
    ws[1].deregister()
    job.client.zadd(job.keys.heartbeats, {"w2": 0})
    job.client.zadd(job.keys.heartbeats, {w: 10**15 for w in ("w0", "w3", "w4")})
    assert job.reap() == ["w2"]
    job.client.zadd(job.keys.heartbeats, {w: 1 for w in ("w0", "w3", "w4")})
    job.register_worker("w3", replace=True, heartbeat_interval=None)  # ws[3] is replaced
    before = scores(raw, job, ids)
    generation = job.membership_generation()

    verdicts = job.heartbeat_workers(ws)

    assert verdicts[0] is None and verdicts[4] is None
    assert isinstance(verdicts[1], WorkerLeftError)
    assert isinstance(verdicts[2], WorkerFailedError)
    assert isinstance(verdicts[3], WorkerReplacedError)
    assert verdicts[2].worker_id == "w2" and verdicts[2].job_id == job.job_id
    after = scores(raw, job, ids)
    assert after["w0"] > 1 and after["w4"] > 1  # recorded on Redis' clock
    assert after["w1"] is None and after["w2"] is None  # not revived
    assert after["w3"] == before["w3"]  # the replaced handle's beat is not recorded
    assert statuses(job) == {"w0": "idle", "w1": "left", "w2": "failed", "w3": "idle",
                             "w4": "idle"}  # fmt: skip
    assert job.membership_generation() == generation
    # a single heartbeat refuses the same way, and so does a batch of one (sent as one)
    with pytest.raises(WorkerFailedError):
        ws[2].heartbeat()
    (alone,) = job.heartbeat_workers([ws[2]])
    assert isinstance(alone, WorkerFailedError) and alone.worker_id == "w2"
    assert job.heartbeat_workers([ws[0]]) == [None]
    assert raw.zscore(job.keys.heartbeats, "w2") is None


def test_batches_past_the_limit_are_split(
    job: strata_redis.Job, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(heartbeats_mod, "HEARTBEAT_BATCH", 3)
    ws = [job.register_worker(f"w{i}", heartbeat_interval=None) for i in range(7)]
    ids = [w.worker_id for w in ws]
    job.client.zadd(job.keys.heartbeats, {w: 1 for w in ids})
    assert job.heartbeat_workers(ws) == [None] * 7
    assert all(s is not None and s > 1 for s in scores(raw, job, ids).values())
    assert job.heartbeat_workers([]) == []


def test_workers_of_another_job_are_refused(redis_url: str, job: strata_redis.Job) -> None:
    other = strata_redis.connect(redis_url, job.job_id + "-other")
    w = other.register_worker("w", heartbeat_interval=None)
    with pytest.raises(ValueError, match="workers must belong to job"):
        job.heartbeat_workers([w])
    other.close()


def heartbeat_threads(job_id: str) -> list[threading.Thread]:
    """The live heartbeat threads of ``job_id``'s groups in this process."""
    mine = f"strata-heartbeat-{job_id}-"
    return [t for t in threading.enumerate() if t.name.startswith(mine)]


def test_one_thread_beats_every_worker_of_a_process(redis_url: str, job_id: str) -> None:
    timeout = 2.0  # twenty intervals: a stall of the thread for a second fails nobody
    job = strata_redis.connect(redis_url, job_id, heartbeat_timeout=timeout)
    wait_for(lambda: not heartbeat_threads(job_id), 5)  # an earlier test's job of that id
    lost: list[strata_redis.StrataError] = []
    ws = [
        job.register_worker(f"w{i}", heartbeat_interval=0.1, on_lost=lost.append) for i in range(8)
    ]
    assert len(heartbeat_threads(job_id)) == 1  # one thread, not eight
    generations: list[int] = []
    ws[0].on_generation = generations.append
    time.sleep(3 * timeout)  # three timeouts: only the shared thread's beats keep them alive
    assert job.reap() == []
    assert set(statuses(job).values()) == {"idle"}
    assert all(w.heartbeating and w.lost is None for w in ws)
    assert generations and generations[-1] == job.membership_generation()

    # one is declared failed behind the thread's back: it is told, dropped, never revived
    job.client.zadd(job.keys.heartbeats, {"w5": 0})
    assert job.reap() == ["w5"]
    # (the thread sets ``lost``, then calls ``on_lost`` outside its lock: wait for the call)
    wait_for(lambda: ws[5].lost is not None and bool(lost), 5)
    assert lost == [ws[5].lost] and isinstance(lost[0], WorkerFailedError)
    assert not ws[5].heartbeating
    # one stops its heartbeats: none is sent after stop_heartbeat returns
    ws[6].stop_heartbeat()
    stopped_at = job.client.zscore(job.keys.heartbeats, "w6")
    time.sleep(3 * 0.1)  # three intervals, well within the timeout: w6's score stands still
    assert stopped_at is not None
    assert job.client.zscore(job.keys.heartbeats, "w6") == stopped_at
    # the shared thread's reaper declares it failed: a timeout, or two after a stall (the
    # reaper's grace); beaten on by mistake, it would never be
    wait_for(lambda: statuses(job)["w6"] == "failed", 15, why=lambda: statuses(job))
    assert statuses(job) == {**{f"w{i}": "idle" for i in range(8)}, "w5": "failed",
                             "w6": "failed"}  # fmt: skip
    assert job.client.zscore(job.keys.heartbeats, "w5") is None
    events = [e for e in job.events(100) if e["type"] == "fail"]
    assert [e["worker"] for e in events] == ["w5", "w6"]
    assert all(w.heartbeating and w.lost is None for i, w in enumerate(ws) if i not in (5, 6))
    assert len(lost) == 1

    # the group empties: its thread ends; a worker that starts again gets one back
    for i, w in enumerate(ws):
        if i not in (5, 6):
            w.deregister()
    wait_for(lambda: not heartbeat_threads(job_id), 5)
    back = job.register_worker("w6", heartbeat_interval=0.1)
    assert back.heartbeating and len(heartbeat_threads(job_id)) == 1
    back.deregister()
    job.close()


def test_workers_at_other_intervals_beat_in_their_own_group(redis_url: str, job_id: str) -> None:
    job = strata_redis.connect(redis_url, job_id, heartbeat_timeout=2.0)
    wait_for(lambda: not heartbeat_threads(job_id), 5)  # an earlier test's job of that id
    fast = [job.register_worker(f"f{i}", heartbeat_interval=0.1) for i in range(2)]
    slow = [job.register_worker(f"s{i}", heartbeat_interval=0.5) for i in range(2)]
    assert len(heartbeat_threads(job_id)) == 2
    time.sleep(2.5)
    assert job.reap() == []
    assert all(w.heartbeating for w in fast + slow)
    for w in fast + slow:
        w.deregister()
    job.close()

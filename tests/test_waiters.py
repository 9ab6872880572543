"""Barrier waiters in one process share one blocked connection (``coordination/waiters.py``):
many waiters fit in a small pool, tokens are handed out exactly (other processes' waiters
get theirs), and the shared thread ends when nobody waits."""

from __future__ import annotations

import threading
from pathlib import Path

import redis

import strata_redis
from strata_redis.coordination import Release
from strata_redis.coordination.barrier import WATCHERS
from strata_redis.coordination.waiters import release_pops

from .procs import join_all, spawn, wait_for

JOB = "waiters"


def _wait_all(job: strata_redis.Job, ids: list[str], expected: int) -> list[object]:
    """Threads waiting on barrier "b"; returns the list their releases (or errors) go to."""
    results: list[object] = []
    for worker in ids:
        job.register_worker(worker, heartbeat_interval=None)

    def one(worker: str) -> None:
        try:
            results.append(job.barrier("b", expected, timeout=120).wait(worker))
        except Exception as exc:  # reported to the test
            results.append(exc)

    for worker in ids:
        threading.Thread(target=one, args=(worker,), daemon=True).start()
    return results


def test_many_waiters_share_one_blocked_connection(redis_url: str, raw: redis.Redis) -> None:
    n = 150
    # a pool of 12 for 150 waiters: one blocked connection each would exhaust it
    job = strata_redis.connect(redis_url, JOB, max_connections=12)
    ids = [f"w{i}" for i in range(n)]
    results = _wait_all(job, ids, n + 1)
    barrier = job.barrier("b", n + 1)
    wait_for(lambda: len(barrier.state().arrived) == n, 60, why=lambda: barrier.state())
    pops = release_pops(job.context)
    wait_for(lambda: pops.waiting == n - WATCHERS, 30, why=lambda: pops.waiting)
    # the shared pop and the generation's watchers: nobody else holds a blocked connection
    assert int(raw.info("clients")["blocked_clients"]) <= 1 + WATCHERS
    job.register_worker("last", heartbeat_interval=None)
    release = barrier.wait("last")
    wait_for(lambda: len(results) == n, 60, why=lambda: len(results))
    assert all(isinstance(r, Release) for r in results), [
        r for r in results if not isinstance(r, Release)
    ][:3]
    assert {r.generation for r in results} == {release.generation}  # type: ignore[attr-defined]
    wait_for(lambda: pops._thread is None, 30)  # the shared thread ends when nobody waits
    job.close()


def _process_waiters(url: str, count: int, tag: str, out: str) -> None:
    job = strata_redis.connect(url, JOB)
    results = _wait_all(job, [f"{tag}-{i}" for i in range(count)], 2 * count + 1)
    deadline = 120.0
    wait_for(lambda: len(results) == count, deadline)
    ok = sum(isinstance(r, Release) for r in results)
    Path(out).write_text(f"{ok} {len({getattr(r, 'generation', -1) for r in results})}")
    job.close()


def test_tokens_reach_every_process(redis_url: str, tmp_path: Path) -> None:
    count = 40
    outs = [tmp_path / "a", tmp_path / "b"]
    procs = [spawn(_process_waiters, redis_url, count, tag, str(out))
             for tag, out in zip(("a", "b"), outs, strict=True)]  # fmt: skip
    job = strata_redis.connect(redis_url, JOB)
    barrier = job.barrier("b", 2 * count + 1)
    job.register_worker("last", heartbeat_interval=None)
    wait_for(lambda: len(barrier.state().arrived) == 2 * count, 120, why=barrier.state)
    barrier.wait("last", timeout=120)
    assert join_all(procs, timeout=120) == [0, 0]
    assert [o.read_text() for o in outs] == [f"{count} 1", f"{count} 1"]
    job.close()

"""The rollback check, against a model: any run of lease calls by three processes, then a
suffix of any length lost (the job's keys put back as a snapshot had them: what a failover to
a replica that lagged, or a restart from an older RDB, does), then any interleaving of calls
after it. A process that saw a lost tick never gets a grant or a completion through on the
diverged state (it gets ``StateRolledBackError``), whoever called first. Played on a real
Redis with the real scripts; the masked case, replayed with the history check off, goes
through (the check is what holds, not the test)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import strata_redis
from strata_redis import scripts, status
from strata_redis.data.leases import Lease, ShardLeases
from strata_redis.server import RedisServer

PROCESSES = 3
#: one operation: (process, "acquire" | "complete")
op = st.tuples(st.integers(0, PROCESSES - 1), st.sampled_from(["acquire", "complete"]))
_jobs = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


class World:
    """Three processes' views of one fresh job (each its own client, era and mark)."""

    def __init__(self, url: str) -> None:
        self.job_id = f"model-{next(_jobs)}"
        self.raw = redis.Redis.from_url(url)
        self.jobs = [strata_redis.connect(url, self.job_id) for _ in range(PROCESSES)]
        self.leases: list[ShardLeases] = []
        try:
            strata_redis.ShardManager(self.jobs[0]).register_dataset_params("ds", 40, 5)
            for p, job in enumerate(self.jobs):
                job.register_worker(f"w{p}", heartbeat_interval=None)
            for p, job in enumerate(self.jobs):
                self.leases.append(job.leases("ds", 0, f"w{p}", ttl=600))
        except BaseException:
            self.close()
            raise
        self.held: list[list[Lease]] = [[] for _ in range(PROCESSES)]
        self.stopped = [False] * PROCESSES

    def play(self, ops: list[tuple[int, str]]) -> list[tuple[int, str, bool]]:
        """Run ``ops``; each as (process, op, whether a grant or completion went through).
        A process that got a StateLostError stops (its later ops are skipped)."""
        out = []
        for p, what in ops:
            if self.stopped[p]:
                continue
            try:
                if what == "acquire":
                    lease = self.leases[p].acquire()
                    if lease is not None:
                        self.held[p].append(lease)
                    out.append((p, what, lease is not None))
                elif self.held[p]:
                    lease = self.held[p].pop(0)
                    try:
                        out.append((p, what, lease.complete()))
                    except strata_redis.LeaseLostError:
                        out.append((p, what, False))
            except strata_redis.StateLostError:
                self.stopped[p] = True
                out.append((p, "stopped", False))
        return out

    def snapshot(self) -> list[tuple[bytes, bytes]]:
        keys = list(self.raw.scan_iter(match=f"strata:{{{self.job_id}}}:*", count=1000))
        return [(k, self.raw.dump(k)) for k in keys]

    def roll_back(self, snap: list[tuple[bytes, bytes]]) -> None:
        """Put the job's keys back as ``snap`` had them (the later ones gone)."""
        now = list(self.raw.scan_iter(match=f"strata:{{{self.job_id}}}:*", count=1000))
        if now:
            self.raw.delete(*now)
        for key, value in snap:
            self.raw.restore(key, 0, value, replace=True)

    def close(self) -> None:
        for job in self.jobs:
            job.close()
        self.raw.close()


def _run(url: str, before: Any, lost: Any, after: Any) -> tuple[set[int], list[Any]]:
    world = World(url)
    try:
        world.play(before)
        snap = world.snapshot()
        marks = [job.context.era.mark for job in world.jobs]
        world.play(lost)
        # the processes that saw a tick the loss takes away
        saw = {p for p, job in enumerate(world.jobs) if job.context.era.mark > max(marks)}
        world.roll_back(snap)
        # the leases held from before stay held: a process may complete them after the loss
        return saw, world.play(after)
    finally:
        world.close()


plays = dict(
    before=st.lists(op, max_size=12),
    lost=st.lists(op, min_size=1, max_size=8),
    after=st.lists(op, min_size=1, max_size=14),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(**plays)
def test_no_call_of_a_process_that_saw_lost_state_goes_through(
    server: RedisServer, before: Any, lost: Any, after: Any
) -> None:
    saw, outcomes = _run(server.url, before, lost, after)
    through = [(p, what) for p, what, ok in outcomes if ok and p in saw]
    assert through == [], (saw, outcomes)


#: the masked case in the model's terms: process 0 leases in the lost suffix; after the loss
#: process 1 calls first (raising Redis' clock back to process 0's mark), then process 0
MASKED = ([], [(0, "acquire")], [(1, "acquire"), (0, "acquire"), (0, "complete")])


@pytest.mark.parametrize("off", ["", "history"])
def test_the_masked_case_is_caught_by_the_history_check_alone(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch, off: str
) -> None:
    """With the check on, process 0 is stopped; with it off (the fault checker's switch),
    its next grant goes through on the diverged state: the check is what holds."""
    monkeypatch.setenv(status.GUARDS_ENV, off)
    scripts.compiled.cache_clear()
    try:
        saw, outcomes = _run(server.url, *MASKED)
    finally:
        monkeypatch.delenv(status.GUARDS_ENV)
        scripts.compiled.cache_clear()
    assert saw == {0}
    through = [(p, what) for p, what, ok in outcomes if ok and p in saw]
    if off:
        assert through == [(0, "acquire")], outcomes
    else:
        assert through == [] and (0, "stopped", False) in outcomes, outcomes

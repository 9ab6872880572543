"""Big jobs hold Redis for bounded time: a barrier of many workers is checked without a scan
of every worker (membership events since its opening), a sweep of many lease holders goes
in steps, a rendezvous round of many members joins, closes and breaks in bounded calls (its
reads for people go in pages), and a big epoch is built while another job's workers
heartbeat on the same Redis without any of them declared failed. Bounds are read from Redis'
own SLOWLOG (server time, not this machine's client-side noise)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

import strata_redis
from strata_redis import ShardManager
from strata_redis.coordination import Barrier, Rendezvous
from strata_redis.dashboard.document import document
from strata_redis.dashboard.state import DashboardState
from strata_redis.data.record import epoch_keys, segments
from strata_redis.errors import BarrierTimeoutError, RoundBrokenError
from strata_redis.keys import LeaseKeys
from strata_redis.server import RedisServer
from strata_redis.status import Status

from .procs import wait_for

pytestmark = pytest.mark.both_backends


def _slowlogged(redis_factory: Callable[..., RedisServer]) -> tuple[RedisServer, redis.Redis]:
    server = redis_factory(extra=["--slowlog-log-slower-than", "500", "--slowlog-max-len", "10000"])
    return server, redis.Redis.from_url(server.url, decode_responses=True)


class _Longest(float):
    """The longest command's duration (ms), printing as that command too."""

    command = ""

    def __repr__(self) -> str:
        return f"{float(self)} ms ({self.command[:120]})"


def _longest_ms(raw: redis.Redis, *, outliers: int = 0) -> _Longest:
    """The longest command since the last ``SLOWLOG RESET``, past the ``outliers`` longest."""
    entries = [e for e in raw.slowlog_get(10_000) if "SLOWLOG" not in str(e["command"]).upper()]
    entries.sort(key=lambda e: e["duration"], reverse=True)
    worst = entries[outliers] if len(entries) > outliers else None
    longest = _Longest(0 if worst is None else worst["duration"] / 1000)
    longest.command = "" if worst is None else str(worst["command"])
    return longest


def _registered(job: strata_redis.Job, n: int) -> list[str]:
    """``n`` workers registered (no heartbeat threads), their ids in order."""
    names = [f"w{i:05d}" for i in range(n)]
    for name in names:
        job.register_worker(name, heartbeat_interval=None)
    return names


def _arrive(job: strata_redis.Job, barrier: Barrier, worker: str) -> str:
    """One arrival without waiting; the outcome it got ("" while the generation is open)."""
    ((_, _gen, _index, _now, outcome, *_),) = job.scripts.run_many(
        [barrier.arrive_call(worker, uuid.uuid4().hex, 1, 600)]
    )
    return str(outcome)


@pytest.mark.single_only("reads its own server's SLOWLOG")
@pytest.mark.timeout(300)
def test_a_live_barrier_of_20000_workers_releases_without_scanning_them(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server, raw = _slowlogged(redis_factory)
    job = strata_redis.connect(server.url, "many", heartbeat_timeout=3600)
    n = 20_000
    names = _registered(job, n)
    # each measured step three times, the shortest judged: SLOWLOG is wall time in the
    # server, so a preemption on a loaded machine lengthens one run, a regression all three
    barriers = [job.barrier(f"all{i}", "live") for i in range(3)]
    for barrier in barriers:
        calls = [barrier.arrive_call(w, uuid.uuid4().hex, 1, 600) for w in names[:-1]]
        for start in range(0, len(calls), 2_000):
            job.scripts.run_many(calls[start : start + 2_000])
    releases = []
    for barrier in barriers:
        raw.slowlog_reset()
        assert _arrive(job, barrier, names[-1]).startswith("R 1 ")  # the last arrival releases
        releases.append(_longest_ms(raw))
    # a scan of 20,000 workers in Lua took 52 ms here; the release now pushes the 20,000
    # waiters' tokens and reads the events since the opening (none)
    assert min(releases) < 25, releases
    # a count barrier timing out names up to 100 absent workers with their exact count
    timeouts = []
    for i in range(3):
        count = job.barrier(f"count{i}", n)
        _arrive(job, count, names[0])
        raw.slowlog_reset()
        with pytest.raises(BarrierTimeoutError) as caught:
            count.wait(names[1], timeout=0.5)
        timeouts.append(_longest_ms(raw))
        assert caught.value.missing_count == n - 2 and len(caught.value.missing) == 100
        assert f"{n - 2}, among them" in str(caught.value)
    assert min(timeouts) < 25, timeouts
    job.close()


def test_release_tokens_past_one_batch_are_pushed_by_the_waiters(
    redis_url: str, raw: redis.Redis, job_id: str
) -> None:
    """A release pushes at most 4,096 tokens, the first marked "+"; the waiter that pops it
    pushes the next batch (refill_release), so no call pushes 10^5 tokens at once."""
    job = strata_redis.connect(redis_url, job_id, heartbeat_timeout=3600)
    n = 5_000
    names = _registered(job, n)
    barrier = job.barrier("big", n)
    calls = [barrier.arrive_call(w, uuid.uuid4().hex, 1, 600) for w in names]
    for start in range(0, n, 1_000):
        job.scripts.run_many(calls[start : start + 1_000])
    tokens = job.keys.barrier_release("big", 1)
    assert raw.llen(tokens) == 4_096
    first = raw.lpop(tokens)
    assert first is not None and first.startswith("+R 1 ")
    assert raw.lindex(tokens, 0) == first[1:]  # only the first of a batch is marked
    state = job.keys.barrier("big")
    assert job.scripts.run("refill_release", [state, tokens], [1, 60_000], {}) == [n - 4_096, 0]
    assert raw.llen(tokens) == n - 1
    assert job.scripts.run("refill_release", [state, tokens], [1, 60_000], {}) == [0, 0]
    job.close()


@pytest.mark.single_only("4,200 threads: once is enough")
@pytest.mark.timeout(300)
def test_4200_waiting_threads_are_all_released_at_once(
    redis_url: str, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past one batch of tokens, the waiters refill: all of them return within moments of
    each other, not one blocking slice (60 s here) later."""
    # slices of 60 s (a third of a 180 s socket timeout): starting, arriving and waking 4,199
    # threads through the GIL of a loaded 2-core machine takes seconds (16 s seen beside
    # another test), while a waiter the refill missed returns a slice after it arrived
    monkeypatch.setattr("strata_redis.connection.MAX_BLOCK_S", 60.0)
    job = strata_redis.connect(f"{redis_url}?socket_timeout=180", job_id, heartbeat_timeout=3600)
    assert job.context.max_block == 60.0
    n = 4_200
    names = _registered(job, n)
    barrier = job.barrier("crowd", n)
    returned: list[float] = []
    errors: list[BaseException] = []

    def wait(worker: str) -> None:
        try:
            barrier.wait(worker, timeout=120)
            returned.append(time.monotonic())
        except BaseException as exc:  # recorded, asserted below
            errors.append(exc)

    threads = [threading.Thread(target=wait, args=(w,)) for w in names[:-1]]
    began = time.monotonic()  # before any arrival: a missed waiter returns past began + 60
    for t in threads:
        t.start()
    arrived = job.keys.barrier_arrived("crowd")
    wait_for(lambda: job.client.scard(arrived) == n - 1, 120)
    start = time.monotonic()
    barrier.wait(names[-1], timeout=120)
    for t in threads:
        t.join(120)
    assert not errors and len(returned) == n - 1
    assert max(returned) - began < 55, (max(returned) - began, start - began)
    job.close()


@pytest.mark.parametrize("churn", [3, 600], ids=["few-events", "over-1000-events"])
def test_a_live_barrier_waits_for_every_live_worker_through_churn(
    redis_url: str, job_id: str, churn: int
) -> None:
    """An arrived worker that leaves no longer counts; joins and leaves of others while the
    generation is open (past 1,000 events the check scans the live workers) change nothing."""
    job = strata_redis.connect(redis_url, job_id, heartbeat_timeout=3600)
    workers = {w: job.register_worker(w, heartbeat_interval=None) for w in "abcd"}
    barrier = job.barrier("live", "live")
    assert _arrive(job, barrier, "a") == ""
    assert _arrive(job, barrier, "b") == ""
    for i in range(churn):  # 2 events each
        job.register_worker(f"tmp{i}", heartbeat_interval=None).leave()
    workers["b"].leave()  # arrived, then left: live are a, c, d
    assert _arrive(job, barrier, "c") == ""  # 3 arrivals, 3 live, but d has not arrived
    assert _arrive(job, barrier, "d").startswith("R 1 ")
    job.close()


def test_a_sweep_of_many_lease_holders_goes_in_steps(
    redis_url: str, raw: redis.Redis, job_id: str
) -> None:
    """After a membership change each acquire looks at no more than 256 held leases; the
    leases of a worker that left all go back to the pool within a few acquires."""
    job = strata_redis.connect(redis_url, job_id, heartbeat_timeout=3600)
    ShardManager(job).register_dataset_params("ds", 20_000, 10)  # 2,000 shards
    a = job.register_worker("a", heartbeat_interval=None)
    job.register_worker("b", heartbeat_interval=None)
    held_by_a = job.leases("ds", 0, "a", ttl=3600)
    for _ in range(600):
        assert held_by_a.acquire() is not None
    keys = LeaseKeys(job.keys, "ds", 0)
    holders = keys.holders
    assert raw.hlen(holders) == 600
    a.leave()
    b = job.leases("ds", 0, "b", ttl=3600)
    b.acquire()
    assert 0 < raw.hlen(holders) - 1 < 600  # one step: some of a's leases are back, not all
    for _ in range(4):
        b.acquire()
    assert [v for v in raw.hvals(holders) if v.endswith(" a")] == []
    meta = raw.hgetall(keys.meta)
    assert "sweep_cursor" not in meta and meta["swept"] == raw.get(job.keys.generation)
    job.close()


@pytest.mark.single_only("reads its own server's SLOWLOG")
@pytest.mark.timeout(600)
def test_a_million_shard_epoch_built_beside_a_heartbeating_job_fails_nobody(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server, raw = _slowlogged(redis_factory)
    other = strata_redis.connect(server.url, "neighbour", heartbeat_timeout=1.0)
    beating = [other.register_worker(f"n{i}", heartbeat_interval=0.1) for i in range(4)]
    big = strata_redis.connect(server.url, "big")
    ShardManager(big).register_dataset_params("ds", 1_000_000, 1)
    big.register_worker("w", heartbeat_interval=None)
    raw.slowlog_reset()
    leases = big.leases("ds", 0, "w")
    leases.prepare()  # the pool of 10^6 shards: the taken bitmap's zeros, one O(1) call
    for _ in range(50):
        lease = leases.acquire()
        assert lease is not None and lease.complete()
    progress = leases.progress()
    assert (progress.done, progress.leased, progress.todo) == (50, 0, 1_000_000 - 50)
    # the whole pool (a ZSET then) in one script took 1.8 s here; in 1,024-shard chunks 3-8
    # ms (24 ms seen once, right after the Sentinel tests, on this 2-core machine); now the
    # longest call is a first SETBIT's allocation of a bitmap (125 KB). 200 ms leaves a
    # preempted server room and still fails the whole-pool script
    assert _longest_ms(raw) < 200
    wait_for(lambda: all(w.heartbeating for w in beating), 5)
    assert [w.worker_id for w in other.workers() if w.status == "failed"] == []
    for w in beating:
        w.leave()
    big.close()
    other.close()


def _bytes(raw: redis.Redis, keys: list[str]) -> int:
    return sum(raw.memory_usage(k, samples=0) or 0 for k in keys)


@pytest.mark.single_only("reads its own server's SLOWLOG")
@pytest.mark.timeout(600)
def test_an_epoch_of_ten_million_shards_costs_at_most_16_bytes_a_shard(
    redis_factory: Callable[..., RedisServer],
) -> None:
    """Issue 24's bars: an epoch in progress at 10^7 shards <= 16 bytes per shard (its
    bitmaps and record segments are whole once completions have reached every segment: the
    cost does not grow after), with no command over a few ms; closing it leaves a summary
    of constant size, in bounded calls."""
    server, raw = _slowlogged(redis_factory)
    job = strata_redis.connect(server.url, "huge")
    n = 10_000_000
    params = ShardManager(job).register_dataset_params("ds", n, 1)
    job.register_worker("w", heartbeat_interval=None)
    leases = job.leases("ds", 0, "w")
    leases.prepare()  # (the worker's own order: numpy, seconds at 10^7)
    raw.slowlog_reset()
    for done, lease in enumerate(leases, start=1):  # own shards, shuffled: every segment
        assert lease.complete()
        if done == 3_000:
            break
    held = leases.acquire()  # and one leased
    assert held is not None
    keys = epoch_keys(job.context, params, 0)
    record = keys[len(keys) - segments(n) :]  # (epoch_keys ends with the record's segments)
    assert all(raw.exists(k) for k in record), "every record segment is allocated"
    in_progress = _bytes(raw, keys)
    assert in_progress <= 16 * n, f"{in_progress / n:.2f} bytes per shard"
    # the longest: a completion creating its record segment (768 KiB of zeros), a fraction of
    # a ms alone; 12 ms seen with this 2-core machine's load average at 7. The whole record
    # in one string (117 MB of zeros) took 50-54 ms here to allocate: 35 ms still fails it.
    # One command past it is let be: Redis descheduled on this VM once made one completion
    # 38.5 ms (a CI run); the record in one string is refused above too (its segments exist)
    assert _longest_ms(raw, outliers=1) < 35
    progress = leases.progress()
    assert (progress.done, progress.leased, progress.todo) == (3_000, 1, n - 3_001)
    # the job moves on: the next epoch's pool closes this one, in one bounded call
    assert job.advance_epoch("w", timeout=10) == 1
    raw.slowlog_reset()
    job.leases("ds", 1, "w").prepare()
    assert _longest_ms(raw) < 25
    assert [k for k in keys if raw.exists(k)] == [keys[0]]
    assert _bytes(raw, keys) < 2048, "a closed epoch: its summary only"
    assert leases.progress().done == 3_000
    job.close()


@pytest.mark.single_only("reads its own server's SLOWLOG")
@pytest.mark.timeout(900)
def test_a_rendezvous_of_20000_workers_and_its_reads_are_bounded(
    redis_factory: Callable[..., RedisServer],
) -> None:
    """A round of 20,000 members closes, breaks and closes again with the 19,999 survivors,
    with no command over the bound: before, each join scanned every member and closing one
    wrote every rank in one script. The reads for people (the dashboard, ``job.workers()``)
    go in pages too."""
    server, raw = _slowlogged(redis_factory)
    job = strata_redis.connect(server.url, "many", heartbeat_timeout=3600)
    n = 20_000
    workers = [job.register_worker(f"w{i:05d}", heartbeat_interval=None) for i in range(n)]
    raw.slowlog_reset()

    def join_all(rdzv: Rendezvous, members: list[Any], leaving: int) -> list[str]:
        kinds, guess = [], rdzv.current_round()
        for w in members:
            reply = rdzv.join_step(w.worker_id, w.incarnation, guess, leaving)
            if int(reply[0]) == Status.ROUND_MOVED:
                guess = int(reply[1])
                reply = rdzv.join_step(w.worker_id, w.incarnation, guess, leaving)
            assert int(reply[0]) == Status.OK, reply
            kinds.append(str(reply[1]))
            guess = int(reply[2])
        return kinds

    rdzv = Rendezvous(job.context, min_workers=n, max_workers=n, timeout=60)
    assert join_all(rdzv, workers, 0) == ["joining"] * (n - 1) + ["closed"]
    first = rdzv.join(workers[5].worker_id, workers[5].incarnation)
    assert (first.world_size, first.rank) == (n, 5)
    assert first.members == tuple(w.worker_id for w in workers)  # read in pages
    workers[123].leave()
    with pytest.raises(RoundBrokenError, match="w00123"):
        rdzv.check(first)
    survivors = workers[:123] + workers[124:]
    again = Rendezvous(job.context, min_workers=2, max_workers=n, last_call=600)
    # the round closes when the last survivor is back (no last-call wait), not before
    assert join_all(again, survivors, 1) == ["joining"] * (n - 2) + ["closed"]
    second = again.join(workers[124].worker_id, workers[124].incarnation)
    assert (second.number, second.world_size, second.rank, second.fresh) == (2, n - 1, 123, False)
    again.check(second)  # whole

    listed = job.workers()
    assert len(listed) == n and sum(w.status == "left" for w in listed) == 1
    doc = document(DashboardState(job.client, heartbeat_timeout=3600).read("many", limit=50))
    assert doc["page"]["total"] == n and len(doc["workers"]) == 50
    # the old close (every rank written in one script) took 53 ms at 5,000 members, four
    # times that at 20,000; a join scanning every member (as the barrier's 52 ms scan of
    # 20,000) puts thousands of the 40,000 joins over 25 ms, a preemption a few
    longest = _longest_ms(raw)
    assert longest < 100, longest
    over = [e for e in raw.slowlog_get(10_000) if e["duration"] > 25_000]
    assert len(over) < 100, [(e["duration"], str(e["command"])[:80]) for e in over[:10]]

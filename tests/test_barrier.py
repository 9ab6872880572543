"""Barriers and epochs against a real redis-server, with real worker processes."""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.queues import Queue
from typing import Any

import pytest
import redis

import strata_redis
from strata_redis.coordination.barrier import KEEP_OUTCOMES, Barrier
from strata_redis.coordination.epochs import EPOCH_BARRIER

from .conftest import decoding_client
from .procs import CTX, join_all, kill9, spawn, wait_for

pytestmark = pytest.mark.both_backends  # conftest: on one redis-server and on a Redis Cluster

JOB = "test-job"  # the job_id fixture's name for this module's job
#: where no worker may be declared failed (a stall of a loaded machine must not break a
#: barrier that should time out): well past any stall, and apart from the barrier's timeout
LONG_HEARTBEAT_TIMEOUT = 10.0


def describe(exc: BaseException) -> dict[str, Any]:
    """What a child process reports about an exception (exceptions do not pickle well)."""
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "culprit": getattr(exc, "culprit", None),
        "reason": getattr(exc, "reason", None),
        "missing": getattr(exc, "missing", None),
        "missing_count": getattr(exc, "missing_count", None),
        "generation": getattr(exc, "generation", None),
    }


def blocked_clients(raw: redis.Redis) -> int:
    return int(raw.info("clients")["blocked_clients"])


# -- processes ------------------------------------------------------------------------------


def rounds_participant(
    url: str, job_id: str, index: int, n: int, rounds: int, out: Queue[Any]
) -> None:
    """Meet the others ``rounds`` times; before each arrival, leave a marker for the round."""
    client = decoding_client(url)
    job = strata_redis.connect(url, job_id, heartbeat_timeout=20.0)
    worker_id = f"w{index:02d}"
    job.register_worker(worker_id, heartbeat_interval=1.0)
    barrier = job.barrier("rounds", expected=n)
    log = []
    for r in range(rounds):
        client.sadd(f"test:marker:{r}", worker_id)
        arrived_at = time.time()
        release = barrier.wait(worker_id, timeout=120.0 if r == 0 else 60.0)
        left_at = time.time()
        # every participant wrote its marker before arriving: all n must be there by now
        markers = client.scard(f"test:marker:{r}")
        log.append((r, release.generation, release.participants, markers, arrived_at, left_at))
    out.put((worker_id, log))


def timeout_waiter(
    url: str,
    job_id: str,
    worker_id: str,
    expected: int | str,
    timeout: float,
    live: int,
    out: Queue[Any],
) -> None:
    job = strata_redis.connect(url, job_id, heartbeat_timeout=LONG_HEARTBEAT_TIMEOUT)
    job.register_worker(worker_id, heartbeat_interval=0.2)
    # processes start at different times: arrive once every participant is registered
    wait_for(lambda: len(job.live_workers()) >= live, 60, step=0.05)
    started = time.monotonic()
    try:
        job.barrier("slow", expected=expected).wait(worker_id, timeout=timeout)
        out.put((worker_id, None, time.monotonic() - started))
    except Exception as exc:
        out.put((worker_id, describe(exc), time.monotonic() - started))


def idle_worker(url: str, job_id: str, worker_id: str) -> None:
    """Register and heartbeat, never arrive anywhere (killed by the test)."""
    job = strata_redis.connect(url, job_id, heartbeat_timeout=2.0)
    job.register_worker(worker_id, heartbeat_interval=0.2)
    time.sleep(60)


def surviving_waiter(
    url: str, job_id: str, worker_id: str, expected: int | str, after: int | str, out: Queue[Any]
) -> None:
    """Wait; on a broken barrier, reset it and meet the other survivors (``after``)."""
    job = strata_redis.connect(url, job_id, heartbeat_timeout=2.0)
    job.register_worker(worker_id, heartbeat_interval=0.2)
    # with expected="live", whoever is registered when the last of them arrives is "every
    # live worker": arrive once all four are
    wait_for(lambda: len(job.live_workers()) >= 4, 60, step=0.05)
    try:
        job.barrier("kill", expected=expected).wait(worker_id, timeout=30.0)
        out.put((worker_id, "released", None, None))
        return
    except Exception as exc:
        broken, broken_at = describe(exc), time.time()
    barrier = job.barrier("kill", expected=after)
    barrier.reset(broken["generation"])
    release = barrier.wait(worker_id, timeout=30.0)
    out.put((worker_id, broken, broken_at, (release.generation, release.participants)))


def epoch_participant(
    url: str, job_id: str, index: int, n: int, rounds: int, out: Queue[Any]
) -> None:
    """Advance the epoch ``rounds`` times; some calls lose their reply and are retried."""
    job = strata_redis.connect(url, job_id, heartbeat_timeout=20.0)
    worker_id = f"e{index:02d}"
    job.register_worker(worker_id, heartbeat_interval=1.0)
    # an epoch is a barrier over the *live* workers: start once all n are registered
    deadline = time.monotonic() + 120
    while len(job.live_workers()) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    arrive, wait = Barrier._arrive, Barrier._await
    epochs, retries = [], 0
    for r in range(rounds):
        fault = (index + r) % 4  # 1: arrival's reply lost, 2: connection lost while blocked
        # each fault strikes once; ``wait`` rides it out itself (outage.py) and re-issues
        # the step: the arrival again with its ticket, or the blocking read
        if fault == 1:

            def lost_reply(self: Barrier, *args: Any) -> Any:
                Barrier._arrive = arrive  # type: ignore[method-assign]
                arrive(self, *args)  # the script ran: the arrival is counted
                raise redis.ConnectionError("reply lost (injected)")

            Barrier._arrive = lost_reply  # type: ignore[method-assign]
            retries += 1
        elif fault == 2:

            def dropped(self: Barrier, *args: Any) -> Any:
                Barrier._await = wait  # type: ignore[method-assign]
                raise redis.ConnectionError("connection lost while blocked (injected)")

            Barrier._await = dropped  # type: ignore[method-assign]
            retries += 1
        epochs.append(job.advance_epoch(worker_id, timeout=60.0))
        assert (Barrier._arrive, Barrier._await) == (arrive, wait)  # the fault struck
    out.put((worker_id, epochs, retries))


# -- many processes -------------------------------------------------------------------------


@pytest.mark.slow
def test_fifty_processes_twenty_rounds(redis_url: str, job_id: str) -> None:
    n, rounds = 50, 20
    out: Queue[Any] = CTX.Queue()
    procs = [spawn(rounds_participant, redis_url, job_id, i, n, rounds, out) for i in range(n)]
    logs = dict(out.get(timeout=150) for _ in range(n))
    assert join_all(procs) == [0] * n
    first = logs["w00"][0][1]
    for r in range(rounds):
        rows = [log[r] for log in logs.values()]
        assert {row[0] for row in rows} == {r}
        # every round released all of them, in its own generation: none mixed, none skipped
        assert {row[1] for row in rows} == {first + r}
        assert {row[2] for row in rows} == {n}
        # nobody left early: every marker was there, and every leave followed every arrival
        assert {row[3] for row in rows} == {n}
        assert max(row[4] for row in rows) <= min(row[5] for row in rows)
    latencies = strata_redis.connect(redis_url, job_id).barrier_latencies()
    # each release is recorded once; records of different processes may land out of order
    assert sorted(x.generation for x in latencies) == [first + r for r in range(rounds)]
    assert all(x.participants == n and x.release_ms >= 0 for x in latencies)


@pytest.mark.parametrize("expected", [4, "live"])
def test_barrier_timeout(redis_url: str, job_id: str, expected: int | str) -> None:
    timeout = 2.0
    job = strata_redis.connect(redis_url, job_id, heartbeat_timeout=LONG_HEARTBEAT_TIMEOUT)
    absent = job.register_worker("absent", heartbeat_interval=0.2)  # live, never arrives
    out: Queue[Any] = CTX.Queue()
    ids = ["w0", "w1", "w2"]
    procs = [spawn(timeout_waiter, redis_url, job_id, w, expected, timeout, 4, out) for w in ids]
    results = [out.get(timeout=60) for _ in ids]
    assert join_all(procs) == [0] * 3
    absent.stop_heartbeat()
    for worker_id, error, elapsed in results:
        assert error is not None, f"{worker_id} was released without 'absent'"
        assert error["type"] == "BarrierTimeoutError", error
        assert error["missing"] == ["absent"] and error["missing_count"] == 1
        assert "'absent'" in error["message"]
        # + slack for a waiter stalled around its deadline; one that ignored its timeout
        # would wait on past the test's 60 s
        assert elapsed <= timeout + 5.0, (worker_id, elapsed)
    # the first waiter to arrive waited its whole timeout, not less
    assert max(elapsed for _, _, elapsed in results) >= timeout - 0.05


@pytest.mark.parametrize(("expected", "after"), [("live", "live"), (4, 3)])
def test_killed_participant_breaks_barrier_and_survivors_reset(
    redis_url: str, job_id: str, expected: int | str, after: int | str
) -> None:
    heartbeat_timeout = 2.0
    job = strata_redis.connect(redis_url, job_id, heartbeat_timeout=heartbeat_timeout)
    victim = spawn(idle_worker, redis_url, job_id, "victim")
    out: Queue[Any] = CTX.Queue()
    ids = ["s0", "s1", "s2"]
    procs = [spawn(surviving_waiter, redis_url, job_id, w, expected, after, out) for w in ids]
    barrier = job.barrier("kill", expected=expected)
    wait_for(lambda: barrier.state().arrived == ids and "victim" in job.live_workers(), 60)
    killed_at = time.time()
    kill9(victim)
    results = [out.get(timeout=60) for _ in ids]
    assert join_all(procs) == [0] * 3
    next_rounds = set()
    for worker_id, broken, broken_at, next_round in results:
        assert broken is not None and broken != "released", worker_id
        assert broken["type"] == "BarrierBrokenError", broken
        assert (broken["culprit"], broken["reason"]) == ("victim", "failed")
        assert "'victim' was declared failed" in broken["message"]
        # detected within the heartbeat timeout (two after a stall: the reaper's grace) + 3 s,
        # long before the barrier's 30 s
        took = broken_at - killed_at
        assert took <= 2 * heartbeat_timeout + 3.0, (worker_id, took)
        next_rounds.add(next_round)
    (generation, participants), *rest = next_rounds
    assert not rest and generation == broken["generation"] + 1 and participants == 3


# -- one process ----------------------------------------------------------------------------


@pytest.fixture
def register(job: strata_redis.Job) -> Iterator[Callable[[str], strata_redis.coordination.Worker]]:
    """Register workers of ``job`` with fast heartbeats; stop their threads afterwards."""
    made: list[strata_redis.coordination.Worker] = []

    def make(worker_id: str) -> strata_redis.coordination.Worker:
        made.append(job.register_worker(worker_id, heartbeat_interval=0.2))
        return made[-1]

    yield make
    for worker in made:
        worker.stop_heartbeat()


def run_threads(*calls: Callable[[], Any]) -> list[threading.Thread]:
    threads = [threading.Thread(target=call, daemon=True) for call in calls]
    for thread in threads:
        thread.start()
    return threads


def collect(results: queue.Queue[Any], call: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        try:
            results.put(call())
        except Exception as exc:
            results.put(exc)

    return run


def test_duplicate_arrival_counted_once(
    job: strata_redis.Job, raw: redis.Redis, register: Callable[[str], Any]
) -> None:
    # a second handle: its calls are not retries of the first handle's
    two = strata_redis.connect(job.client, job.job_id, heartbeat_timeout=2.0)
    register("a")
    register("b")
    results: queue.Queue[Any] = queue.Queue()
    barrier = job.barrier("dup", expected=2)
    threads = run_threads(
        collect(results, lambda: barrier.wait("a", timeout=10)),
        collect(results, lambda: two.barrier("dup", expected=2).wait("a", timeout=10)),
    )
    # both calls of "a" are blocked in Redis
    wait_for(lambda: blocked_clients(raw) == 2, 10, why=lambda: (raw.client_list(), results.queue))
    assert barrier.state().arrived == ["a"]
    time.sleep(0.2)
    assert results.empty(), "released with only one worker"
    release = barrier.wait("b", timeout=10)
    for thread in threads:
        thread.join(10)
    assert release.participants == 2
    assert [results.get_nowait(), results.get_nowait()] == [release, release]
    assert barrier.state().arrived == [] and barrier.generation() == release.generation + 1


def test_retried_arrival_counted_once(
    job: strata_redis.Job,
    monkeypatch: pytest.MonkeyPatch,
    register: Callable[[str], Any],
) -> None:
    register("a")
    register("b")
    barrier = job.barrier("retry", expected=2)
    arrive, wait = Barrier._arrive, Barrier._await

    lost = []

    def lost_reply(self: Barrier, *args: Any) -> Any:
        reply = arrive(self, *args)
        if not lost:  # once: the retry's reply arrives
            lost.append(reply)
            raise redis.ConnectionError("reply lost (injected)")
        return reply

    results: queue.Queue[Any] = queue.Queue()
    (thread,) = run_threads(collect(results, lambda: barrier.wait("a", timeout=10)))
    wait_for(lambda: barrier.state().arrived == ["a"], 10)
    # the reply of the arrival that completed the generation is lost, and ``wait`` sends
    # the arrival again (the same ticket) ...
    monkeypatch.setattr(Barrier, "_arrive", lost_reply)
    release = barrier.wait("b", timeout=10)
    assert lost and lost[0].index == 2  # the lost arrival released the generation
    thread.join(10)
    # ... which is answered from that generation, not counted in the next one
    assert results.get_nowait() == release and release.participants == 2
    assert barrier.state().arrived == [] and barrier.generation() == release.generation + 1
    # a caller's own retry (after a longer outage) is answered the same way
    monkeypatch.setattr(Barrier, "_arrive", arrive)
    (thread,) = run_threads(collect(results, lambda: barrier.wait("a", timeout=10)))
    wait_for(lambda: barrier.state().arrived == ["a"], 10)
    outage = redis.ConnectionError("unreachable (injected)")
    monkeypatch.setattr(Barrier, "_await", lambda *a: (_ for _ in ()).throw(outage))
    monkeypatch.setattr(job.context, "redis_retry", 0.0)  # no budget: the caller retries
    with pytest.raises(strata_redis.RedisUnavailableError, match="injected"):
        barrier.wait("b", timeout=10)
    monkeypatch.setattr(Barrier, "_await", wait)
    assert barrier.wait("b", timeout=10).participants == 2
    thread.join(10)


def test_unregistered_failed_and_left_workers_refused(job: strata_redis.Job) -> None:
    barrier = job.barrier("refuse", expected=2)
    with pytest.raises(strata_redis.errors.WorkerNotRegisteredError, match="'ghost'"):
        barrier.wait("ghost", timeout=1)
    with pytest.raises(strata_redis.errors.WorkerNotRegisteredError, match="'ghost'"):
        barrier.abort("ghost", "no such worker")
    silent = job.register_worker("silent", heartbeat_interval=None)
    left = job.register_worker("left", heartbeat_interval=None)
    left.deregister()
    wait_for(lambda: "silent" in job.reap(), 5, step=0.1)
    with pytest.raises(strata_redis.errors.WorkerFailedError, match="'silent'"):
        barrier.wait("silent", timeout=1)
    with pytest.raises(strata_redis.errors.WorkerLeftError, match="'left'"):
        barrier.wait("left", timeout=1)
    assert barrier.state().arrived == []
    silent.stop_heartbeat()


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda j: j.barrier("b", expected=0), ValueError, "expected"),
        (lambda j: j.barrier("b", expected=-3), ValueError, "expected"),
        (lambda j: j.barrier("b", expected=True), TypeError, "expected"),
        (lambda j: j.barrier("b", expected=2.5), TypeError, "expected"),
        (lambda j: j.barrier("b", expected="all"), ValueError, "expected"),
        (lambda j: j.barrier("b", expected=10**9), ValueError, "expected"),
        (lambda j: j.barrier("b", timeout=-1), ValueError, "timeout"),
        (lambda j: j.barrier("b", timeout=math.nan), ValueError, "timeout"),
        (lambda j: j.barrier("b", timeout=math.inf), ValueError, "timeout"),
        (lambda j: j.barrier("b", timeout=0), ValueError, "timeout"),
        (lambda j: j.barrier("b", timeout="30"), TypeError, "timeout"),
        (lambda j: j.barrier(""), ValueError, "name"),
        (lambda j: j.barrier(" b"), ValueError, "name"),
        (lambda j: j.barrier("a\nb"), ValueError, "name"),
        (lambda j: j.barrier("x" * 129), ValueError, "name"),
        (lambda j: j.barrier(42), TypeError, "name"),
        (lambda j: j.barrier(EPOCH_BARRIER), ValueError, "reserved"),
        (lambda j: j.barrier("b").wait("w", timeout=-1), ValueError, "timeout"),
        (lambda j: j.barrier("b").wait("w", timeout=math.nan), ValueError, "timeout"),
        (lambda j: j.barrier("b").wait("", timeout=1), ValueError, "worker_id"),
        (lambda j: j.barrier("b").wait(None, timeout=1), TypeError, "worker_id"),
        (lambda j: j.barrier("b").abort("w", ""), ValueError, "reason"),
        (lambda j: j.barrier("b").abort("w", "a\nb"), ValueError, "reason"),
        (lambda j: j.barrier("b").abort("w", 3), TypeError, "reason"),
        (lambda j: j.barrier("b").reset(0), ValueError, "generation"),
        (lambda j: j.advance_epoch("w", timeout=-5), ValueError, "timeout"),
        (lambda j: j.barrier_latencies(0), ValueError, "count"),
    ],
)
def test_bad_arguments(
    job: strata_redis.Job, raw: redis.Redis, call: Callable[[Any], Any], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        call(job)
    assert raw.keys("*barrier*") == []  # nothing half-written


def test_expected_must_agree(job: strata_redis.Job, register: Callable[[str], Any]) -> None:
    register("a")
    register("b")
    results: queue.Queue[Any] = queue.Queue()
    run_threads(collect(results, lambda: job.barrier("agree", expected=2).wait("a", timeout=5)))
    wait_for(lambda: job.barrier("agree").state().arrived == ["a"], 5)
    with pytest.raises(strata_redis.BarrierError, match="opened with expected='2'"):
        job.barrier("agree", expected=3).wait("b", timeout=5)
    assert job.barrier("agree", expected=2).wait("b", timeout=5) == results.get(timeout=5)


def test_abort_wakes_every_waiter_at_once_and_refuses_until_reset(
    job: strata_redis.Job, register: Callable[[str], Any]
) -> None:
    for w in ("a", "b", "c"):
        register(w)
    # waits block in slices of heartbeat_timeout/2; a 20 s timeout makes a slice 10 s, so a
    # wake within 5 s is the abort's broadcast, not a slice's end (and no noisy 1 s bound)
    slow = strata_redis.connect(job.client, job.job_id, heartbeat_timeout=20.0)
    barrier = slow.barrier("abort", expected=3, timeout=30)
    results: queue.Queue[Any] = queue.Queue()
    run_threads(*(collect(results, lambda w=w: barrier.wait(w)) for w in ("a", "b")))
    wait_for(lambda: barrier.state().arrived == ["a", "b"], 5)
    started = time.monotonic()
    generation = barrier.abort("c", "out of memory")
    errors = [results.get(timeout=5), results.get(timeout=5)]
    assert time.monotonic() - started < 5.0
    for err in errors:
        assert isinstance(err, strata_redis.errors.BarrierBrokenError)
        assert (err.culprit, err.reason, err.generation) == ("c", "out of memory", generation)
    with pytest.raises(strata_redis.errors.BarrierBrokenError, match="aborted it: out of memory"):
        barrier.wait("c", timeout=5)  # a late arrival does not pass the broken generation
    assert barrier.reset(generation) == generation + 1
    assert barrier.reset(generation) == generation + 1  # every survivor may call it
    threads = run_threads(*(collect(results, lambda w=w: barrier.wait(w)) for w in ("a", "b")))
    assert barrier.wait("c").generation == generation + 1
    for thread in threads:
        thread.join(10)


def test_live_barrier_released_by_a_graceful_leave(
    job: strata_redis.Job, register: Callable[[str], Any]
) -> None:
    register("a")
    leaver = register("leaver")
    slow = strata_redis.connect(job.client, job.job_id, heartbeat_timeout=20.0)  # 10 s slices
    results: queue.Queue[Any] = queue.Queue()
    run_threads(collect(results, lambda: slow.barrier("leave").wait("a", timeout=30)))
    wait_for(lambda: slow.barrier("leave").state().arrived == ["a"], 5)
    started = time.monotonic()
    leaver.deregister()  # no longer a member: "a" is every live worker now
    release = results.get(timeout=8)
    assert time.monotonic() - started < 5.0  # the leave's event woke it, not a slice's end
    assert release.participants == 1


@pytest.mark.parametrize("protocol", [2, 3])
def test_watchers_read_streams_over_resp2_and_resp3(
    redis_url: str, job_id: str, protocol: int
) -> None:
    client = decoding_client(redis_url, protocol=protocol)
    job = strata_redis.connect(client, job_id, heartbeat_timeout=2.0)
    workers = [job.register_worker(w, heartbeat_interval=0.2) for w in ("a", "b", "leaver")]
    results: queue.Queue[Any] = queue.Queue()
    # "a" and "b" are the generation's watchers: they block on the wake and events streams
    threads = run_threads(*(collect(results, lambda w=w: job.barrier("p").wait(w)) for w in "ab"))
    wait_for(lambda: job.barrier("p").state().arrived == ["a", "b"], 5)
    workers[2].deregister()  # a membership event completes the live barrier
    assert [results.get(timeout=5).participants for _ in "ab"] == [2, 2]
    for thread in threads:
        thread.join(5)
    for worker in workers[:2]:
        worker.stop_heartbeat()


def test_outcomes_and_keys_stay_bounded(
    job: strata_redis.Job, raw: redis.Redis, register: Callable[[str], Any]
) -> None:
    register("a")
    register("b")
    barrier = job.barrier("bounded", expected=2)
    rounds = KEEP_OUTCOMES + 6
    for _ in range(rounds):
        (thread,) = run_threads(lambda: barrier.wait("a", timeout=10))
        barrier.wait("b", timeout=10)
        thread.join(10)
    state = raw.hgetall(job.keys.barrier("bounded"))
    assert int(state["gen"]) == rounds + 1
    assert sum(1 for field in state if field.startswith("r:")) <= KEEP_OUTCOMES
    for key in raw.keys("*barrier*"):
        if key == job.keys.barrier_latency:
            continue  # capped instead: see LATENCY_CAP
        ttl = raw.pttl(key)
        # release lists go within a minute; the rest within an hour of the last use
        assert 0 < ttl <= (60_000 if ":barrier_release:" in key else 3_600_000), (key, ttl)
    assert [x.generation for x in job.barrier_latencies() if x.barrier == "bounded"] == list(
        range(1, rounds + 1)
    )


@pytest.mark.slow
def test_advance_epoch_twenty_processes_repeated_and_retried(
    redis_url: str, job: strata_redis.Job
) -> None:
    n, rounds = 20, 6
    assert job.current_epoch() == 0
    out: Queue[Any] = CTX.Queue()
    procs = [spawn(epoch_participant, redis_url, job.job_id, i, n, rounds, out) for i in range(n)]
    results = [out.get(timeout=150) for _ in range(n)]
    assert join_all(procs) == [0] * n
    for worker_id, epochs, _ in results:
        assert epochs == list(range(1, rounds + 1)), worker_id  # one step per call, all agree
    assert sum(retries for _, _, retries in results) >= n * rounds // 4  # faults were injected
    assert job.current_epoch() == rounds
    assert job.epoch_barrier().generation() == rounds + 1

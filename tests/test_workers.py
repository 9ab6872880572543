"""The worker registry against a real redis-server, with real worker processes."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from typing import Any

import orjson
import pytest
import redis

import strata_redis
from strata_redis import scripts
from strata_redis import status as codes
from strata_redis.coordination import Worker
from strata_redis.coordination.registry import job_clock
from strata_redis.errors import (
    WorkerExistsError,
    WorkerFailedError,
    WorkerLeftError,
    WorkerReplacedError,
)
from strata_redis.server import RedisServer

from .procs import CTX, join_all, kill9, spawn, wait_for

pytestmark = pytest.mark.both_backends  # conftest: on one redis-server and on a Redis Cluster

# -- processes ------------------------------------------------------------------------------


def heartbeating_worker(
    url: str,
    job_id: str,
    worker_id: str,
    interval: float,
    timeout: float,
    skew: float,
    ready: Queue[Any],
) -> None:
    """Register, heartbeat from the background thread, live until killed (or 30 s)."""
    if skew:
        # The client's clock is wrong by `skew` seconds; Redis' clock is the only one used.
        real_time, real_time_ns = time.time, time.time_ns
        time.time = lambda: real_time() + skew  # type: ignore[assignment]
        time.time_ns = lambda: real_time_ns() + int(skew * 1e9)  # type: ignore[assignment]
    job = strata_redis.connect(url, job_id, heartbeat_timeout=timeout)
    worker = job.register_worker(worker_id, heartbeat_interval=interval)
    worker.set_status("training")
    ready.put(worker_id)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and worker.lost is None:
        time.sleep(0.05)


def reaper(url: str, job_id: str, start_at: float, out: Queue[Any]) -> None:
    """Run the reaper step at (about) the same instant as the other reapers."""
    job = strata_redis.connect(url, job_id, heartbeat_timeout=0.5)
    time.sleep(max(0.0, start_at - time.time()))
    out.put(job.reap())


def status_of(job: strata_redis.Job, worker_id: str) -> str:
    return {w.worker_id: w.status for w in job.workers()}[worker_id]


# -- register / heartbeat / deregister / list ------------------------------------------------


def test_register_heartbeat_deregister_list(job: strata_redis.Job, raw: redis.Redis) -> None:
    assert job.membership_generation() == 0
    w = job.register_worker(
        "worker-01",
        host="gpu-a",
        address="10.0.0.5:29500",
        gpu_count=8,
        labels={"zone": "a"},
        heartbeat_interval=None,
    )
    assert w.incarnation == 1 == job.membership_generation()
    (info,) = job.workers()
    assert (info.worker_id, info.status, info.host, info.address) == (
        "worker-01",
        "idle",
        "gpu-a",
        "10.0.0.5:29500",
    )
    assert info.gpu_count == 8 and info.labels == {"zone": "a"}
    assert info.last_seen_s is not None and 0 <= info.last_seen_s < 5  # seen at register

    first = raw.zscore(job.keys.heartbeats, "worker-01")
    time.sleep(0.01)
    w.heartbeat()
    assert raw.zscore(job.keys.heartbeats, "worker-01") > first
    assert job.live_workers() == ["worker-01"]

    w.deregister()
    assert status_of(job, "worker-01") == "left"
    assert job.live_workers() == []
    assert job.membership_generation() == 2
    assert [e["type"] for e in job.events()] == ["join", "leave"]
    with pytest.raises(WorkerLeftError, match="worker-01"):
        w.heartbeat()


def test_status_transitions(job: strata_redis.Job) -> None:
    w = job.register_worker("w", heartbeat_interval=None)
    for status in ("training", "checkpointing", "idle", "training"):
        w.set_status(status)
        assert status_of(job, "w") == status
    for bad in ("failed", "left", "TRAINING", ""):
        with pytest.raises(ValueError, match="status must be one of"):
            w.set_status(bad)
    assert status_of(job, "w") == "training"
    assert job.membership_generation() == 1, "status changes are not membership changes"


def test_generation_moves_once_per_join_leave_failure(job: strata_redis.Job) -> None:
    a = job.register_worker("a", heartbeat_interval=None)
    job.register_worker("b", heartbeat_interval=None)
    assert job.membership_generation() == 2
    a.deregister()
    assert job.membership_generation() == 3
    job.client.zadd(job.keys.heartbeats, {"b": 0})  # b's last heartbeat: long ago
    assert job.reap() == ["b"]
    assert job.reap() == []
    assert job.membership_generation() == 4
    assert [(e["type"], e["worker"], e["generation"]) for e in job.events()] == [
        ("join", "a", "1"),
        ("join", "b", "2"),
        ("leave", "a", "3"),
        ("fail", "b", "4"),
    ]


def test_live_id_refused_unless_replace(job: strata_redis.Job) -> None:
    old = job.register_worker("w", heartbeat_interval=None)
    with pytest.raises(WorkerExistsError, match="replace=True") as info:
        job.register_worker("w", heartbeat_interval=None)
    assert info.value.worker_id == "w" and info.value.job_id == job.job_id
    host = socket.gethostname()  # recorded with the pid when no host is given
    assert (info.value.holder_host, info.value.holder_pid) == (host, os.getpid())
    assert f"held by process {os.getpid()} on host {host!r}" in str(info.value)
    (listed,) = job.workers()
    assert (listed.host, listed.pid, listed.status) == (host, os.getpid(), "idle")
    new = job.register_worker("w", replace=True, heartbeat_interval=None)
    assert new.incarnation > old.incarnation
    with pytest.raises(WorkerReplacedError):
        old.heartbeat()
    new.heartbeat()
    assert job.events()[-1]["type"] == "replace"


def test_a_registration_whose_reply_was_lost_is_sent_again_and_finds_itself(
    job: strata_redis.Job, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # a failover closes the connection after Redis applied the registration and before its
    # reply came back (seen under 20 workers: the worker died on a bare ConnectionError at
    # start); the registration is sent again and takes the id from its own unanswered send,
    # not refused as a live duplicate and not logged as a takeover from someone else
    scripts = job.context.scripts
    real = scripts.call
    lost: list[str] = []

    def applied_then_lost(name: str, *args: Any, **kwargs: Any) -> Any:
        reply = real(name, *args, **kwargs)
        if name == "register_worker" and not lost:
            lost.append(name)
            raise redis.ConnectionError("Connection closed by server.")
        return reply

    monkeypatch.setattr(scripts, "call", applied_then_lost)
    with caplog.at_level("WARNING", logger="strata_redis"):
        worker = job.register_worker("w", heartbeat_interval=None)
    assert lost == ["register_worker"]  # the reply was lost once
    worker.heartbeat()  # its incarnation is the live one
    (listed,) = job.workers()
    assert (listed.pid, listed.status, listed.incarnation) == (
        os.getpid(),
        "idle",
        worker.incarnation,
    )
    assert not [r for r in caplog.records if "took the id over" in r.getMessage()]
    # one registration: no takeover of itself recorded, no second generation
    assert [e["type"] for e in job.events()] == ["join"]
    # a second registration of the id from this process is still a live duplicate
    with pytest.raises(WorkerExistsError):
        job.register_worker("w", heartbeat_interval=None)


def test_a_holder_registered_before_pids_were_recorded_is_named_as_unknown(
    job: strata_redis.Job,
) -> None:
    job.register_worker("w", host="gpu-a", heartbeat_interval=None)
    job.client.hset(job.keys.info, "w", orjson.dumps({"host": "gpu-a", "gpu_count": 0}))
    with pytest.raises(WorkerExistsError, match="process of unknown pid on host "
                       "'gpu-a'") as info:  # fmt: skip
        job.register_worker("w", heartbeat_interval=None)
    assert (info.value.holder_host, info.value.holder_pid) == ("gpu-a", None)
    assert job.workers()[0].pid is None


# -- a stale holder is taken over; a live one is not --------------------------------------------


def _redis_ms(job: strata_redis.Job) -> int:
    sec, usec = job_clock(job.client, job.job_id)
    return sec * 1000 + usec // 1000


def _far_holder(job: strata_redis.Job, worker_id: str) -> Worker:
    """Register ``worker_id`` here, then record it as made by a process on another host (its
    pid space another machine's): this host cannot ask about its process."""
    worker = job.register_worker(worker_id, host="gpu-far", heartbeat_interval=None)
    far = {"host": "gpu-far", "address": None, "gpu_count": 0, "labels": {}, "pid": 4242,
           "started": 17, "space": "another-boot/pid:[4026531836]"}  # fmt: skip
    job.client.hset(job.keys.info, worker_id, orjson.dumps(far))
    return worker


def test_a_second_live_process_with_the_id_is_refused_and_the_holder_runs_on(
    redis_url: str, job_id: str
) -> None:
    """Two live processes, one id: the second is refused with a message that says the holder
    is alive, where, and how to take it over; the holder keeps beating. Once the holder is
    SIGKILLed, the same registration takes its place at once, its heartbeat still fresh."""
    timeout = 30.0  # far longer than this test: only the process check can free the id
    job = strata_redis.connect(redis_url, job_id, heartbeat_timeout=timeout)
    ready: Queue[Any] = CTX.Queue()
    proc = spawn(heartbeating_worker, redis_url, job_id, "w", 0.1, timeout, 0.0, ready)
    ready.get(timeout=60)
    (before,) = job.workers()
    with pytest.raises(WorkerExistsError) as info:
        job.register_worker("w", heartbeat_interval=None)
    message = str(info.value)
    host = socket.gethostname()
    assert f"is already registered and alive, held by process {proc.pid} on host {host!r}" in (
        message
    )
    assert "its process is running on this host" in message, message
    assert re.search(r"its last heartbeat [0-9.e-]+ s ago, within the heartbeat timeout of 30 s",
                     message), message  # fmt: skip
    assert "pass replace=True to take the id over now" in message
    assert (info.value.holder_host, info.value.holder_pid) == (host, proc.pid)
    assert info.value.last_seen_s is not None and 0 <= info.value.last_seen_s < timeout
    # the holder runs on: same incarnation, still beating
    seen = before.last_seen_s
    wait_for(lambda: job.workers()[0].last_seen_s != seen, 10)
    (after,) = job.workers()
    assert (after.status, after.incarnation, after.pid) == (
        "training",
        before.incarnation,
        proc.pid,
    )
    assert proc.is_alive()

    kill9(proc)
    back = job.register_worker("w", heartbeat_interval=None)  # no replace=True, at once
    assert back.incarnation > before.incarnation
    assert [(e["type"], e["worker"]) for e in job.events()][-1] == ("replace", "w")
    (now,) = job.workers()
    assert (now.pid, now.status) == (os.getpid(), "idle")
    back.heartbeat()
    job.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="a zombie is seen in /proc")
def test_a_holder_killed_but_not_yet_collected_by_its_parent_is_taken_over(
    redis_url: str, job_id: str
) -> None:
    """A dead process whose parent has not collected it yet (a zombie) still has its pid:
    it is gone all the same."""
    job = strata_redis.connect(redis_url, job_id, heartbeat_timeout=30.0)
    ready: Queue[Any] = CTX.Queue()
    proc = spawn(heartbeating_worker, redis_url, job_id, "w", 0.1, 30.0, 0.0, ready)
    ready.get(timeout=60)
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)  # and not collected (no join) until the end

    def zombie() -> bool:
        with open(f"/proc/{proc.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"

    wait_for(zombie, 10)
    back = job.register_worker("w", heartbeat_interval=None)
    assert [(e["type"], e["worker"]) for e in job.events()][-1] == ("replace", "w")
    back.heartbeat()
    proc.join(10)
    job.close()


def test_a_holder_whose_pid_was_given_to_another_process_is_taken_over(
    job: strata_redis.Job,
) -> None:
    """The recorded start time tells the holder from a later process given its pid."""
    old = job.register_worker("w", heartbeat_interval=None)
    (mine,) = job.workers()
    raw_info = orjson.loads(job.client.hget(job.keys.info, "w"))
    assert raw_info["pid"] == os.getpid() and isinstance(raw_info["started"], int)
    with pytest.raises(WorkerExistsError, match="running on this host"):
        job.register_worker("w", heartbeat_interval=None)  # this very process: alive
    job.client.hset(
        job.keys.info, "w", orjson.dumps({**raw_info, "started": raw_info["started"] - 1})
    )
    new = job.register_worker("w", heartbeat_interval=None)
    assert new.incarnation > old.incarnation == mine.incarnation
    with pytest.raises(WorkerReplacedError):
        old.heartbeat()


def test_a_holder_on_another_host_is_taken_over_only_past_the_heartbeat_timeout(
    redis_url: str, job_id: str
) -> None:
    """Another host's process cannot be asked about: its heartbeat alone decides, on Redis'
    clock, with the reaper's cutoff (a grace after a Redis stall included)."""
    job = strata_redis.connect(redis_url, job_id, heartbeat_timeout=1.0)
    old = _far_holder(job, "w")
    with pytest.raises(WorkerExistsError) as info:
        job.register_worker("w", heartbeat_interval=None)  # fresh: alive as far as we know
    assert "held by process 4242 on host 'gpu-far'" in str(info.value)
    assert "not checked: it ran on another host" in str(info.value)
    assert (info.value.holder_host, info.value.holder_pid) == ("gpu-far", 4242)

    # silent 1.5 s of a 1 s timeout, but a grace after a stall that began 1 s ago is running:
    # the reaper would not declare it failed (cutoff: a timeout before the stall), nor is it
    # taken over
    now = _redis_ms(job)
    job.client.zadd(job.keys.heartbeats, {"w": now - 1500})
    job.client.hset(job.keys.reaper, mapping={"quiet": now - 1000, "grace": now + 60_000})
    assert job.reap() == []
    with pytest.raises(WorkerExistsError):
        job.register_worker("w", heartbeat_interval=None)
    job.client.delete(job.keys.reaper)  # no grace: silent past the timeout is stale
    generation = job.membership_generation()
    new = job.register_worker("w", heartbeat_interval=None)
    assert new.incarnation == generation + 1  # one move: a replace, not a failure and a join
    assert [(e["type"], e["worker"]) for e in job.events()][-1] == ("replace", "w")
    (listed,) = job.workers()
    assert (listed.host, listed.pid, listed.status) == (socket.gethostname(), os.getpid(), "idle")
    with pytest.raises(WorkerReplacedError):
        old.heartbeat()  # the holder's incarnation is refused, as replace=True does
    job.close()


def test_failed_worker_is_not_resurrected_by_old_heartbeats(job: strata_redis.Job) -> None:
    w = job.register_worker("w", heartbeat_interval=None)
    job.client.zadd(job.keys.heartbeats, {"w": 0})
    assert job.reap() == ["w"]
    with pytest.raises(WorkerFailedError, match="register it again"):
        w.heartbeat()
    with pytest.raises(WorkerFailedError):
        w.set_status("training")
    assert status_of(job, "w") == "failed" and job.live_workers() == []
    back = job.register_worker("w", heartbeat_interval=None)
    assert back.incarnation == job.membership_generation() > w.incarnation
    back.heartbeat()
    with pytest.raises(WorkerReplacedError):
        w.heartbeat()  # the old handle stays dead
    assert status_of(job, "w") == "idle"


def test_heartbeat_thread_reports_loss(job: strata_redis.Job) -> None:
    lost: list[strata_redis.StrataError] = []
    w = job.register_worker("w", heartbeat_interval=0.05, on_lost=lost.append)
    # its heartbeat set stale, then reaped; a beat between the two (every 50 ms) makes it
    # fresh again and the reap passes it by (CI, loaded, once): again until the reap has it
    deadline = time.monotonic() + 10  # (a loop of two round trips: a bound, not a timing)
    while True:
        job.client.zadd(job.keys.heartbeats, {"w": 0})
        if "w" in job.reap():
            break
        assert time.monotonic() < deadline, "the stale worker was never reaped"
    wait_for(lambda: bool(lost), 5)
    assert isinstance(lost[0], WorkerFailedError)
    assert w.lost is lost[0] and not w.heartbeating


# -- failure detection with real processes ---------------------------------------------------


def test_sigkilled_worker_declared_failed_within_timeout(redis_url: str, job_id: str) -> None:
    # 3 s: a survivor's heartbeat thread stalled a second on a loaded machine is not reaped
    timeout, interval = 3.0, 0.2
    job = strata_redis.connect(redis_url, job_id, heartbeat_timeout=timeout)
    ready: Queue[Any] = CTX.Queue()
    procs = [
        spawn(heartbeating_worker, redis_url, job_id, f"w{i}", interval, timeout, 0.0, ready)
        for i in range(3)
    ]
    for _ in procs:
        ready.get(timeout=60)
    kill9(procs[0])
    killed_at = time.monotonic()
    # The survivors' heartbeat threads run the reaper; nobody here calls reap().
    wait_for(lambda: status_of(job, "w0") == "failed", 2 * timeout + 10, step=0.01)
    detected = time.monotonic() - killed_at
    # a timeout, or two after a stall (the reaper's grace), + slack; reaped only when someone
    # calls reap(), it would never be: the wait above fails
    assert detected <= 2 * timeout + 2, f"detected after {detected:.2f}s"
    assert {status_of(job, f"w{i}") for i in (1, 2)} == {"training"}
    for proc in procs[1:]:
        kill9(proc)


@pytest.mark.parametrize("skew", [3600.0, -3600.0])
def test_skewed_client_clock_is_not_declared_failed(
    redis_url: str, job_id: str, skew: float
) -> None:
    timeout = 1.0
    job = strata_redis.connect(redis_url, job_id, heartbeat_timeout=timeout)
    ready: Queue[Any] = CTX.Queue()
    proc = spawn(heartbeating_worker, redis_url, job_id, "skewed", 0.2, timeout, skew, ready)
    ready.get(timeout=60)
    deadline = time.monotonic() + 3 * timeout
    while time.monotonic() < deadline:
        assert job.reap() == []
        assert status_of(job, "skewed") == "training"
        time.sleep(0.1)
    kill9(proc)


def test_twenty_concurrent_reapers_record_each_failure_once(redis_url: str, job_id: str) -> None:
    job = strata_redis.connect(redis_url, job_id, heartbeat_timeout=0.5)
    ids = [f"w{i:02d}" for i in range(10)]
    for wid in ids:
        job.register_worker(wid, heartbeat_interval=None)
    gen = job.membership_generation()
    time.sleep(0.6)  # every heartbeat is now stale
    out: Queue[Any] = CTX.Queue()
    start_at = time.time() + 3.0  # processes take a while to spawn; start them together
    procs = [spawn(reaper, redis_url, job_id, start_at, out) for _ in range(20)]
    reaped = [out.get(timeout=60) for _ in procs]
    assert join_all(procs) == [0] * 20
    flat = [wid for batch in reaped for wid in batch]
    assert sorted(flat) == ids, "each failure is reported exactly once"
    assert job.membership_generation() == gen + len(ids)
    fails = [e for e in job.events(1000) if e["type"] == "fail"]
    assert sorted(e["worker"] for e in fails) == ids
    assert sorted(int(e["generation"]) for e in fails) == list(range(gen + 1, gen + 11))


# -- Redis faults ----------------------------------------------------------------------------


@pytest.mark.single_only("restarts its own redis-server (redis_factory)")
@pytest.mark.parametrize("kill", [False, True], ids=["restart", "kill-9"])
def test_heartbeat_thread_survives_redis_restart(
    redis_factory: Callable[..., RedisServer], kill: bool
) -> None:
    server = redis_factory(aof=True)
    job = strata_redis.connect(server.url, "test-job", heartbeat_timeout=3.0)
    w = job.register_worker("w", heartbeat_interval=0.1)
    w.set_status("training")
    time.sleep(0.3)
    server.restart(kill=kill)
    restarted = time.monotonic()

    def beat_since_restart() -> bool:
        (info,) = job.workers()
        seen = info.last_seen_s
        return seen is not None and seen < time.monotonic() - restarted

    wait_for(beat_since_restart, 10, step=0.05)  # the thread beats again after the restart
    assert w.heartbeating and w.lost is None
    (info,) = job.workers()
    assert info.status == "training"
    assert job.reap() == []
    w.stop_heartbeat()


@pytest.mark.single_only("kills its own redis-server (redis_factory)")
def test_redis_down_gives_a_clear_error(redis_factory: Callable[..., RedisServer]) -> None:
    server = redis_factory()
    # a short budget: the registration waits out an outage up to redis_retry (60 s default)
    job = strata_redis.connect(server.url, "test-job", redis_retry=1.0)
    server.kill()
    with pytest.raises(redis.ConnectionError, match="unreachable"):  # RedisUnavailableError
        job.register_worker("w", heartbeat_interval=None)


def test_scripts_reload_after_script_flush(job: strata_redis.Job, raw: redis.Redis) -> None:
    w = job.register_worker("w", heartbeat_interval=None)
    raw.script_flush()
    w.heartbeat()  # EVALSHA -> NOSCRIPT -> reloaded by redis-py's Script
    assert raw.script_exists(job.scripts["heartbeat"].sha) == [True]
    raw.script_flush()
    assert job.reap() == []  # through a pipeline, too
    assert raw.script_exists(job.scripts["reap_workers"].sha) == [True]


def test_a_lua_error_names_the_line_of_the_scripts_file(
    job: strata_redis.Job, raw: redis.Redis
) -> None:
    # the era check, the shared prelude (lua/lib/prelude.lua) and the lib/ pieces are joined
    # onto a script's first line: an error on its third line reads user_script:3
    src = "-- a contract comment\nlocal now = NOW_MS()\nreturn now + nil\n"
    code = codes.prelude() + scripts.compose(src) + codes.EPILOGUE
    keys, args = job.scripts.stamp([], [])
    with pytest.raises(redis.ResponseError, match=r"user_script:3: attempt to perform arith"):
        raw.eval(code, len(keys), *keys, *args)
    # and the prelude itself runs: the clock is Redis' own, in ms (as a tick of the era check)
    ok = codes.prelude() + scripts.compose("return {S.OK, NOW_MS(), NOW_US()}\n")
    tick, (code_, ms, us) = raw.eval(ok + codes.EPILOGUE, len(keys), *keys, *args)
    seconds, micros = raw.time()
    assert code_ == 0 and tick > 0
    # (5 s: far above a loaded machine's delay, far below a clock in s or us, x1000 off)
    assert 0 <= seconds * 1000 + micros // 1000 - ms < 5000
    assert 0 <= int(us) // 1000 - ms <= 1  # two TIME calls, microseconds apart


# -- bad input -------------------------------------------------------------------------------

BAD_IDS: list[tuple[object, type[Exception], str]] = [
    ("", ValueError, "must not be empty"),
    ("x" * 129, ValueError, "at most 128"),
    ("tab\there", ValueError, "printable"),
    ("new\nline", ValueError, "printable"),
    (" lead", ValueError, "whitespace"),
    ("trail ", ValueError, "whitespace"),
    (42, TypeError, "must be a str"),
    (None, TypeError, "must be a str"),
    (b"bytes", TypeError, "must be a str"),
]


@pytest.mark.parametrize(("bad", "exc", "match"), BAD_IDS)
def test_bad_worker_ids_refused_and_nothing_written(
    job: strata_redis.Job, raw: redis.Redis, bad: object, exc: type[Exception], match: str
) -> None:
    with pytest.raises(exc, match=match):
        job.register_worker(bad, heartbeat_interval=None)  # type: ignore[arg-type]
    assert raw.keys("*") == []


@pytest.mark.parametrize("bad", ["run{1}", "a}b", "{x"])
def test_braces_refused_in_job_ids(redis_url: str, bad: str) -> None:
    with pytest.raises(ValueError, match="hash tag"):
        strata_redis.connect(redis_url, bad)


@pytest.mark.parametrize(
    "worker_id", ["a:b", "w{1}", "}{", "with space", "wörker-é", "工人-1", "*?["]
)
def test_printable_ids_work_without_breaking_the_schema(
    redis_url: str, raw: redis.Redis, worker_id: str
) -> None:
    job = strata_redis.connect(redis_url, "run:7 é")
    w = job.register_worker(worker_id, heartbeat_interval=None)
    w.heartbeat()
    assert [i.worker_id for i in job.workers()] == [worker_id]
    assert all(k.startswith("strata:{run:7 é}:") for k in raw.keys("*"))
    assert strata_redis.coordination.registry.list_jobs(job.client) == ["run:7 é"]
    w.deregister()


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"gpu_count": -1}, ValueError, "gpu_count"),
        ({"gpu_count": 10**9}, ValueError, "gpu_count"),
        ({"gpu_count": "8"}, TypeError, "gpu_count"),
        ({"gpu_count": True}, TypeError, "gpu_count"),
        ({"heartbeat_interval": 0}, ValueError, "heartbeat_interval"),
        ({"heartbeat_interval": -1.0}, ValueError, "heartbeat_interval"),
        ({"heartbeat_interval": float("nan")}, ValueError, "heartbeat_interval"),
        ({"heartbeat_interval": 5.0}, ValueError, "heartbeat_interval"),  # above the timeout
        ({"heartbeat_interval": "1"}, TypeError, "heartbeat_interval"),
        ({"labels": {"a": 1}}, TypeError, "labels"),
        ({"labels": ["a"]}, TypeError, "labels"),
        ({"host": 7}, TypeError, "host"),
        ({"address": "x" * 2000}, ValueError, "address"),
    ],
)
def test_bad_arguments_refused_and_nothing_written(
    job: strata_redis.Job,
    raw: redis.Redis,
    kwargs: dict[str, Any],
    exc: type[Exception],
    match: str,
) -> None:
    with pytest.raises(exc, match=match):
        job.register_worker("w", **kwargs)
    assert raw.keys("*") == []


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"heartbeat_timeout": 0}, ValueError, "heartbeat_timeout"),
        ({"heartbeat_timeout": float("inf")}, ValueError, "heartbeat_timeout"),
        ({"heartbeat_timeout": "10"}, TypeError, "heartbeat_timeout"),
        ({"events_cap": 5}, ValueError, "events_cap"),
    ],
)
def test_bad_job_options(
    redis_url: str, kwargs: dict[str, Any], exc: type[Exception], match: str
) -> None:
    with pytest.raises(exc, match=match):
        strata_redis.connect(redis_url, "j", **kwargs)

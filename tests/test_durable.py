"""``durability="replicated"``, played for real: a primary and a replica behind proxies
(``chaos.topology.Topology``), the replication link stalled, the primary killed and the
replica promoted. A completion is acknowledged only once a replica confirmed it (a stalled
link makes it wait out its budget and raise ``NotReplicatedError``), so a failover to the
replica loses no acknowledged completion; the same schedule in the default durability
does lose one (the teeth)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import strata_redis
from strata_redis import durability
from strata_redis.chaos.topology import Topology
from strata_redis.server import RedisServer

from .procs import wait_for

JOB = "durable-job"
SHARDS = 12


@pytest.fixture
def topology() -> Iterator[Topology]:
    with Topology() as topo:
        yield topo


def _job(url: str, mode: str, **options: Any) -> strata_redis.Job:
    job = strata_redis.connect(url, JOB, heartbeat_timeout=60.0, durability=mode, **options)
    strata_redis.ShardManager(job).register_dataset_params("ds", SHARDS, 1)
    return job


def _caught_up(topology: Topology) -> None:
    """Wait until the replica has every write the primary made so far."""
    assert topology.replica is not None
    with redis.Redis(port=topology.primary.port) as primary, \
            redis.Redis(port=topology.replica.port) as replica:  # fmt: skip
        target = int(primary.info("replication")["master_repl_offset"])
        wait_for(lambda: int(replica.info("replication").get("slave_repl_offset", -1)) >= target,
                 15, why=lambda: (target, replica.info("replication")))  # fmt: skip


def _record(url: str) -> dict[int, tuple[str, int]]:
    """The completion record of epoch 0 as Redis (the primary the clients reach) holds it."""
    with strata_redis.connect(url, JOB) as job:
        return job.leases("ds", 0, "reader").completions()


# -- the mode's argument ------------------------------------------------------------------
def test_a_bad_durability_is_refused_naming_the_choices(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match=r"durability must be one of 'default', 'replicated', "
                                         r"got 'replica'"):  # fmt: skip
        strata_redis.connect(redis_url, JOB, durability="replica")
    with pytest.raises(TypeError, match="durability must be a str"):
        strata_redis.connect(redis_url, JOB, durability=1)
    with pytest.raises(ValueError, match="min_replicas must be between 1 and 100, got 0"):
        strata_redis.connect(redis_url, JOB, durability="replicated", min_replicas=0)
    with pytest.raises(ValueError, match="durability must be one of"):
        strata_redis.TrainingOrchestrator(redis_url, "w", job_id=JOB, durability="disk")
    monkeypatch.setenv(durability.DURABILITY_ENV, "always")
    with pytest.raises(ValueError, match=r"\$STRATA_DURABILITY must be one of"):
        strata_redis.connect(redis_url, JOB)
    monkeypatch.setenv(durability.DURABILITY_ENV, "replicated")
    job = strata_redis.connect(redis_url, JOB)
    # the environment's mode, with one replica by default; a job made from it keeps both
    assert (job.context.durability, job.context.min_replicas) == ("replicated", 1)
    monkeypatch.delenv(durability.DURABILITY_ENV)
    again = strata_redis.connect(job)
    assert again.context.durability == "replicated" and again.scripts is job.scripts
    assert strata_redis.connect(redis_url, JOB).context.durability == "default"
    job.close()


# -- a stalled replica ----------------------------------------------------------------------
def test_a_completion_is_not_acknowledged_while_no_replica_confirms_it(
    topology: Topology,
) -> None:
    job = _job(topology.url, "replicated", replica_timeout=0.2, redis_retry=1.0)
    job.register_worker("w", heartbeat_interval=None)
    leases = job.leases("ds", 0, "w")
    lease = leases.acquire()
    assert lease is not None
    with redis.Redis(port=topology.replica.port) as copy:  # type: ignore[union-attr]
        assert copy.hget(leases.keys.holders, str(lease.shard_id)) is not None  # confirmed
        topology.lag()
        began = time.monotonic()
        with pytest.raises(strata_redis.NotReplicatedError) as info:
            lease.complete()
        # it asked again for its whole budget (1 s of redis_retry), not only one WAIT's
        # 0.2 s: what separates the replicated mode from the default's one best-effort WAIT
        assert time.monotonic() - began >= 1.0
        err = info.value
        assert (err.operation, err.acked, err.needed, err.fsynced) == ("acquire_shard", 0, 1, True)
        assert "not acknowledged" in str(err) and "strata doctor" in str(err)
        assert not lease.finished and leases.progress().done == 1  # applied on the primary
        assert copy.bitcount(leases.keys.done) == 0  # ... and on no replica
        # the replica back: the same completion again is a repeat, acknowledged at once
        topology.lag(False)
        _caught_up(topology)  # (what the stalled link held: a while on a loaded machine)
        assert lease.complete() is False
        assert copy.hget(leases.keys.holders, str(lease.shard_id)) is None
    assert job.context.scripts.shortfalls == 1
    job.close()


def test_a_rollback_outranks_a_shortfall(topology: Topology) -> None:
    """State that went back (the clock lowered, as a failover to a lagging replica does) and
    no replica to confirm: the call stops with ``StateRolledBackError`` at once, not with
    ``NotReplicatedError`` after the whole budget (the refusal's own mark is a write no
    replica confirms either)."""
    job = _job(topology.url, "replicated", replica_timeout=0.2, redis_retry=5.0)
    job.register_worker("w", heartbeat_interval=None)
    leases = job.leases("ds", 0, "w")
    assert leases.acquire() is not None
    topology.lag()
    with redis.Redis(port=topology.primary.port) as admin:
        admin.decrby(job.keys.clock, 16 * 10)  # ten ticks lost
    began = time.monotonic()
    with pytest.raises(strata_redis.StateRolledBackError):
        leases.acquire()
    # one WAIT (0.2 s), not the 5 s budget: what separates the fix from the shortfall path
    assert time.monotonic() - began < 4.0
    topology.lag(False)
    job.close()


# -- the "done when": a failover to a lagging replica ---------------------------------------
def _workload(
    topology: Topology, mode: str, stall_at: int
) -> tuple[set[int], list[BaseException], dict[int, tuple[str, int]]]:
    """One worker completes shard after shard; after ``stall_at`` completions the
    replication link stalls, then the primary is killed and the replica promoted. Returns
    the shards whose completion was acknowledged (``complete()`` returned), the errors the
    worker stopped on, and the new primary's completion record."""
    job = _job(topology.url, mode, replica_timeout=0.2, redis_retry=30.0)
    job.register_worker("w", heartbeat_interval=None)
    leases = job.leases("ds", 0, "w")
    acked: set[int] = set()
    errors: list[BaseException] = []
    stalled = threading.Event()

    def work() -> None:
        try:
            for done in range(SHARDS):
                lease = leases.acquire()
                assert lease is not None
                if done == stall_at:
                    topology.lag()  # from here on the replica gets nothing
                    stalled.set()
                lease.complete()
                acked.add(lease.shard_id)
        except strata_redis.StrataError as exc:  # e.g. the default mode's rollback, detected
            errors.append(exc)
        finally:
            stalled.set()

    worker = threading.Thread(target=work)
    worker.start()
    assert stalled.wait(30)
    time.sleep(0.3)  # the default mode completes the rest meanwhile; the replicated waits
    topology.failover()
    worker.join(60)
    assert not worker.is_alive()
    job.close()
    return acked, errors, _record(topology.url)


@pytest.mark.parametrize("seed", [3, 11])
@pytest.mark.timeout(180)
def test_a_failover_to_a_lagging_replica_loses_no_acknowledged_completion(
    topology: Topology, seed: int
) -> None:
    stall_at = random.Random(seed).randrange(1, SHARDS - 2)  # a random moment of the drain
    acked, errors, record = _workload(topology, "replicated", stall_at)
    assert acked <= set(record), (sorted(acked - set(record)), errors)
    # the completion the stall held up was sent again to the new primary and confirmed by
    # its new replica: the unconfirmed tick never raised the worker's mark, so the worker
    # went on through the failover and drained the epoch
    assert errors == [] and acked == set(range(SHARDS)) == set(record)


@pytest.mark.timeout(180)
def test_the_default_durability_loses_acknowledged_completions_there(
    topology: Topology,
) -> None:
    """The teeth: the same schedule without the mode; completions acknowledged while the
    link was stalled are gone from the new primary's record."""
    acked, _, record = _workload(topology, "default", stall_at=4)
    assert acked - set(record), (sorted(acked), sorted(record))


# -- WAITAOF ----------------------------------------------------------------------------
def test_redis_7_0_waits_with_wait_even_with_aof_on(
    redis_factory: Callable[..., RedisServer],
) -> None:
    primary = redis_factory(aof=True)
    replica = redis_factory(extra=["--replicaof", "127.0.0.1", str(primary.port)])
    with redis.Redis.from_url(replica.url) as copy:
        deadline = time.monotonic() + 30
        while copy.info("replication")["master_link_status"] != "up":
            assert time.monotonic() < deadline
            time.sleep(0.05)
    job = _job(primary.url, "replicated", replica_timeout=5.0)
    version = tuple(int(x) for x in job.client.info("server")["redis_version"].split(".")[:2])
    if version >= (7, 2):
        pytest.skip("this server has WAITAOF: the fake below plays that branch")
    assert not durability.has_waitaof(job.client)  # 7.0 has no WAITAOF
    job.register_worker("w", heartbeat_interval=None)
    leases = job.leases("ds", 0, "w")
    assert leases.acquire() is not None
    assert job.context.scripts._waitaof is False  # asked once: WAIT
    # a server that refuses WAITAOF after all (AOF switched off, a failover): the call
    # falls back to WAIT on the same connection and is confirmed; asked again next time
    job.context.scripts._waitaof = True
    assert leases.acquire() is not None
    assert job.context.scripts._waitaof is None and job.context.scripts.shortfalls == 0
    job.close()


class _Fake:
    """The two commands ``has_waitaof`` sends, answered as Redis 7.2 with AOF on would."""

    def __init__(self, aof: int) -> None:
        self.aof = aof

    def execute_command(self, *args: Any) -> Any:
        assert args == ("WAITAOF", 0, 0, 0)
        return [0, 0]

    def info(self, section: str) -> dict[str, Any]:
        return {"aof_enabled": self.aof}


def test_where_the_server_has_waitaof_the_local_fsync_is_asked_too() -> None:
    assert durability.has_waitaof(_Fake(aof=1))
    assert not durability.has_waitaof(_Fake(aof=0))  # WAITAOF 1 is refused with AOF off
    assert durability.waits(2, 500, True) == [("WAITAOF", 1, 0, 500), ("WAIT", 2, 500)]
    assert durability.waits(2, 500, False) == [("WAIT", 2, 500)]
    assert durability.shortfall([[1, 0], 2], 2) is None
    assert durability.shortfall([[0, 0], 2], 2) == (2, False)  # not fsynced: not confirmed
    assert durability.shortfall([1], 2) == (1, True)

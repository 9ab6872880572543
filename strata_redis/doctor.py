"""``strata doctor``: is this Redis fit to coordinate training? One line per check.

Each check reads what the configured user may read (``INFO``, ``CONFIG GET``, a few probe
commands on one job's keys) and says ``ok``, ``warn`` (works, with a risk named) or
``fail`` (a guarantee or the library would break); a check this user may not make says so as
a ``warn``. The command exits non-zero when a check fails.

- Redis: the version (7.0 or later: the scripts use its commands) and the round trip (the
  median of 20 ``PING``s).
- mode: standalone or cluster, and whether the URL fits it (a cluster node needs a
  ``redis+cluster://`` URL).
- persistence: AOF (and its ``appendfsync``), RDB snapshots only, or none — what a restart
  loses, and what the job then sees (``StateRolledBackError``, ``StateLostError``).
- durability: which ``durability`` mode this deployment can honour (``durability.assess``):
  the replicas in sync (``INFO replication``), ``min-replicas-to-write``, AOF and whether the
  server has ``WAITAOF``.
- memory: ``maxmemory`` and ``maxmemory-policy`` (``era.eviction_risk``: a policy that evicts
  fails, as the library's own connect check does).
- worker / reader rights: whether this user can run what the docs' ``strata-worker`` and
  ``strata-reader`` ACL users need, by probing a job's keys (``--job``): a write that expires
  at once, a script, a transaction; reads and ``SCAN``. Nothing else of the job is touched.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import redis
from redis.exceptions import NoPermissionError, ResponseError

from .connection import is_cluster, run_read, take_reply
from .coordination import registry
from .durability import Deployment, assess, knows_waitaof
from .era import eviction_risk, queue_era_state, take_era_state
from .keys import Keys

__all__ = ["MIN_VERSION", "PROBE_JOB", "Check", "diagnose", "render"]

#: the oldest Redis the library runs on
MIN_VERSION: Final = (7, 0)
#: a round trip above this is worth a word (every lease hand-off and barrier waits on one)
SLOW_RTT_MS: Final = 5.0
#: the job whose keys the rights probes use when none is named: a shell has no training
#: script to derive a job id from (``identity.job_id``), so a fixed name
PROBE_JOB: Final = "default"
#: levels, worst last
LEVELS: Final = ("ok", "warn", "fail")


@dataclass(frozen=True)
class Check:
    """One line of the diagnosis: what was checked, its level, and what was found."""

    name: str
    level: str
    detail: str


def _info(client: Any, section: str) -> dict[str, Any] | None:
    """``INFO section`` of one node, or None when this user may not read it."""
    try:
        info = client.info(section)
    except (NoPermissionError, ResponseError):
        return None
    if isinstance(info, dict) and info and all(isinstance(v, dict) for v in info.values()):
        info = next(iter(info.values()))  # a cluster client: per node; the first node's
    return info if isinstance(info, dict) else None


def _config(client: Any, name: str) -> str | None:
    """``CONFIG GET name``, or None when this user may not run it."""
    try:
        found = client.config_get(name)
    except (NoPermissionError, ResponseError):
        return None
    if isinstance(found, dict) and found and all(isinstance(v, dict) for v in found.values()):
        found = next(iter(found.values()))
    value = found.get(name) if isinstance(found, dict) else None
    return None if value is None else str(value)


def _server(client: Any) -> Check:
    rtts = []
    for _ in range(20):
        began = time.perf_counter()
        client.ping()
        rtts.append((time.perf_counter() - began) * 1000)
    rtt = statistics.median(rtts)
    info = _info(client, "server")
    version = str(info.get("redis_version", "?")) if info else "?"
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    detail = f"Redis {version}, round trip {rtt:.2f} ms (median of 20 PINGs)"
    if info is None:
        return Check("redis", "warn", f"{detail}; INFO is not allowed to this user")
    if len(parts) == 2 and parts < MIN_VERSION:
        need = ".".join(map(str, MIN_VERSION))
        return Check("redis", "fail", f"{detail}: strata_redis needs Redis {need} or later")
    if rtt > SLOW_RTT_MS:
        return Check("redis", "warn", f"{detail}: every lease hand-off and barrier pays it")
    return Check("redis", "ok", detail)


def _mode(client: Any) -> Check:
    info = _info(client, "cluster")
    if info is None:
        return Check("mode", "warn", "INFO is not allowed to this user: mode not checked")
    enabled = bool(int(info.get("cluster_enabled", 0) or 0))
    clustered = is_cluster(client)
    if enabled and not clustered:
        return Check(
            "mode", "fail",
            "a Redis Cluster node reached with a plain URL: use redis+cluster://host:port",
        )  # fmt: skip
    return Check("mode", "ok", "Redis Cluster" if enabled else "standalone")


def _persistence(client: Any) -> Check:
    info = _info(client, "persistence")
    if info is None:
        return Check("persistence", "warn", "INFO is not allowed to this user: not checked")
    aof = bool(int(info.get("aof_enabled", 0) or 0))
    save = _config(client, "save")
    if aof:
        fsync = _config(client, "appendfsync") or "?"
        detail = f"AOF on (appendfsync {fsync})"
        if fsync != "always":
            detail += (
                ": a crash can lose the last second of writes; the job then stops with "
                "StateRolledBackError and resumes from its newest checkpoint"
            )
        return Check("persistence", "ok", detail)
    if save is None:
        return Check(
            "persistence", "warn",
            "AOF off; snapshot settings not readable by this user (CONFIG GET save)",
        )  # fmt: skip
    if save.strip():
        return Check(
            "persistence", "warn",
            f"RDB snapshots only (save {save!r}): a restart loses the writes since the last "
            "snapshot; the job stops with StateRolledBackError and resumes from its newest "
            "checkpoint. AOF (appendonly yes) loses at most a second",
        )  # fmt: skip
    return Check(
        "persistence", "warn",
        "none (no AOF, no snapshots): a restart loses every job's state; jobs stop with "
        "StateLostError and resume from their newest checkpoint in storage",
    )  # fmt: skip


def _durability(client: Any) -> Check:
    info = _info(client, "replication")
    persistence = _info(client, "persistence")
    if info is None or persistence is None:
        return Check("durability", "warn", "INFO is not allowed to this user: not checked")
    replicas = int(info.get("connected_slaves", 0) or 0)
    states = [info.get(f"slave{i}") for i in range(replicas)]
    in_sync = sum(
        1 for s in states
        if isinstance(s, dict) and s.get("state") == "online" and int(s.get("lag", 99)) <= 1
    )  # fmt: skip
    guard = _config(client, "min-replicas-to-write")
    aof = bool(int(persistence.get("aof_enabled", 0) or 0))
    deployment = Deployment(
        role=str(info.get("role", "?")), replicas=replicas, in_sync=in_sync,
        min_replicas_to_write=int(guard) if guard is not None and guard.isdigit() else None,
        aof=aof, fsync=_config(client, "appendfsync") if aof else None,
        waitaof=knows_waitaof(client),
    )  # fmt: skip
    level, detail = assess(deployment)
    return Check("durability", level, detail)


def _memory(client: Any) -> Check:
    info = _info(client, "memory")
    if info is None or "maxmemory_policy" not in info:
        return Check("memory", "warn", "INFO is not allowed to this user: policy not checked")
    policy = str(info["maxmemory_policy"])
    limit = int(info.get("maxmemory", 0) or 0)
    used = int(info.get("used_memory", 0) or 0)
    size = f"{used / 2**20:.1f} MiB used" + (f" of {limit / 2**20:.0f} MiB" if limit else "")
    risk = eviction_risk(policy, limit)
    if risk is None:
        return Check("memory", "ok", f"maxmemory-policy noeviction, {size}")
    level = "fail" if limit else "warn"
    return Check("memory", level, f"{risk} ({size}); use maxmemory-policy noeviction")


#: one probe per kind of right: (what it shows, the call); probes touch only
#: ``strata:{<job>}:doctor:*`` keys, which they delete or let expire at once
Probe = tuple[str, Callable[[Any, Keys], Any]]


def _write_probe(client: Any, keys: Keys) -> Any:
    return client.set(keys.doctor_probe("string"), 1, px=1)


def _hash_probe(client: Any, keys: Keys) -> Any:
    client.hset(keys.doctor_probe("hash"), "x", 1)
    return client.delete(keys.doctor_probe("hash"))


def _script_probe(client: Any, keys: Keys) -> Any:
    sha = client.script_load("return redis.call('EXISTS', KEYS[1])")
    return client.evalsha(sha, 1, keys.doctor_probe("script"))


def _transaction_probe(client: Any, keys: Keys) -> Any:
    with client.pipeline(transaction=True) as pipe:
        pipe.exists(keys.doctor_probe("transaction"))
        return pipe.execute()


def _pop_probe(client: Any, keys: Keys) -> Any:
    return client.blpop([keys.doctor_probe("list")], timeout=0.01)


def _read_probe(client: Any, keys: Keys) -> Any:
    """The reads the dashboard and ``strata status`` make, through the owners."""

    def queue(pipe: Any) -> None:
        queue_era_state(pipe, keys.job_id)
        registry.queue_heartbeats(pipe, keys.job_id)

    return run_read(client, queue, lambda replies: (take_era_state(replies), take_reply(replies)))


def _scan_probe(client: Any, keys: Keys) -> Any:
    if is_cluster(client):  # one node's first step is the same right
        return registry.scan_jobs(client.get_default_node().redis_connection, 0, 10)
    return registry.scan_jobs(client, 0, 10)


def _stream_probe(client: Any, keys: Keys) -> Any:
    return run_read(
        client, lambda pipe: registry.queue_events(pipe, keys.job_id, 1), registry.take_events
    )


WORKER_PROBES: Final[list[Probe]] = [
    ("a write (SET)", _write_probe),
    ("hashes (HSET, DEL)", _hash_probe),
    ("scripts (SCRIPT LOAD, EVALSHA)", _script_probe),
    ("transactions (MULTI, EXEC)", _transaction_probe),
    ("blocking pops (BLPOP)", _pop_probe),
]
READER_PROBES: Final[list[Probe]] = [
    ("reads (GET, ZRANGE)", _read_probe),
    ("listing jobs (SCAN)", _scan_probe),
    ("streams (XRANGE)", _stream_probe),
]


def _rights(client: Any, role: str, probes: list[Probe], keys: Keys) -> tuple[bool, str]:
    missing = []
    for what, probe in probes:
        try:
            probe(client, keys)
        except (NoPermissionError, ResponseError) as exc:
            if "NOPERM" not in str(exc) and not isinstance(exc, NoPermissionError):
                raise
            missing.append(what)
    if missing:
        return False, f"no {role} rights on job {keys.job_id!r}: missing {', '.join(missing)}"
    return True, f"{role} rights on job {keys.job_id!r}"


def _acl(client: Any, job_id: str) -> list[Check]:
    keys = Keys(job_id)
    worker, worker_detail = _rights(client, "worker", WORKER_PROBES, keys)
    reader, reader_detail = _rights(client, "reader", READER_PROBES, keys)
    try:
        who = str(client.acl_whoami())
    except (NoPermissionError, ResponseError):  # ACL WHOAMI not allowed: the URL's user
        kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
        who = str(kwargs.get("username") or "default")
    checks = [
        Check("worker rights", "ok" if worker else "warn", f"user {who}: {worker_detail}"),
        Check("reader rights", "ok" if reader else "warn", f"user {who}: {reader_detail}"),
    ]
    if not worker and not reader:
        detail = (
            f"user {who} can neither train nor watch job {job_id!r} (the docs' ACL users, "
            "Redis in production, list what each needs)"
        )
        checks.append(Check("rights", "fail", detail))
    return checks


def diagnose(client: redis.Redis | Any, job_id: str = PROBE_JOB) -> list[Check]:
    """Every check of this Redis, for job ``job_id``'s keys (the rights probes).

    Raises:
        redis.ConnectionError: Redis is unreachable (the first ``PING``).
    """
    checks = [_server(client), _mode(client)]
    if checks[-1].level == "fail":
        return checks  # the other checks would only repeat the redirect
    checks += [_persistence(client)]
    if not is_cluster(client):  # durability="replicated" is refused with Redis Cluster
        checks.append(_durability(client))
    checks += [_memory(client), *_acl(client, job_id)]
    return checks


def render(checks: list[Check]) -> str:
    """The diagnosis as text, one line per check."""
    width = max(len(c.name) for c in checks)
    return "\n".join(f"{c.level:<4}  {c.name:<{width}}  {c.detail}" for c in checks)


def worst(checks: list[Check]) -> str:
    """The worst level among ``checks``."""
    return max((c.level for c in checks), key=LEVELS.index, default="ok")

"""A Redis primary with a replica on loopback, each link through a ``Proxy``, and a Sentinel
watching them: the clients' address can be switched (a failover), the replication link
stalled (a replica that lags), the primary restarted from what it persisted, from nothing,
or from an older snapshot, or killed for Sentinel to promote the replica."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import redis

from ..server import RedisSentinelServer, RedisServer
from .proxy import Proxy

__all__ = ["SERVICE", "Topology"]

#: the name the Sentinel knows the primary by (``redis+sentinel://.../<SERVICE>``)
SERVICE = "strata"
#: the Sentinel calls the primary down after this long without an answer: longer than the
#: run's other faults keep it from answering (a restart; a stall of at most 2 s, plus the
#: second between its pings), so only a ``sentinel-failover`` makes it promote
DOWN_AFTER_MS = 5000
#: the Sentinel's failover timeout: far longer than a run, because after it the Sentinel
#: "repairs" a replica that replicates through the replication proxy (not from the address
#: it knows) by pointing it at the primary itself, which would take the link out of the
#: proxy (no more lag, no more cut)
FAILOVER_TIMEOUT_MS = 3_600_000


class Topology:
    """A primary and a replica, the clients' link and the replication link each through a
    proxy of its own.

    Args:
        aof: ``"always"``, ``"everysec"`` or ``""`` (no persistence) on both servers.

    Attributes:
        url: what clients connect to (the clients' proxy: a virtual IP).
        sentinel: a Sentinel (quorum 1) watching the primary as ``SERVICE``; its
            ``sentinel.port`` is what clients that follow failovers through Sentinel ask.
        primary, replica: the servers (``failover`` swaps their roles).
    """

    def __init__(self, aof: str = "") -> None:
        self.aof = aof
        self.primary = RedisServer(extra=self._persistence()).start()
        self.replica: RedisServer | None = None
        self.clients = Proxy(("127.0.0.1", self.primary.port))
        self.link: Proxy | None = None
        self.add_replica()
        self.sentinel = RedisSentinelServer(
            self.primary.port, service=SERVICE, down_after_ms=DOWN_AFTER_MS,
            failover_timeout_ms=FAILOVER_TIMEOUT_MS,
        ).start()  # fmt: skip

    def _persistence(self) -> list[str]:
        if not self.aof:
            return []
        return ["--appendonly", "yes", "--appendfsync", self.aof]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<clients' proxy port>/0``."""
        return f"redis://{self.clients.address}/0"

    def add_replica(self, timeout: float = 20.0) -> None:
        """Start a replica of the primary (through a new replication proxy), wait until it
        is in sync."""
        self.link = Proxy(("127.0.0.1", self.primary.port))
        self.replica = RedisServer(
            extra=[*self._persistence(), "--replicaof", "127.0.0.1", str(self.link.port)]
        ).start()
        deadline = time.monotonic() + timeout
        with redis.Redis(port=self.replica.port) as client:
            while client.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    raise TimeoutError("the replica did not sync")
                time.sleep(0.05)
        self.synced(timeout)
        if hasattr(self, "sentinel"):  # (the first replica is there before the Sentinel)
            self._introduce(timeout)

    def _introduce(self, timeout: float) -> None:
        """Make the Sentinel know the new replica now: it learns replicas from the primary's
        INFO, every 10 s, and one it does not know cannot be promoted (a ``sentinel-failover``
        soon after a failover or a restart timed out). ``SENTINEL RESET`` makes it forget
        the ones gone and ask the primary at once."""
        assert self.replica is not None
        deadline = time.monotonic() + timeout
        with redis.Redis(port=self.sentinel.port, decode_responses=True) as client:
            client.execute_command("SENTINEL", "RESET", SERVICE)
            while not any(int(r["port"]) == self.replica.port
                          for r in client.sentinel_slaves(SERVICE)):  # fmt: skip
                if time.monotonic() > deadline:
                    raise TimeoutError("the Sentinel did not learn of the new replica")
                time.sleep(0.05)

    def synced(self, timeout: float = 10.0) -> bool:
        """Wait (``WAIT``) until the replica has every write so far; whether it does."""
        with redis.Redis(port=self.primary.port) as client:
            return int(client.execute_command("WAIT", 1, int(timeout * 1000))) >= 1

    def lag(self, on: bool = True) -> None:
        """Stall the replication link (``on``): the primary's writes from now on are not on
        the replica until it flows again."""
        assert self.link is not None
        self.link.stall(on)

    def failover(self) -> None:
        """Kill the primary (-9), promote the replica as it is (whatever it lagged), point
        the clients' proxy at it, and start a new replica behind it."""
        assert self.replica is not None and self.link is not None
        self.primary.kill()
        self.link.close()
        with redis.Redis(port=self.replica.port) as client:
            client.execute_command("REPLICAOF", "NO", "ONE")
        old = self._promote()
        self.clients.switch(("127.0.0.1", self.primary.port))
        old.close()
        # the operator tells the Sentinel where the primary is now (it would otherwise
        # elect one itself once it calls the dead one down)
        with redis.Redis(port=self.sentinel.port) as client:
            client.execute_command("SENTINEL", "REMOVE", SERVICE)
            client.execute_command(
                "SENTINEL", "MONITOR", SERVICE, "127.0.0.1", self.primary.port, 1
            )
            for name, value in (("down-after-milliseconds", DOWN_AFTER_MS),
                                ("failover-timeout", FAILOVER_TIMEOUT_MS)):  # fmt: skip
                client.execute_command("SENTINEL", "SET", SERVICE, name, value)
        self.add_replica()

    def sentinel_failover(self, timeout: float = 30.0) -> None:
        """Kill the primary (-9) and let the Sentinel call it down and promote the replica
        as it is (whatever it lagged); point the clients' proxy where the Sentinel says
        the primary is now (what a ``client-reconfig-script`` moving a virtual IP does), and
        start a new replica behind it.

        Raises:
            TimeoutError: the Sentinel did not promote the replica within ``timeout``.
        """
        assert self.replica is not None and self.link is not None
        self.primary.kill()
        self.link.close()  # what the dead primary had not sent is gone
        want = ("127.0.0.1", self.replica.port)
        deadline = time.monotonic() + timeout
        while self.sentinel.primary() != want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Sentinel did not promote the replica in {timeout}s")
            time.sleep(0.05)
        with redis.Redis(port=self.replica.port) as client:  # promoted: it takes writes
            while client.info("replication").get("role") != "master":
                if time.monotonic() > deadline:
                    raise TimeoutError("the promoted replica is not a primary yet")
                time.sleep(0.05)
        old = self._promote()
        self.clients.switch(want)
        old.close()
        self.add_replica()

    def _promote(self) -> RedisServer:
        """The replica is the primary now: its start arguments lose ``--replicaof`` (a
        restart must bring it back as the primary, not as a replica of the closed link,
        which no new replica could sync from: ``NOMASTERLINK``). Returns the old primary."""
        assert self.replica is not None
        old, self.primary, self.replica = self.primary, self.replica, None
        extra = self.primary.extra
        at = extra.index("--replicaof")
        del extra[at : at + 3]
        return old

    def restart(self, *, wipe: bool = False, snapshot: Path | None = None) -> None:
        """Kill the primary (-9) and start it again on its port from what it persisted (the
        replica is restarted from scratch behind it).

        Args:
            wipe: start it from nothing (no persistence: everything in it is gone).
            snapshot: start it from this RDB file (``snapshot()``: an older state; its AOF,
                which has the newer writes, is dropped).
        """
        self.primary.kill()
        if wipe or snapshot is not None:
            shutil.rmtree(self.primary.dir / "appendonlydir", ignore_errors=True)
            (self.primary.dir / "dump.rdb").unlink(missing_ok=True)
        if snapshot is None:
            self.primary.start()
        else:
            # Redis reads an RDB at start only with the AOF off: then turn the AOF back on
            # (it is rewritten from the restored data)
            shutil.copyfile(snapshot, self.primary.dir / "dump.rdb")
            extra = self.primary.extra
            self.primary.extra = [a for a in extra if a not in self._persistence()]
            try:
                self.primary.start()
            finally:
                self.primary.extra = extra
            if self.aof:
                with redis.Redis(port=self.primary.port) as client:
                    client.config_set("appendfsync", self.aof)
                    client.config_set("appendonly", "yes")
        self.clients.drop()
        self._drop_replica()
        self.add_replica()

    def snapshot(self, to: Path) -> None:
        """Write the primary's state as it is now to the RDB file ``to`` (``SAVE``)."""
        with redis.Redis(port=self.primary.port) as client:
            client.save()
            name = str(client.config_get("dbfilename")["dbfilename"])
        shutil.copyfile(self.primary.dir / name, to)

    def config(self, **settings: str) -> None:
        """``CONFIG SET`` on the primary (e.g. ``maxmemory``, ``maxmemory_policy``: ``_`` for
        ``-``)."""
        with redis.Redis(port=self.primary.port) as client:
            for name, value in settings.items():
                client.config_set(name.replace("_", "-"), value)

    def used_memory(self) -> int:
        """The primary's ``used_memory``, bytes."""
        with redis.Redis(port=self.primary.port) as client:
            return int(client.info("memory")["used_memory"])

    def _drop_replica(self) -> None:
        if self.link is not None:
            self.link.close()
        if self.replica is not None:
            self.replica.close()
        self.replica = None

    def close(self) -> None:
        """Stop every server, proxy and the Sentinel."""
        self.sentinel.close()
        self.clients.close()
        self._drop_replica()
        self.primary.close()

    def __enter__(self) -> Topology:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

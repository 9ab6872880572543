"""A private ``redis-server`` on a free loopback port in a temporary directory.

The demo runs on one when no URL is given, and the test suite starts one per session (and
more for fault tests). It binds 127.0.0.1 only, and stops with the object, or on Linux
with the process that started it (a killed test run or benchmark leaves no orphan).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

INSTALL_HINT = (
    "no redis-server binary found: install one (Debian/Ubuntu: "
    "`sudo apt-get install -y redis-server`; macOS: `brew install redis`), "
    "put it on PATH or set STRATA_REDIS_SERVER=/path/to/redis-server, "
    "or pass --redis-url to use a running Redis"
)


def find_redis_server() -> str:
    """The path of a ``redis-server`` binary: ``$STRATA_REDIS_SERVER``, PATH, or /usr/bin.

    Raises:
        FileNotFoundError: none found; the message says how to get one.
    """
    candidates = [os.environ.get("STRATA_REDIS_SERVER"), shutil.which("redis-server")]
    candidates += ["/usr/bin/redis-server", "/usr/sbin/redis-server", "/usr/local/bin/redis-server"]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(INSTALL_HINT)


_PR_SET_PDEATHSIG = 1
_PRCTL: Any
try:
    _PRCTL = ctypes.CDLL(None).prctl  # resolved here, never in the child
except (OSError, AttributeError):  # not Linux: servers outlive a killed parent there
    _PRCTL = None


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the process that started it dies (Linux)."""
    _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    """Start a ``redis-server`` child in its own session, stopped with its parent where it can.

    A test run or benchmark killed with SIGTERM or SIGKILL runs no cleanup; on Linux the
    child is told to exit with its parent. The death signal follows the thread that forked,
    so it is only asked for from the main thread (whose end is the process' end).
    """
    tied = _PRCTL is not None and threading.current_thread() is threading.main_thread()
    return subprocess.Popen(
        args, stdin=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=_die_with_parent if tied else None,
    )  # fmt: skip


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1.

    Args:
        aof: turn on the append-only file (``appendfsync always``), so data survives a kill -9.
        port: a fixed port; default a free one. ``restart()`` keeps the port.
        extra: more ``redis-server`` arguments, e.g. ``["--requirepass", "pw"]``.
    """

    def __init__(
        self, *, aof: bool = False, port: int | None = None, extra: list[str] | None = None
    ):
        self.binary = find_redis_server()
        self.aof = aof
        self.port = port or free_port()
        self.extra = list(extra or [])
        self._tmp = tempfile.TemporaryDirectory(prefix="strata-redis-")
        self.dir = Path(self._tmp.name)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until it answers PING."""
        args = [
            self.binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--loglevel",
            "warning",
            "--logfile",
            str(self.dir / "redis.log"),
            "--maxclients",
            "4064",
        ]
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        args += self.extra
        self.proc = _spawn(args)
        deadline = time.monotonic() + timeout
        password = self._password()
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {log}")
            try:
                with redis.Redis(port=self.port, host="127.0.0.1", password=password) as client:
                    client.ping()
                return self
            except redis.ConnectionError:
                time.sleep(0.02)
            except redis.ResponseError:
                return self  # answers, but needs ACL credentials we don't know: it is up
        self.kill()
        raise TimeoutError(f"redis-server on port {self.port} did not answer within {timeout}s")

    def _password(self) -> str | None:
        if "--requirepass" in self.extra:
            return self.extra[self.extra.index("--requirepass") + 1]
        return None

    def kill(self) -> None:
        """SIGKILL the server (a crash, for fault tests) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        """Stop the server gracefully (SIGTERM), or kill it if it lingers."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def restart(self, *, kill: bool = False) -> RedisServer:
        """Stop (or kill) and start again on the same port and directory."""
        self.kill() if kill else self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.stop()
        with contextlib.suppress(OSError):
            self._tmp.cleanup()

    def __enter__(self) -> RedisServer:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class RedisClusterServers:
    """A private Redis Cluster of ``nodes`` primaries on loopback (tests and experiments).

    Each node is a ``RedisServer`` with cluster mode on and its bus on a free port; the
    16,384 slots are split evenly; ``start`` returns once every node says the cluster is ok.

    Attributes:
        nodes: the servers, in slot order.
        url: ``redis+cluster://127.0.0.1:<port>,...``.
    """

    def __init__(self, nodes: int = 3) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be at least 1, got {nodes}")
        self.buses = [free_port() for _ in range(nodes)]
        self.nodes = [
            RedisServer(extra=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                               "--cluster-node-timeout", "2000", "--cluster-port", str(bus)])
            for bus in self.buses
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout: float = 30.0) -> RedisClusterServers:
        """Start the nodes, give each its slots, join them, wait until the cluster is ok."""
        for node in self.nodes:
            node.start()
        clients = [redis.Redis(host="127.0.0.1", port=n.port) for n in self.nodes]
        try:
            per = 16384 // len(clients)
            for i, client in enumerate(clients):
                last = 16383 if i == len(clients) - 1 else (i + 1) * per - 1
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * per, last)  # type: ignore[no-untyped-call]
            for client in clients[1:]:
                client.execute_command(  # type: ignore[no-untyped-call]
                    "CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port, self.buses[0]
                )
            deadline = time.monotonic() + timeout
            while True:
                infos = [c.cluster("info") for c in clients]
                if all(
                    i["cluster_state"] == "ok" and int(i["cluster_known_nodes"]) == len(clients)
                    for i in infos
                ):
                    return self
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the cluster did not form within {timeout}s: {infos}")
                time.sleep(0.05)
        finally:
            for client in clients:
                client.close()

    def close(self) -> None:
        """Stop every node and remove their directories."""
        for node in self.nodes:
            node.close()

    def __enter__(self) -> RedisClusterServers:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


class RedisSentinelServer:
    """A private Redis Sentinel on loopback watching one primary as ``service`` (tests).

    Quick to decide: the primary is down after ``down_after_ms`` without an answer, and
    ``quorum`` sentinels (one by default) must agree; a failover that did not finish is
    tried again after twice ``failover_timeout_ms``. The sentinel rewrites its config file,
    kept in its own directory. ``RedisSentinels`` runs several as a group.

    Attributes:
        port: the sentinel's port.
        url: ``redis+sentinel://127.0.0.1:<port>/<service>``.
    """

    def __init__(
        self,
        primary_port: int,
        *,
        service: str = "strata",
        down_after_ms: int = 1000,
        quorum: int = 1,
        failover_timeout_ms: int = 10000,
    ) -> None:
        self.binary = find_redis_server()
        self.port = free_port()
        self.service = service
        self._tmp = tempfile.TemporaryDirectory(prefix="strata-sentinel-")
        self.dir = Path(self._tmp.name)
        (self.dir / "sentinel.conf").write_text(
            f"bind 127.0.0.1\nport {self.port}\ndir {self.dir}\n"
            f"sentinel monitor {service} 127.0.0.1 {primary_port} {quorum}\n"
            f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
            f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {service} 1\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.port}/{self.service}"

    def primary(self) -> tuple[str, int] | None:
        """Where the sentinel says the primary is (None if it does not know)."""
        with redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True) as client:
            addr = client.sentinel_get_master_addr_by_name(self.service)
        return None if not addr else (addr[0], int(addr[1]))

    def start(self, timeout: float = 10.0) -> RedisSentinelServer:
        """Start the sentinel and wait until it knows the primary."""
        self.proc = _spawn(
            [self.binary, str(self.dir / "sentinel.conf"), "--sentinel", "--logfile",
             str(self.dir / "sentinel.log")]
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server --sentinel exited with {self.proc.returncode}")
            try:
                if self.primary() is not None:
                    return self
            except redis.ConnectionError:
                pass
            time.sleep(0.05)
        self.close()
        raise TimeoutError(f"the sentinel on port {self.port} did not start within {timeout}s")

    def kill(self) -> None:
        """SIGKILL the sentinel (a crash, for fault tests) and reap it; its directory stays."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        """Stop the sentinel and remove its directory."""
        self.kill()
        with contextlib.suppress(OSError):
            self._tmp.cleanup()


class RedisSentinels:
    """A group of ``count`` private sentinels watching one primary, ``quorum`` of them needed
    to call it down (tests). A failover also needs a majority of the group to elect a leader,
    so with 3 and quorum 2 it goes on with one sentinel gone.

    ``start`` returns once every sentinel knows the primary, the others and ``replicas``
    replicas. The failover timeout is short (4 s) so that a failover whose election split is
    tried again soon (after twice that).

    Attributes:
        sentinels: the sentinels, each a ``RedisSentinelServer``.
        url: ``redis+sentinel://127.0.0.1:<port>,.../<service>``, every sentinel.
    """

    def __init__(
        self,
        primary_port: int,
        *,
        count: int = 3,
        quorum: int = 2,
        service: str = "strata",
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 4000,
    ) -> None:
        if not 1 <= quorum <= count:
            raise ValueError(f"quorum must be in [1, count={count}], got {quorum}")
        self.service = service
        self.sentinels = [
            RedisSentinelServer(primary_port, service=service, down_after_ms=down_after_ms,
                                quorum=quorum, failover_timeout_ms=failover_timeout_ms)
            for _ in range(count)
        ]  # fmt: skip

    @property
    def url(self) -> str:
        ports = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{ports}/{self.service}"

    @property
    def live(self) -> list[RedisSentinelServer]:
        """The sentinels still running."""
        return [s for s in self.sentinels if s.proc is not None and s.proc.poll() is None]

    def primary(self) -> tuple[str, int] | None:
        """Where the running sentinels say the primary is: None unless they all agree."""
        answers = {s.primary() for s in self.live}
        return answers.pop() if len(answers) == 1 else None

    def start(self, replicas: int = 0, timeout: float = 30.0) -> RedisSentinels:
        """Start every sentinel; wait until each knows the others and ``replicas`` replicas."""
        try:
            for sentinel in self.sentinels:
                sentinel.start()
            deadline = time.monotonic() + timeout
            while not self._acquainted(replicas):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the sentinels did not find each other within {timeout}s")
                time.sleep(0.05)
        except BaseException:
            self.close()
            raise
        return self

    def _acquainted(self, replicas: int) -> bool:
        for sentinel in self.sentinels:
            with redis.Redis(host="127.0.0.1", port=sentinel.port, decode_responses=True) as client:
                peers = client.sentinel_sentinels(self.service)
                known = client.sentinel_slaves(self.service)
            if len(peers) != len(self.sentinels) - 1 or len(known) != replicas:
                return False
        return True

    def close(self) -> None:
        """Stop every sentinel and remove their directories."""
        for sentinel in self.sentinels:
            sentinel.close()

    def __enter__(self) -> RedisSentinels:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

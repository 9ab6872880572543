"""A private ``redis-server`` on a free loopback port in a temporary directory.

The demo runs on one when no URL is given, and the test suite starts one per session (and
more for fault tests). It binds 127.0.0.1 only, and stops with the object.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

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
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True)
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

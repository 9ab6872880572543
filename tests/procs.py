"""Real worker processes for tests: spawn them, wait for them, kill them with SIGKILL."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

# "spawn": a fresh interpreter per worker, as on a real cluster (no inherited sockets/threads).
CTX = multiprocessing.get_context("spawn")


def spawn(target: Callable[..., Any], *args: Any) -> BaseProcess:
    """Start ``target(*args)`` in a new Python process (target must be importable)."""
    proc = CTX.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def kill9(proc: BaseProcess) -> None:
    """SIGKILL the process (no cleanup, no deregister) and reap it."""
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)


def join_all(procs: list[BaseProcess], timeout: float = 60.0) -> list[int | None]:
    """Wait for every process; kill stragglers; return the exit codes."""
    for proc in procs:
        proc.join(timeout)
        if proc.is_alive():
            kill9(proc)
    return [proc.exitcode for proc in procs]


def wait_for(
    predicate: Callable[[], bool],
    timeout: float,
    step: float = 0.02,
    why: Callable[[], Any] = lambda: None,
) -> float:
    """Poll ``predicate`` (test-side only) until it holds; return the seconds it took. Fail
    the test after ``timeout``, saying ``why()``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout}s: {why()}")
        time.sleep(step)
    return time.monotonic() - start


class Output:
    """What a subprocess prints, read on a thread as it comes (``read`` returns the next bytes,
    ``b""`` at the end): a test waits for a line with ``wait_for(lambda: ... in out.text(), ...)``
    instead of sleeping a guess at how long a loaded machine takes to print it."""

    def __init__(self, read: Callable[[], bytes]) -> None:
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, args=(read,), daemon=True)
        self._thread.start()

    def _pump(self, read: Callable[[], bytes]) -> None:
        while True:
            try:
                chunk = read()
            except (OSError, ValueError):  # a pseudo-terminal's other end closed (EIO)
                return
            if not chunk:
                return
            with self._lock:
                self._chunks.append(chunk)

    def text(self) -> str:
        """Everything printed so far."""
        with self._lock:
            data = b"".join(self._chunks)
        return data.decode(errors="replace")

    def join(self, timeout: float = 30.0) -> str:
        """Wait for the end of the output (the process closed it, or exited); all of it."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"output not closed within {timeout}s"
        return self.text()

"""The unit tier: the pure parts and the seams, driven through fakes (``fakes.py``).

No redis-server, no process, no network here: a unit test that asks for one of the process
tier's server fixtures is a usage error at collection, and every test runs with process
starts and socket connections refused, so a test that reached past a seam fails at once
instead of hanging on a timeout. The process tier (``tests/test_*.py``) drives the same
code on real servers and processes.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from typing import Any

import pytest

#: the process tier's fixtures that start a server (``tests/conftest.py``)
SERVER_FIXTURES = frozenset(
    {"redis_server", "redis_cluster", "redis_url", "redis_factory", "raw", "job", "s3_server",
     "s3_endpoint"}
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = set(callspec.params) if callspec is not None else set()
        used = SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())) - params
        if used and "tests/unit/" in item.nodeid:
            raise pytest.UsageError(
                f"{item.nodeid}: a unit test uses {sorted(used)}; servers belong to the "
                "process tier (tests/test_*.py)"
            )


@pytest.fixture(autouse=True)
def _no_processes_or_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse process starts and outgoing connections for the test's duration, from the
    test's thread and the threads it starts. (Threads that were running before it — a
    process-tier test's leftovers in a full run — keep theirs: the guard is about this test.)"""
    before = {t for t in threading.enumerate() if t is not threading.main_thread()}

    def refuse(original: Any, what: str) -> Any:
        def refused(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() in before:
                return original(*args, **kwargs)
            raise AssertionError(f"a unit test tried to {what}: use a fake at the seam")

        return refused

    for owner, name, what in (
        (subprocess.Popen, "__init__", "start a process"),
        (socket.socket, "connect", "open a connection"),
        (socket.socket, "connect_ex", "open a connection"),
    ):
        monkeypatch.setattr(owner, name, refuse(getattr(owner, name), what))

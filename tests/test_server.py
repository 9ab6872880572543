"""The private redis-server: it ends with the process that started it, even a killed one."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

import strata_redis

STARTER = """
import sys, threading, time
from strata_redis.server import RedisServer
main = RedisServer().start()
held = []
thread = threading.Thread(target=lambda: held.append(RedisServer().start()))
thread.start(); thread.join()
print(main.port, held[0].port, flush=True)
time.sleep(600)
"""


def answers(port: int) -> bool:
    try:
        with redis.Redis(host="127.0.0.1", port=port, socket_timeout=1) as client:
            return bool(client.ping())
    except redis.ConnectionError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_parent_leaves_no_redis_server() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(strata_redis.__file__).parents[1])}
    parent = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE,
                              text=True, env=env)  # fmt: skip
    assert parent.stdout is not None
    main_port, thread_port = (int(p) for p in parent.stdout.readline().split())
    from_thread = None
    try:
        assert answers(main_port) and answers(thread_port)
        parent.send_signal(signal.SIGKILL)  # no cleanup runs: no atexit, no finally
        parent.wait(10)
        deadline = time.monotonic() + 10
        while answers(main_port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not answers(main_port), "the main thread's redis-server outlived its parent"
        # one started from a short-lived thread must not die with that thread
        assert answers(thread_port)
        from_thread = thread_port
    finally:
        for port in (main_port, thread_port):
            if port == from_thread or answers(port):
                client = redis.Redis(host="127.0.0.1", port=port)
                with client, contextlib.suppress(redis.ConnectionError):
                    client.shutdown(nosave=True)
        parent.stdout.close()

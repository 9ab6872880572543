"""Our clients name strata in ``CLIENT SETINFO`` and never make redis-py look its version up
in the installed packages' metadata per connection (1-3 ms each with redis-py 8). No
server: connections are made without a command sent."""

from __future__ import annotations

from typing import Any

import pytest
import redis

import strata_redis
from strata_redis.connection import another_client, heartbeat_client, make_client

driver_info = pytest.importorskip("redis.driver_info", reason="redis-py before DriverInfo")


def test_every_client_names_strata_and_looks_no_version_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looked_up: list[int] = []

    def lib_version() -> str:
        looked_up.append(1)
        return "0"

    # (DriverInfo imports it from redis.utils when it is not given a version)
    monkeypatch.setattr("redis.utils.get_lib_version", lib_version)
    first = make_client("redis://127.0.0.1:9/0")
    clients: list[Any] = [
        first,
        heartbeat_client(first),
        another_client(first, max_connections=4, name="leases"),
        make_client("127.0.0.1:9"),
    ]
    for client in clients:
        connection = client.connection_pool.make_connection()
        info = connection.driver_info
        assert info.formatted_name == f"redis-py(strata-redis_v{strata_redis.__version__})"
        assert info.lib_version == redis.__version__
    assert looked_up == []

"""An in-process stand-in for Redis, so users can unit-test training code without a server.

``strata_redis.testing.connect()`` returns a ``Job`` backed by fakeredis with Lua (lupa):
the same scripts run as on a real server. Several ``connect()`` calls that share a
``FakeServer`` see the same state, like several workers sharing one Redis::

    server = strata_redis.testing.FakeServer()
    a = strata_redis.testing.connect(job_id="t", server=server)
    b = strata_redis.testing.connect(job_id="t", server=server)

What the stand-in does not do: persistence, ``kill -9`` of the server, Redis Cluster, and
real network failures; test those against a real ``redis-server``
(``strata_redis.server.RedisServer`` starts a private one).

Needs the ``testing`` extra: ``pip install 'strata-redis[testing]'``.
"""

from __future__ import annotations

from typing import Any

from .job import Job

try:
    import fakeredis
    from fakeredis import FakeServer
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "strata_redis.testing needs fakeredis with Lua: pip install 'strata-redis[testing]'"
    ) from exc

__all__ = ["FakeServer", "connect", "fake_client"]


def fake_client(server: FakeServer | None = None) -> Any:
    """A decoding fakeredis client on ``server`` (a new private server by default)."""
    return fakeredis.FakeRedis(server=server or FakeServer(), decode_responses=True)


def connect(job_id: str = "test", *, server: FakeServer | None = None, **options: Any) -> Job:
    """A ``Job`` on the in-process stand-in. ``options`` are those of ``Job``."""
    return Job(fake_client(server), job_id, **options)

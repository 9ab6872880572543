"""Turning what a user gives us (a URL, ``host:port`` or a client) into a redis-py client.

Accepted: ``redis://``, ``rediss://`` (TLS) and ``unix://`` URLs, with an ACL user and
password; a bare ``host:port`` or ``host`` (the seeds write ``"localhost:50051"``); an
existing ``redis.Redis``. Credentials never leave this module: ``redact`` is what every
repr, log line and error message shows.
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

DEFAULT_URL = "redis://localhost:6379/0"
URL_ENV = "STRATA_REDIS_URL"

_HOST_PORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+)(?::(?P<port>\d{1,5}))?$")
# Keys of a pool's connection_kwargs that describe the connection itself; the rest are
# redis-py internals that must not be passed to a new pool.
_CONNECTION_KWARGS = {
    "host", "port", "db", "username", "password", "path", "ssl", "ssl_keyfile",
    "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_data", "ssl_ca_path",
    "ssl_check_hostname", "ssl_password", "ssl_min_version", "ssl_ciphers",
    "socket_connect_timeout", "socket_keepalive", "socket_keepalive_options",
    "client_name", "protocol", "credential_provider", "encoding", "encoding_errors",
}  # fmt: skip


def _client_options() -> dict[str, Any]:
    # Blocking waits (barriers) bound their own time in the server, so reads have no
    # socket timeout; a dead server shows up as a closed socket or a failed keepalive.
    return {
        "decode_responses": True,
        "socket_timeout": None,
        "socket_connect_timeout": 5.0,
        "health_check_interval": 30,
        "retry": Retry(ExponentialBackoff(cap=0.5, base=0.05), 4),
    }


def redact(url: str) -> str:
    """The URL with its password (and user name) replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


def normalize_url(target: str) -> str:
    """A full Redis URL for a URL, ``host:port`` or ``host``.

    Raises:
        ValueError: not a URL of a known scheme and not ``host[:port]``.
    """
    if "://" in target:
        scheme = target.split("://", 1)[0].lower()
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError(
                f"redis URL scheme must be redis://, rediss:// or unix://, got {redact(target)!r}"
            )
        return target
    match = _HOST_PORT.match(target.strip())
    if match is None:
        raise ValueError(f"redis target must be a URL or host:port, got {target!r}")
    port = int(match["port"] or 6379)
    if not 0 < port < 65536:
        raise ValueError(f"redis port must be 1..65535, got {port}")
    return f"redis://{match['host']}:{port}/0"


def make_client(target: str | redis.Redis | None = None) -> redis.Redis:
    """A decoding redis-py client for ``target`` (default: ``$STRATA_REDIS_URL`` or localhost).

    A given ``redis.Redis`` that does not decode responses is not changed: a second client
    sharing its connection settings (with ``decode_responses=True``) is returned instead.

    Raises:
        TypeError: ``target`` is neither ``str`` nor ``redis.Redis``.
        ValueError: ``target`` is a malformed URL.
    """
    if target is None:
        target = os.environ.get(URL_ENV) or DEFAULT_URL
    if isinstance(target, redis.Redis):
        pool = target.connection_pool
        if pool.connection_kwargs.get("decode_responses"):
            return target
        kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in _CONNECTION_KWARGS}
        options = _client_options()
        retry = options.pop("retry")
        new_pool = redis.ConnectionPool(connection_class=pool.connection_class, **kwargs, **options)
        return redis.Redis(connection_pool=new_pool, retry=retry)
    if not isinstance(target, str):
        raise TypeError(
            f"redis must be a URL, host:port or redis.Redis, got {type(target).__name__}"
        )
    url = normalize_url(target)
    options = _client_options()
    if not url.startswith("unix://"):
        options["socket_keepalive"] = True
    return redis.Redis.from_url(url, **options)


def describe(client: redis.Redis) -> str:
    """A credential-free description of where ``client`` connects, for reprs and messages."""
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix://{kw['path']}"
    scheme = "rediss" if "SSL" in client.connection_pool.connection_class.__name__ else "redis"
    return f"{scheme}://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"

"""Turning what a user gives us (a URL, ``host:port`` or a client) into redis-py clients.

Accepted: ``redis://``, ``rediss://`` (TLS) and ``unix://`` URLs, with an ACL user and
password; a bare ``host:port`` or ``host`` (the seeds write ``"localhost:50051"``), also with
``user:password@`` in front; an existing ``redis.Redis``; for Redis Cluster a
``redis+cluster://[user:password@]host:port[,host:port...]`` URL (any nodes of the cluster)
or an existing ``redis.cluster.RedisCluster``; and for Redis Sentinel a
``redis+sentinel://[user:password@]host:port[,host:port...]/<service>[/<db>]`` URL (the
sentinels; the credentials are the primary's), whose client follows failovers. Credentials
never leave this module: ``redact`` is what every repr, log line and error message shows.

The connection budget of a process: every client made here has a bounded, blocking pool
(``max_connections``; a caller waits up to ``POOL_TIMEOUT`` for a free connection, then gets
``PoolExhaustedError``, which says so and is never "Redis unreachable"), a socket timeout and
TCP keepalive, so a silent partition ends in ``redis.TimeoutError`` within a bounded time.
Heartbeats get a small pool of their own (``heartbeat_client``), so they never wait behind
blocking calls. With Redis Cluster, ``max_connections`` bounds each node's pool, and redis-py's
cluster pools do not wait: past the limit a call fails at once (``MaxConnectionsError``).
"""

from __future__ import annotations

import functools
import os
import re
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import MaxConnectionsError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

# (defined with every error; imported from here before)
from .errors import PoolExhaustedError as PoolExhaustedError

DEFAULT_URL = "redis://localhost:6379/0"
URL_ENV = "STRATA_REDIS_URL"
#: connections one client (one ``JobContext`` and every context sharing it) may open. Each
#: caller blocked in a barrier or checkpoint wait holds one for at most ``MAX_BLOCK_S``.
DEFAULT_MAX_CONNECTIONS = 1000
MAX_MAX_CONNECTIONS = 100_000
#: seconds a caller waits for a free pooled connection before ``PoolExhaustedError``.
POOL_TIMEOUT = 30.0
#: seconds a reply may take before ``redis.TimeoutError`` (a silent partition ends here).
SOCKET_TIMEOUT = 30.0
#: blocking commands (BLPOP, XREAD BLOCK) block at most this long per call: well inside the
#: socket timeout, so a long wait is many short calls and never looks like a dead socket.
MAX_BLOCK_S = 10.0
#: connections of a process's heartbeat pool (heartbeats are short: a few serve hundreds).
HEARTBEAT_CONNECTIONS = 8
#: the URL scheme of a Redis Cluster: ``redis+cluster://host:port[,host:port...]``
CLUSTER_SCHEME = "redis+cluster"
#: the URL scheme of Redis Sentinel: ``redis+sentinel://host:port[,...]/<service>[/<db>]``
SENTINEL_SCHEME = "redis+sentinel"
#: TCP keepalive: probe after 10 s idle, every 5 s, give up after 3 misses (about 25 s).
_KEEPALIVE = {
    getattr(socket, name): value
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3))
    if hasattr(socket, name)
}

_HOST_PORT = re.compile(
    r"^(?:(?P<auth>[^@/]*)@)?"
    r"(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+)(?::(?P<port>\d{1,5}))?$"
)
# Query parameters of a URL that may carry a secret (redis-py passes any query parameter on).
_SECRET_QUERY = re.compile(r"pass|user|token|cred|secret|key", re.IGNORECASE)
# Keys of a pool's connection_kwargs that describe the connection itself; the rest are
# redis-py internals that must not be passed to a new pool.
_CONNECTION_KWARGS = {
    "host", "port", "db", "username", "password", "path", "ssl", "ssl_keyfile",
    "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_data", "ssl_ca_path",
    "ssl_check_hostname", "ssl_password", "ssl_min_version", "ssl_ciphers",
    "socket_connect_timeout", "socket_keepalive", "socket_keepalive_options",
    "client_name", "protocol", "credential_provider", "encoding", "encoding_errors",
}  # fmt: skip
# Settings a URL may have given that a heartbeat client copies too.
_EXTRA_KWARGS = frozenset({"health_check_interval", "retry_on_timeout"})


class StrataPool(redis.BlockingConnectionPool):
    """A blocking connection pool whose exhaustion error names the limit and the fix."""

    def __init__(self, *, pool_name: str = "client", **kwargs: Any) -> None:
        self.pool_name = pool_name
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]

    def get_connection(self, *args: Any, **options: Any) -> Any:
        """A free connection, waiting up to ``timeout`` (``PoolExhaustedError`` after)."""
        try:
            return super().get_connection()  # type: ignore[no-untyped-call]
        except MaxConnectionsError:
            raise
        except redis.ConnectionError as exc:
            if str(exc) != "No connection available.":
                raise
            where = _describe_kwargs(self.connection_kwargs, self.connection_class)
            raise PoolExhaustedError.after(
                self.max_connections, self.pool_name, where, self.timeout
            ) from None


def _client_options(socket_timeout: float) -> dict[str, Any]:
    return {
        "decode_responses": True,
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": 5.0,
        "health_check_interval": 30,
        **_driver_info(),
    }


@functools.cache
def _driver_info() -> dict[str, Any]:
    """``driver_info`` for our connections, made once a process: ``CLIENT LIST`` shows them
    as ``lib-name=redis-py(strata-redis_v<version>)``, and redis-py does not look its own
    version up in the installed packages' metadata for each connection (1-3 ms a connection
    with redis-py 8: a quarter of an orchestrator's start). Empty with a redis-py that has no
    ``DriverInfo`` (before 7.1: it names itself ``redis-py``, its version read once)."""
    try:
        from redis.driver_info import DriverInfo
    except ImportError:
        return {}
    from ._version import __version__

    info = DriverInfo(lib_version=redis.__version__)
    return {"driver_info": info.add_upstream_driver("strata-redis", __version__)}


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=0.5, base=0.05), 4)


def check_max_connections(value: object) -> int:
    """Return ``value`` if it is an int in ``[2, MAX_MAX_CONNECTIONS]``, else raise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_connections must be an int, got {type(value).__name__} {value!r}")
    if not 2 <= value <= MAX_MAX_CONNECTIONS:
        raise ValueError(f"max_connections must be 2..{MAX_MAX_CONNECTIONS}, got {value}")
    return value


def redact(url: str) -> str:
    """``url`` (or ``host:port`` target) with its credentials replaced by ``***``.

    Everything between the scheme and the last ``@`` of the address goes (user name and
    password, even a malformed one), and so do query values that may be secrets.
    """
    if not isinstance(url, str):
        return f"<{type(url).__name__}>"
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" in rest:
        # at the last '@': a password may hold '/', '?', '#' or '@' unescaped
        rest = "***@" + rest.rpartition("@")[2]
    head, qmark, query = rest.partition("?")
    if qmark:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, "***" if _SECRET_QUERY.search(k) else v) for k, v in pairs], safe="*/"
        )
    return f"{scheme}{sep}{head}{qmark}{query}"


def normalize_url(target: str) -> str:
    """A full Redis URL for a URL, ``[user:password@]host:port`` or ``host``.

    Raises:
        ValueError: not a URL of a known scheme and not ``host[:port]``.
    """
    if "://" in target:
        scheme = target.split("://", 1)[0].lower()
        if scheme not in ("redis", "rediss", "unix", CLUSTER_SCHEME, SENTINEL_SCHEME):
            raise ValueError(
                "redis URL scheme must be redis://, rediss://, unix://, redis+cluster:// or "
                f"redis+sentinel://, got {redact(target)!r}"
            )
        return target
    match = _HOST_PORT.match(target.strip())
    if match is None:
        raise ValueError(f"redis target must be a URL or host:port, got {redact(target)!r}")
    port = int(match["port"] or 6379)
    if not 0 < port < 65536:
        raise ValueError(f"redis port must be 1..65535, got {port}")
    auth = f"{match['auth']}@" if match["auth"] is not None else ""
    return f"redis://{auth}{match['host']}:{port}/0"


def _pool(
    kwargs: dict[str, Any], connection_class: Any, *, max_connections: int, name: str
) -> StrataPool:
    return StrataPool(
        pool_name=name, connection_class=connection_class, max_connections=max_connections,
        timeout=POOL_TIMEOUT, **kwargs,
    )  # fmt: skip


def _connection_kwargs(
    pool: Any, socket_timeout: float, *, keep: set[str] | frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The connection settings of ``pool`` with ours; ``keep``: more of its settings to keep
    (a URL's query parameters; they win over ours)."""
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in _CONNECTION_KWARGS}
    kwargs.update(_client_options(socket_timeout))
    for key in keep:
        if key in pool.connection_kwargs and key not in ("decode_responses", "retry"):
            kwargs[key] = pool.connection_kwargs[key]
    if "path" not in kwargs:
        kwargs["socket_keepalive"] = True
        kwargs.setdefault("socket_keepalive_options", _KEEPALIVE)
    return kwargs


def is_cluster(client: object) -> bool:
    """Whether ``client`` is a Redis Cluster client."""
    return isinstance(client, RedisCluster)


def _cluster_nodes(rest: str, url: str) -> tuple[list[ClusterNode], dict[str, Any]]:
    """The nodes and credentials of a ``redis+cluster://`` or ``redis+sentinel://`` URL
    (after the scheme)."""
    auth, at, hosts = rest.rpartition("@")
    hosts = hosts.split("/", 1)[0].split("?", 1)[0]
    nodes = []
    scheme = url.split("://", 1)[0]
    for part in hosts.split(","):
        match = _HOST_PORT.match(part.strip())
        if match is None or match["auth"] is not None or not part.strip():
            raise ValueError(f"{scheme} URL must list host:port nodes, got {redact(url)!r}")
        port = int(match["port"] or 6379)
        if not 0 < port < 65536:
            raise ValueError(f"redis port must be 1..65535, got {port}")
        nodes.append(ClusterNode(match["host"].strip("[]"), port))  # type: ignore[no-untyped-call]
    creds: dict[str, Any] = {}
    if at:
        user, colon, password = auth.partition(":")
        creds = {"username": unquote(user) or None, "password": unquote(password)}
        if not colon:
            creds = {"password": unquote(user)}
    return nodes, creds


def _cluster_client(
    nodes: list[ClusterNode], kwargs: dict[str, Any], *, max_connections: int
) -> RedisCluster:
    kwargs = {k: v for k, v in kwargs.items() if k not in ("host", "port", "db", "path")}
    return RedisCluster(startup_nodes=nodes, max_connections=max_connections, **kwargs)


def _cluster_kwargs(client: RedisCluster, socket_timeout: float) -> dict[str, Any]:
    have = client.nodes_manager.connection_kwargs
    kwargs = {k: v for k, v in have.items() if k in _CONNECTION_KWARGS}
    kwargs.update(_client_options(socket_timeout))
    kwargs["socket_keepalive"] = True
    kwargs.setdefault("socket_keepalive_options", _KEEPALIVE)
    return kwargs


def _sentinel_client(url: str, socket_timeout: float, max_connections: int) -> redis.Redis:
    """The primary of a ``redis+sentinel://`` URL's service: a client that follows failovers
    (its pool asks the sentinels where the primary is whenever it connects)."""
    rest = url.split("://", 1)[1]
    nodes, creds = _cluster_nodes(rest, url)
    path = rest.rpartition("@")[2].partition("/")[2].split("?", 1)[0].strip("/")
    service, _, db = path.partition("/")
    if not service or (db and not db.isdigit()):
        raise ValueError(f"redis+sentinel URL must end with /<service>[/<db>], got {redact(url)!r}")
    options = {**_client_options(socket_timeout), "socket_keepalive": True,
               "socket_keepalive_options": _KEEPALIVE}  # fmt: skip
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        [(n.host, n.port) for n in nodes],
        sentinel_kwargs={"socket_timeout": 5.0, "socket_connect_timeout": 5.0},
    )
    return sentinel.master_for(  # type: ignore[no-any-return,no-untyped-call]
        service, db=int(db or 0), max_connections=max_connections, **creds, **options
    )


def _sentinel_again(
    pool: SentinelConnectionPool, socket_timeout: float, max_connections: int
) -> redis.Redis:
    """A new client of ``pool``'s service, through the same sentinels, with our options."""
    kwargs = {
        k: v for k, v in pool.connection_kwargs.items()
        if k in _CONNECTION_KWARGS and k not in ("host", "port", "path")
    }  # fmt: skip
    kwargs.update(_client_options(socket_timeout))
    kwargs["socket_keepalive"] = True
    kwargs.setdefault("socket_keepalive_options", _KEEPALIVE)
    return pool.sentinel_manager.master_for(  # type: ignore[no-any-return]
        pool.service_name, max_connections=max_connections, **kwargs
    )


def _nodes_of(client: RedisCluster) -> list[ClusterNode]:
    return [ClusterNode(n.host, n.port) for n in client.get_nodes()]  # type: ignore[no-untyped-call]


def make_client(
    target: str | redis.Redis | RedisCluster | None = None,
    *,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    socket_timeout: float = SOCKET_TIMEOUT,
) -> Any:
    """A decoding redis-py client for ``target`` (default: ``$STRATA_REDIS_URL`` or localhost).

    A URL or ``host:port`` gets a bounded blocking pool of ``max_connections``, a socket
    timeout and TCP keepalive. A given ``redis.Redis`` that decodes responses is used as it
    is (its pool and timeouts are the caller's); one that does not is not changed: a second
    client with its connection settings and ours is returned instead.

    Raises:
        TypeError: ``target`` is neither ``str`` nor ``redis.Redis``.
        ValueError: ``target`` is a malformed URL, or ``max_connections`` is out of range.
    """
    check_max_connections(max_connections)
    if target is None:
        target = os.environ.get(URL_ENV) or DEFAULT_URL
    if isinstance(target, RedisCluster):
        if target.nodes_manager.connection_kwargs.get("decode_responses"):
            return target
        return _cluster_client(
            _nodes_of(target), _cluster_kwargs(target, socket_timeout),
            max_connections=max_connections,
        )  # fmt: skip
    if isinstance(target, redis.Redis):
        pool = target.connection_pool
        if pool.connection_kwargs.get("decode_responses"):
            return target
        if isinstance(pool, SentinelConnectionPool):
            return _sentinel_again(pool, socket_timeout, max_connections)
        new_pool = _pool(
            _connection_kwargs(pool, socket_timeout), pool.connection_class,
            max_connections=max_connections, name="client",
        )  # fmt: skip
        return redis.Redis(connection_pool=new_pool, retry=_retry())
    if not isinstance(target, str):
        raise TypeError(
            "redis must be a URL, host:port, redis.Redis or redis.cluster.RedisCluster, got "
            f"{type(target).__name__}"
        )
    url = normalize_url(target)
    if url.split("://", 1)[0].lower() == SENTINEL_SCHEME:
        return _sentinel_client(url, socket_timeout, max_connections)
    if url.split("://", 1)[0].lower() == CLUSTER_SCHEME:
        nodes, creds = _cluster_nodes(url.split("://", 1)[1], url)
        kwargs = {**_client_options(socket_timeout), **creds, "socket_keepalive": True,
                  "socket_keepalive_options": _KEEPALIVE}  # fmt: skip
        return _cluster_client(nodes, kwargs, max_connections=max_connections)
    try:
        parsed = redis.ConnectionPool.from_url(url)
    except ValueError as exc:  # redis-py's messages may quote the URL
        raise ValueError(f"malformed redis URL {redact(url)!r}: {redact(str(exc))}") from None
    query = dict(parse_qsl(urlsplit(url).query))
    kwargs = _connection_kwargs(parsed, socket_timeout, keep=set(query))
    pool = _pool(kwargs, parsed.connection_class, max_connections=max_connections, name="client")
    return redis.Redis(connection_pool=pool, retry=_retry())


def heartbeat_client(client: Any, *, socket_timeout: float = SOCKET_TIMEOUT) -> Any:
    """A client with the connection settings of ``client`` and a small pool of its own.

    Heartbeats go through it, so they never wait for a connection behind blocking calls
    (barrier and checkpoint waits) of the same process. A client of another connection
    class than redis-py's own (an in-process stand-in) is returned as it is.
    """
    return another_client(
        client, socket_timeout=socket_timeout, max_connections=HEARTBEAT_CONNECTIONS,
        name="heartbeat",
    )  # fmt: skip


def another_client(
    client: Any, *, max_connections: int, name: str, socket_timeout: float = SOCKET_TIMEOUT
) -> Any:
    """A new client with the connection settings of ``client`` and a pool of its own.

    Args:
        client: the client to copy the settings of (plain, Sentinel or Cluster).
        max_connections: the new pool's size.
        name: the pool's name in its exhaustion error (``PoolExhaustedError``).
        socket_timeout: seconds one reply may take.

    Returns:
        The new client; a client of another connection class than redis-py's own (an
        in-process stand-in) is returned as it is.
    """
    if isinstance(client, RedisCluster):
        return _cluster_client(
            _nodes_of(client), _cluster_kwargs(client, socket_timeout),
            max_connections=max_connections,
        )  # fmt: skip
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):  # another client of the same service
        return _sentinel_again(pool, socket_timeout, max_connections)
    if not getattr(pool.connection_class, "__module__", "").startswith("redis."):
        return client
    kwargs = _connection_kwargs(pool, socket_timeout, keep=_EXTRA_KWARGS)
    new_pool = _pool(kwargs, pool.connection_class, max_connections=max_connections, name=name)
    return redis.Redis(connection_pool=new_pool, retry=_retry())


def server_time(client: Any, key: str) -> tuple[int, int]:
    """Redis' clock, ``(seconds, microseconds)``, of the node holding ``key`` (a cluster's
    nodes each have their own)."""
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        sec, usec = client.time(target_nodes=node)
    else:
        sec, usec = client.time()
    return int(sec), int(usec)


#: the COUNT hint of one HSCAN/SSCAN step where a hash or set may be huge (an epoch's record
#: of 10^7 shards: one HKEYS of it would hold Redis for seconds)
SCAN_STEP = 1_000


def hash_items(
    client: Any, key: str, *, first: tuple[int, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A hash read in ``HSCAN`` steps (each one bounded command, however big the hash). Not a
    snapshot: a field written during the read may be missed; fields present throughout are
    all returned. ``first``: its first step's reply (cursor, fields), already read (in a
    pipeline)."""
    cursor, found = first if first is not None else (None, {})
    out = dict(found)
    while cursor is None or int(cursor):
        cursor, more = client.hscan(key, cursor or 0, count=SCAN_STEP)
        out.update(more)
    return out


def zrange_pages(
    client: Any, key: str, page: int, *, first: list[Any] | None = None, withscores: bool = False
) -> list[Any]:
    """A sorted set in rank order, read in pages of ``page`` members, each one bounded
    ``ZRANGE`` (one ``ZRANGE`` of 10^5 members holds Redis for ~16 ms). ``first``: its
    first page, already read (in a pipeline). Members that move during the read may be
    missed or seen twice."""
    out = list(first) if first is not None else []
    last = out if first is not None else [None] * page
    while len(last) == page:
        last = client.zrange(key, len(out), len(out) + page - 1, withscores=withscores)
        out += last
    return out


# -- batched reads: an owner's queue/take pair ------------------------------------------------
# A reader that batches (the dashboard) passes its pipeline to the owners: ``queue_x(pipe,
# ...)`` queues the commands of one read, and after ``execute`` ``take_x(replies, ...)``
# consumes exactly those replies from an iterator over them (in the order they were queued)
# and returns the owner's typed value. The owner's single-call method is the same pair around
# a pipeline of its own, so each stored format has one parser.

#: what a ``take_`` function reads from: an iterator over a pipeline's replies
Replies = Iterator[Any]
T = TypeVar("T")


def take_reply(replies: Replies) -> Any:
    """The next reply; a command's error (``execute(raise_on_error=False)``) is raised."""
    reply = next(replies)
    if isinstance(reply, Exception):
        raise reply
    return reply


def run_read(client: Any, queue: Callable[[Any], None], take: Callable[[Replies], T]) -> T:
    """One queue/take pair on a pipeline of its own: one round trip (a single-call read)."""
    with client.pipeline(transaction=False) as pipe:
        queue(pipe)
        replies = iter(pipe.execute())
    return take(replies)


def score_pairs(reply: Any) -> list[tuple[Any, Any]]:
    """A ``WITHSCORES`` reply as (member, score) pairs (RESP2 gives it flat)."""
    if reply and not isinstance(reply[0], (list, tuple)):
        return list(zip(reply[::2], reply[1::2], strict=True))
    return [tuple(p) for p in reply]


@dataclass(frozen=True)
class StreamPage(Generic[T]):
    """The newest entries of a capped stream, as one bounded read returned them.

    Attributes:
        entries: ``(entry id, decoded entry)``, newest first.
        length: the stream's length when it was read (``XLEN``).
    """

    entries: list[tuple[str, T]]
    length: int


def queue_stream_page(pipe: Any, key: str, count: int, after: str | None = None) -> None:
    """Queue a read of the newest ``count`` entries of stream ``key`` (only those after entry
    id ``after``, if given: a reader that keeps what it read asks only for what is new), and
    its length."""
    if after is None:
        pipe.xrevrange(key, count=count)
    else:
        pipe.xrevrange(key, max="+", min=f"({after}", count=count)
    pipe.xlen(key)


def take_stream_page(replies: Replies, decode: Callable[[str, dict[str, str]], T]) -> StreamPage[T]:
    """The page ``queue_stream_page`` queued, each entry decoded by ``decode(id, fields)``."""
    entries = take_reply(replies)
    length = int(take_reply(replies))
    return StreamPage([(str(i), decode(str(i), f)) for i, f in entries], length)


def max_block(client: Any) -> float:
    """Seconds a blocking command on ``client`` may block: within its socket timeout."""
    if isinstance(client, RedisCluster):
        timeout = client.nodes_manager.connection_kwargs.get("socket_timeout")
    else:
        timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
    if timeout is None:
        return MAX_BLOCK_S
    return max(0.01, min(MAX_BLOCK_S, float(timeout) / 3))


def describe(client: Any) -> str:
    """A credential-free description of where ``client`` connects, for reprs and messages."""
    if isinstance(client, RedisCluster):
        nodes = ",".join(f"{n.host}:{n.port}" for n in client.get_nodes())  # type: ignore[no-untyped-call]
        return f"{CLUSTER_SCHEME}://{nodes}"
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        sentinels = ",".join(f"{s.connection_pool.connection_kwargs.get('host')}:"
                             f"{s.connection_pool.connection_kwargs.get('port')}"
                             for s in pool.sentinel_manager.sentinels)  # fmt: skip
        return f"{SENTINEL_SCHEME}://{sentinels}/{pool.service_name}"
    return _describe_kwargs(pool.connection_kwargs, pool.connection_class)


def _describe_kwargs(kw: dict[str, Any], connection_class: Any) -> str:
    if "path" in kw:
        return f"unix://{kw['path']}"
    scheme = "rediss" if "SSL" in connection_class.__name__ else "redis"
    return f"{scheme}://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"

"""The dashboard's Flask app: the page, ``GET /api/dashboard``, ``/metrics``; read-only.

Every route reads through ``state.DashboardState`` (the one module that touches Redis, and
only reads) into a ``snapshot.Snapshot``, and shapes it: ``document.py`` into the JSON,
``metrics.py`` into ``/metrics``. Identical requests arriving within ``min_interval``
seconds share one read (and its JSON), so a room full of open pages costs Redis no more
than one. With a ``token``, every route but
``/healthz`` wants it: an ``Authorization: Bearer <token>`` header, or the cookie that
opening ``/?token=<token>`` once sets.
"""

from __future__ import annotations

import hmac
import threading
import time
from typing import Any

import orjson
import redis as redis_py
from flask import Flask, Response, redirect, render_template, request

import strata_redis
from strata_redis.checkpoint.records import MB_S_DEFINITION
from strata_redis.connection import make_client
from strata_redis.errors import JobNotFoundError

from .document import document, schema_text
from .metrics import render_metrics
from .snapshot import Snapshot
from .state import MAX_LIMIT, DashboardState, check_job_id

COOKIE = "strata_dashboard_token"
#: seconds between the page's requests (each is sent only after the previous reply arrived)
POLL_INTERVAL = 1.0
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


class ReadsBusyError(Exception):
    """Every request thread the reads may hold already waits on Redis (a stall)."""


class _Read:
    """One shared read: its snapshot, and its JSON made once, when first asked for."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self._json: bytes | None = None

    def json(self) -> bytes:
        if self._json is None:  # two threads may both make it: the same bytes
            self._json = orjson.dumps(document(self.snapshot))
        return self._json


class _SharedReads:
    """One read per (job, page) at a time, reused for ``min_interval`` seconds.

    At most ``limit`` requests wait on Redis at once (None: no limit); more are refused at
    once (``ReadsBusyError``): when Redis stalls, the server's other request threads stay
    free for ``/healthz`` and the page. ``serve`` sets it to one below its thread count.
    """

    def __init__(self, state: DashboardState, min_interval: float) -> None:
        self.state = state
        self.min_interval = min_interval
        self.limit: int | None = None
        #: Unix ms (this server's clock) of the first failed read since the last good one
        self.down_since_ms: int | None = None
        #: ``time_ms`` (Redis' clock) of the newest document read, None before the first
        self.last_read_ms: int | None = None
        self._busy = 0
        self._lock = threading.Lock()
        self._locks: dict[tuple[Any, ...], threading.Lock] = {}
        self._docs: dict[tuple[Any, ...], tuple[float, _Read]] = {}

    def get(self, job: str | None, offset: int, limit: int) -> _Read:
        try:
            with self._lock:
                if self.limit is not None and self._busy >= self.limit:
                    raise ReadsBusyError(f"{self._busy} requests already wait on Redis")
                self._busy += 1
            try:
                doc = self._get(job, offset, limit)
            finally:
                with self._lock:
                    self._busy -= 1
        except (redis_py.RedisError, ReadsBusyError):
            with self._lock:
                if self.down_since_ms is None:
                    self.down_since_ms = int(time.time() * 1000)
            raise
        with self._lock:
            self.down_since_ms = None
            self.last_read_ms = max(self.last_read_ms or 0, doc.snapshot.time_ms)
        return doc

    def _get(self, job: str | None, offset: int, limit: int) -> _Read:
        key = (job, offset, limit)
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            cached = self._docs.get(key)
            if cached is not None and time.monotonic() - cached[0] < self.min_interval:
                return cached[1]
            doc = _Read(self.state.read(job, offset=offset, limit=limit))
            with self._lock:
                if len(self._docs) > 256:  # distinct pages asked for: keep the map small
                    self._docs.clear()
                self._docs[key] = (time.monotonic(), doc)
            return doc


def create_app(
    redis: str | redis_py.Redis | strata_redis.Job | None = None,
    *,
    job: str | None = None,
    token: str | None = None,
    heartbeat_timeout: float | None = None,
    gone_window: float = 600.0,
    min_interval: float = 0.5,
    poll_interval: float = POLL_INTERVAL,
) -> Flask:
    """The dashboard as a Flask (WSGI) app.

    Args:
        redis: a Redis URL, ``host:port``, a ``redis.Redis`` or a ``Job``; default
            ``$STRATA_REDIS_URL`` or ``redis://localhost:6379/0``.
        job: show only this job (no job list, no ``SCAN``); default every job, or the
            ``Job``'s when ``redis`` is one.
        token: when set, every request but ``/healthz`` must carry it (see the module doc).
        heartbeat_timeout: the job's heartbeat timeout, seconds: a live worker silent for
            longer is shown as stale. Default the ``Job``'s, else 10.
        gone_window: seconds a worker that failed or left stays listed (and exported).
        min_interval: requests for the same view within this many seconds share one read.
        poll_interval: seconds the page waits after a reply before it asks again.

    Returns:
        The app; serve it with ``strata_redis.dashboard.serve`` or any WSGI server.

    Raises:
        ValueError, TypeError: a bad argument, named in the message.
    """
    if isinstance(redis, strata_redis.Job):
        client = redis.client
        job = job if job is not None else redis.job_id
        heartbeat_timeout = heartbeat_timeout or redis.heartbeat_timeout
    else:
        # our own client (a URL: plain, TLS, Sentinel or Cluster): a stuck Redis fails the
        # request instead of hanging it; a given client keeps the caller's timeouts
        owned = redis is None or isinstance(redis, str)
        client = make_client(redis, socket_timeout=10.0) if owned else make_client(redis)
    if job is not None:
        check_job_id(job)
    if token is not None and (not isinstance(token, str) or len(token) < 16):
        raise ValueError("token must be a str of at least 16 characters")
    for name, value in (("min_interval", min_interval), ("poll_interval", poll_interval)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
    state = DashboardState(
        client, heartbeat_timeout=heartbeat_timeout or 10.0, gone_window=gone_window
    )
    reads = _SharedReads(state, float(min_interval))
    app = Flask(__name__)
    app.config["STRATA_STATE"] = state
    app.config["STRATA_READS"] = reads  # serve() bounds the requests waiting on Redis
    app.json.sort_keys = False  # type: ignore[attr-defined]

    def authorized() -> bool:
        if token is None:
            return True
        header = request.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else request.cookies.get(COOKIE, "")
        return hmac.compare_digest(given.encode(), token.encode())

    @app.before_request
    def _guard() -> Response | None:
        if request.path == "/healthz":
            return None
        if token is not None and request.args.get("token") is not None:
            # A link with the token: trade it for a cookie, and drop it from the address bar.
            if not hmac.compare_digest(request.args["token"].encode(), token.encode()):
                return _error(401, "wrong token")
            response = redirect(request.path, code=303)
            response.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
            return response  # type: ignore[return-value]
        if not authorized():
            return _error(401, "this dashboard wants a token: an 'Authorization: Bearer "
                          "<token>' header, or open /?token=<token> once")  # fmt: skip
        return None

    @app.after_request
    def _headers(response: Response) -> Response:
        response.headers["Content-Security-Policy"] = _CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["X-Frame-Options"] = "DENY"
        if not request.path.startswith("/static/"):
            response.headers["Cache-Control"] = "no-store"
        return response

    def page(job_id: str | None) -> str:
        return render_template(
            "index.html", job=job_id, redis=state.redis_description,
            poll_ms=int(poll_interval * 1000), fixed_job=job is not None,
            version=strata_redis.__version__, mb_s_definition=MB_S_DEFINITION,
        )  # fmt: skip

    @app.get("/")
    def index() -> str:
        return page(job)

    @app.get("/job/<path:job_id>")
    def job_page(job_id: str) -> Any:
        if job is not None and job_id != job:
            return _error(404, f"this dashboard shows job {job!r} only, not {job_id!r}")
        try:
            check_job_id(job_id)
        except JobNotFoundError as exc:
            return _error(404, str(exc))
        return page(job_id)

    @app.get("/api/dashboard")
    def api_dashboard() -> Response:
        job_id = request.args.get("job", job)
        if job is not None and job_id != job:
            return _error(404, f"this dashboard shows job {job!r} only, not {job_id!r}")
        try:
            offset = _int_arg("offset", 0, 0, 10**9)
            limit = _int_arg("limit", 1000, 1, MAX_LIMIT)
            doc = reads.get(job_id, offset, limit)
        except JobNotFoundError as exc:
            return _error(404, str(exc))
        except ValueError as exc:
            return _error(400, str(exc))
        except (redis_py.RedisError, ReadsBusyError) as exc:
            return _redis_error(exc)
        return Response(doc.json(), mimetype="application/json")

    @app.get("/api/schema")
    def api_schema() -> Response:
        return Response(schema_text(), mimetype="application/schema+json")

    @app.get("/metrics")
    def metrics() -> Response:
        # Redis down or stalled: HTTP 200 with strata_redis_up 0, so Prometheus sees the
        # exporter up and Redis down (an alert on strata_redis_up == 0)
        snap: Snapshot | None
        try:
            snap = reads.get(job, 0, MAX_LIMIT).snapshot
        except (redis_py.RedisError, ReadsBusyError):
            snap = None
        text, content_type = render_metrics(snap)
        return Response(text, content_type=content_type)

    @app.get("/healthz")
    def healthz() -> Response:
        return Response("ok\n", mimetype="text/plain")

    def _redis_error(exc: redis_py.RedisError | ReadsBusyError) -> Response:
        # what the page's banner needs: where (no credentials), since when, and the time of
        # the newest numbers this server read
        where = {
            "redis": state.redis_description,
            "redis_down_since_ms": reads.down_since_ms,
            "last_read_ms": reads.last_read_ms,
        }
        if isinstance(exc, ReadsBusyError):
            response = _error(503, f"Redis at {state.redis_description} is slow to answer: "
                                   f"{exc}; try again", **where)  # fmt: skip
            response.headers["Retry-After"] = "1"
            return response
        detail = " ".join(str(exc).split()).rstrip(".")
        return _error(503, f"Redis at {state.redis_description} failed: "
                           f"{type(exc).__name__}: {detail}", **where)  # fmt: skip

    return app


def _int_arg(name: str, default: int, low: int, high: int) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return value


def _error(status: int, message: str, **extra: Any) -> Response:
    if (
        status == 404
        and request.accept_mimetypes.accept_html
        and not request.path.startswith("/api/")
    ):
        return Response(f"{message}\n", status=status, mimetype="text/plain")
    body = orjson.dumps({"error": message, "status": status, **extra})
    return Response(body, status=status, mimetype="application/json")


__all__ = ["COOKIE", "ReadsBusyError", "create_app", "schema_text"]

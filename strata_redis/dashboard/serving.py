"""Serving the dashboard with waitress, a production WSGI server (pure Python, threaded)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from ..errors import PortError

__all__ = ["PortError", "serve"]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def serve(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 8050,
    *,
    threads: int = 8,
    ready: Callable[[str], None] = print,
) -> None:
    """Serve ``app`` on ``host:port`` until Ctrl-C (SIGINT) or SIGTERM.

    Args:
        app: a WSGI app (``create_app()``).
        host, port: where to listen; port 0 picks a free one.
        threads: request threads. With the dashboard's app, at most ``threads - 1`` of
            them wait on Redis at once (more requests get 503 at once), so ``/healthz``
            answers during a Redis stall.
        ready: called with the URL once the socket listens (default: print it).

    Raises:
        PortError: ``host:port`` is in use or cannot be bound (named in the message).
    """
    from waitress import create_server

    reads = getattr(app, "config", {}).get("STRATA_READS")
    if reads is not None:  # keep a thread free of Redis: /healthz never waits behind a stall
        reads.limit = max(1, threads - 1)

    try:
        server: Any = create_server(
            app, host=host, port=port, threads=threads, ident="strata-dashboard",
            clear_untrusted_proxy_headers=True,
        )  # fmt: skip
    except OSError as exc:  # a busy or forbidden port: say which one
        raise PortError(host, port, exc) from exc
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    shown = f"[{host}]" if ":" in host else host
    ready(f"http://{shown}:{server.effective_port}/")
    try:
        server.run()  # returns on KeyboardInterrupt (waitress stops its threads then)
    finally:
        server.close()

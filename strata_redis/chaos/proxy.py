"""A TCP proxy on loopback that the fault checker steers: switch its upstream, delay, stall or
cut its link (what Sentinel with a virtual IP, a slow network and a partition do)."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections import deque

__all__ = ["Proxy"]

_CHUNK = 1 << 16


class Proxy:
    """Listens on ``127.0.0.1:<port>`` and forwards each connection to ``upstream``.

    Every connection runs on one selector thread of the proxy; bytes are held back
    ``delay`` seconds in each direction (``delay``), not forwarded at all while the link
    is stalled (``stall``: they queue, then flow), or the connections are closed and new
    ones refused (``cut``). ``switch`` points new connections elsewhere and closes the open
    ones, as a failover behind a virtual IP does.

    Args:
        upstream: ``(host, port)`` to forward to.
        port: the port to listen on (0: a free one; ``port`` says which).
    """

    def __init__(self, upstream: tuple[str, int], port: int = 0) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", port))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self.delay = 0.0
        self._stalled = False
        self._armed = False  # stall at the next byte that comes through
        self._cut = False
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        # each socket's peer and the bytes waiting to go to that socket: (due time, bytes)
        self._peer: dict[socket.socket, socket.socket] = {}
        self._out: dict[socket.socket, deque[tuple[float, bytes]]] = {}
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"proxy-{self.port}", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    def switch(self, upstream: tuple[str, int]) -> None:
        """Forward new connections to ``upstream``; close the open ones."""
        with self._lock:
            self.upstream = upstream
        self.drop()

    def stall(self, on: bool = True) -> None:
        """Hold every byte back (``on``), or let what queued flow again."""
        self._armed = False
        self._stalled = on

    def stall_next(self) -> None:
        """Stall the link (as ``stall``) as soon as the next byte comes through, in either
        direction: from inside the first request or reply after now (``stalled`` says when)."""
        self._armed = True

    @property
    def stalled(self) -> bool:
        """Whether the link is stalled now."""
        return self._stalled

    def cut(self, on: bool = True) -> None:
        """Close every connection and refuse new ones (``on``), or accept again."""
        self._cut = on
        if on:
            self.drop()

    def drop(self) -> None:
        """Close every open connection (the clients see a reset and reconnect)."""
        with self._lock:
            for sock in list(self._peer):
                self._close(sock)

    def close(self) -> None:
        """Stop the proxy and close everything."""
        self._closing = True
        self._thread.join(timeout=5)
        self.drop()
        with contextlib.suppress(OSError):
            self._listener.close()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the selector thread ------------------------------------------------------------------
    def _close(self, sock: socket.socket) -> None:
        peer = self._peer.pop(sock, None)
        self._out.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(sock)
        with contextlib.suppress(OSError):
            sock.close()
        if peer is not None and peer in self._peer:
            self._close(peer)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except (BlockingIOError, OSError):
            return
        if self._cut:
            client.close()
            return
        try:
            upstream = socket.create_connection(self.upstream, timeout=2)
        except OSError:
            client.close()
            return
        for sock in (client, upstream):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._peer[client], self._peer[upstream] = upstream, client
        self._out[client], self._out[upstream] = deque(), deque()
        self._selector.register(client, selectors.EVENT_READ, "conn")
        self._selector.register(upstream, selectors.EVENT_READ, "conn")

    def _run(self) -> None:
        while not self._closing:
            events = self._selector.select(timeout=0.005)
            with self._lock:
                for key, _ in events:
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if key.data is None:
                        self._accept()
                        continue
                    if sock not in self._peer:
                        continue
                    try:
                        data = sock.recv(_CHUNK)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        self._close(sock)
                        continue
                    if self._armed:
                        self._armed, self._stalled = False, True
                    self._out[self._peer[sock]].append((time.monotonic() + self.delay, data))
                self._flush()

    def _flush(self) -> None:
        if self._stalled:
            return
        now = time.monotonic()
        for sock, queue in list(self._out.items()):
            while queue and queue[0][0] <= now:
                due, data = queue[0]
                try:
                    sent = sock.send(data)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    self._close(sock)
                    break
                if sent < len(data):
                    queue[0] = (due, data[sent:])
                    break
                queue.popleft()

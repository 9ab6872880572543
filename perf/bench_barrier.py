"""Barrier release latency beside a bare BLPOP floor and torch's TCPStore, in one run.

    python perf/bench_barrier.py --fast -o perf/results/bench_barrier.json
    python perf/bench_barrier.py --participants 100 --modes strata,floor --rounds 500
    python -m pyperf compare_to perf/baseline/bench_barrier.json perf/results/bench_barrier.json

Every participant has its own connection. The participants live in harness processes
(``--harness-procs``, default 1: Redis takes one core of a small machine, the participants
the other; with several, whichever process blocked first is served first, which skews the
floor); this process makes the last arrival and times from just before it
until the last participant has woken (CLOCK_MONOTONIC, shared by all processes). All modes
are set up at once and measured round by round in rotating order, so the load of a shared
machine drifts over all of them alike and their ratios hold; pyperf's one-benchmark-per-
process runner cannot interleave. The results are a pyperf JSON suite, one value per
release, so percentiles over values are percentiles over releases. Modes:

- ``floor``: N raw connections block in ``BLPOP``; one ``RPUSH`` of N tokens wakes them.
  No barrier logic: the lower bound of a one-push release through Redis.
- ``strata``: N-1 participants run the library's protocol multiplexed on raw sockets in each
  harness process: ``arrive_barrier.lua`` with the library's own keys and args, then
  ``BLPOP`` on the release list (``XREAD`` for the two watchers). The last arrival is the
  library's ``Barrier.wait()``.
- ``strata-threads``: one thread per participant calling ``Barrier.wait()``: the whole
  client code path, and Python's thread wake-ups with it.
- ``floor-threads``: the floor with one thread per participant, for comparison with it.
- ``tcpstore``: ``torch.distributed.TCPStore`` used as a barrier: ``add(arrive, 1)`` then
  ``wait([go])``; the last arrival (torch's own client) ``add``s N and ``set``s ``go``.
  The server is torch's; the N-1 participants are multiplexed on raw sockets like
  ``strata``'s, sending the bytes torch 2.13's client sends (checked at connect: the
  handshake must be echoed).
- ``tcpstore-threads``: the same with torch's own client, one thread per participant.

``tcpstore*`` need torch (optional: ``pip install torch``); they are skipped without it.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import os
import resource
import selectors
import socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d warns once per client socket

import hiredis
import pyperf
import redis

import strata_redis
from strata_redis.server import RedisServer

LABELS = {
    "floor": "floor BLPOP",
    "strata": "strata barrier",
    "strata-threads": "strata Barrier.wait threads",
    "floor-threads": "floor BLPOP threads",
    "tcpstore": "TCPStore add+wait",
    "tcpstore-threads": "TCPStore add+wait threads",
}
THREADED = {"strata-threads", "floor-threads", "tcpstore-threads"}
RATIOS = [
    (f"{LABELS[a]} x{n}", f"{LABELS[b]} x{n}")
    for n in (100, 1000)
    for a, b in [
        ("strata", "floor"),
        ("tcpstore", "strata"),
        ("strata-threads", "floor-threads"),
        ("tcpstore-threads", "strata-threads"),
    ]
]
BARRIER = "bench"
HEARTBEAT_TIMEOUT = 3600.0  # no heartbeats during a run: nobody may be declared failed
WAIT_S = 60.0
SETTLE_S = 0.02  # after every participant is blocked, before the timed arrival


def raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def name_of(mode: str, n: int) -> str:
    return f"{LABELS[mode]} x{n}"


def have_torch() -> bool:
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return False
    return True


# -- harness processes ------------------------------------------------------------------------


def pack(*args: Any) -> bytes:
    """One command in RESP."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


#: torch 2.13's TCPStore client protocol (little endian): a query byte, u64-length-prefixed
#: keys with the client's "/" prefix; ADD answers an i64, WAIT one byte (0 = stop waiting).
#: Connecting sends VALIDATE + magic (torch's client then PINGs). Here the server stalls
#: ~5 s on about one new connection in 50 before it answers its first request (it looks up
#: the client's host name: c10d logs "hostname ... cannot be retrieved"); that slows the
#: setup only, which sends every connection's first request.
TCPSTORE_VALIDATE = b"\x00" + struct.pack("<I", 0x3C85F7CE)


def tcpstore_key(key: str) -> bytes:
    data = ("/" + key).encode()
    return struct.pack("<Q", len(data)) + data


class LoopHarness:
    """Many participants on raw non-blocking sockets, one selector, one thread."""

    def __init__(
        self, mode: str, url: str, job_id: str, ids: list[str], n: int, tcp_port: int
    ) -> None:
        self.mode, self.ids, self.n = mode, ids, n
        host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
        if mode == "tcpstore":
            host, port = "127.0.0.1", str(tcp_port)
        self.selector = selectors.DefaultSelector()
        self.socks: list[socket.socket] = []
        self.readers: list[Any] = []
        for i in range(len(ids)):
            sock = socket.create_connection((host, int(port)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.selector.register(sock, selectors.EVENT_READ, i)
            if mode == "tcpstore":
                # a first request on every connection, answered as this protocol says; it
                # also absorbs the server's per-connection stall (see TCPSTORE_VALIDATE)
                check = b"\x04" + tcpstore_key(f"connected-{job_id}") + struct.pack("<q", 1)
                sock.sendall(TCPSTORE_VALIDATE + check)
            self.socks.append(sock)
        for sock in self.socks:
            if mode == "tcpstore":
                sock.settimeout(600)
                if struct.unpack("<q", sock.recv(8, socket.MSG_WAITALL)) < (1,):
                    raise RuntimeError("not the TCPStore protocol this benchmark speaks")
            sock.setblocking(False)
            self.readers.append(
                TcpStoreReader() if mode == "tcpstore" else hiredis.Reader(encoding="utf-8")
            )
        if mode == "strata":
            job = strata_redis.connect(url, job_id, heartbeat_timeout=HEARTBEAT_TIMEOUT)
            self.barrier = job.barrier(BARRIER, expected=n, timeout=WAIT_S)
            self.sha = job.client.script_load(job.scripts["arrive_barrier"].script)
            self.scripts = job.scripts
            self.slice_ms = int(HEARTBEAT_TIMEOUT / 2 * 1000)
            self.events = job.keys.events
        self.floor_key = f"bench:{{{job_id}}}:floor"

    def arm(self, r: int, gen: int) -> None:
        self.round, self.gen, self.woke = r, gen, [0.0] * len(self.ids)
        self.state = [0] * len(self.ids)  # 0 arriving, 1 blocked, 2 woken
        self.stamped: list[list[Any]] = [[] for _ in self.ids]
        for i, worker_id in enumerate(self.ids):
            if self.mode == "floor":
                self.socks[i].sendall(pack("BLPOP", f"{self.floor_key}:{r}", 0))
                self.state[i] = 1
            elif self.mode == "tcpstore":
                self.readers[i].expect(8)
                self.socks[i].sendall(b"\x04" + tcpstore_key(f"arrive{r}") + struct.pack("<q", 1))
            else:
                call = self.barrier.arrive_call(worker_id, uuid.uuid4().hex, gen, WAIT_S)
                keys, args = self.scripts.stamp(call[1], call[2])  # with the job's era
                self.stamped[i] = args  # unwrap reads the call's id from them
                self.socks[i].sendall(pack("EVALSHA", self.sha, len(keys), *keys, *args))
        self.pump(lambda: all(self.state))

    def collect(self) -> tuple[float, list[str]]:
        self.errors: list[str] = []
        self.pump(lambda: all(s == 2 for s in self.state))
        return max(self.woke), self.errors

    def pump(self, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT_S
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError("harness participants did not finish")
            for key, _ in self.selector.select(1.0):
                i = key.data
                reader = self.readers[i]
                reader.feed(self.socks[i].recv(1 << 16))
                while (reply := reader.gets()) is not False:
                    self.on_reply(i, reply)

    def on_reply(self, i: int, reply: Any) -> None:
        now = time.perf_counter()
        if isinstance(reply, Exception):
            raise reply
        if self.state[i] == 0 and self.mode == "tcpstore":  # ADD answered: WAIT
            self.readers[i].expect(1)
            go = b"\x06" + struct.pack("<Q", 1) + tcpstore_key(f"go{self.round}")
            self.socks[i].sendall(go)
            self.state[i] = 1
            return
        if self.state[i] == 0:  # the arrival's reply: block as Barrier._await does
            reply = self.scripts.unwrap(reply, self.stamped[i])  # the tick off, refusals raised
            code, gen, _index, _now, outcome, wake_id, events_id = reply
            if code != 0 or outcome:
                raise RuntimeError(f"unexpected arrival reply {reply!r}")
            if wake_id:
                cmd = pack(
                    "XREAD", "COUNT", 100, "BLOCK", self.slice_ms, "STREAMS",
                    self.barrier.wake_key, self.events, wake_id, events_id,
                )  # fmt: skip
            else:
                key = self.barrier.context.keys.barrier_release(BARRIER, gen)
                cmd = pack("BLPOP", key, self.slice_ms // 1000)
            self.socks[i].sendall(cmd)
            self.state[i] = 1
            return
        self.woke[i], self.state[i] = now, 2
        if self.mode == "tcpstore" and reply != b"\x00":
            self.errors.append(f"{self.ids[i]}: WAIT answered {reply!r}")
        if self.mode == "strata" and not self.released(reply):
            self.errors.append(f"{self.ids[i]}: {reply!r}")

    def released(self, reply: Any) -> bool:
        if isinstance(reply[0], str):  # BLPOP: [key, token]
            return bool(reply[1].startswith(f"R {self.gen} "))
        return any(
            dict(zip(fields[::2], fields[1::2], strict=True)).get("g") == str(self.gen)
            for _, entries in reply
            for _, fields in entries
        )


class TcpStoreReader:
    """Fixed-size TCPStore replies, fed like a ``hiredis.Reader``."""

    def __init__(self) -> None:
        self.buffer, self.size = b"", 0

    def expect(self, size: int) -> None:
        self.size = size

    def feed(self, data: bytes) -> None:
        self.buffer += data

    def gets(self) -> bytes | bool:
        if not self.size or len(self.buffer) < self.size:
            return False
        reply, self.buffer = self.buffer[: self.size], self.buffer[self.size :]
        self.size = 0
        return reply


class ThreadHarness:
    """One thread (and one client) per participant."""

    def __init__(self, mode: str, url: str, job_id: str, ids: list[str], n: int, port: int) -> None:
        self.mode, self.ids, self.n = mode, ids, n
        self.lock = threading.Lock()
        # one event per round, so a round's start wakes each thread once (no herd)
        self.starts: dict[int, threading.Event] = {}
        self.gen, self.ready, self.done = 0, 0, 0
        self.all_ready, self.all_done = threading.Event(), threading.Event()
        self.woke = [0.0] * len(ids)
        self.errors: list[str] = []
        self.floor_key = f"bench:{{{job_id}}}:floor"
        # each thread makes its own client: torch's TCPStore client takes ~0.2 s to construct
        self.connected = threading.Semaphore(0)
        for i in range(len(ids)):
            args = (i, url, job_id, port)
            threading.Thread(target=self.run, args=args, daemon=True).start()
        for _ in ids:
            if not self.connected.acquire(timeout=300):
                raise TimeoutError("harness threads did not connect")

    def client(self, url: str, job_id: str, port: int) -> Any:
        if self.mode == "tcpstore-threads":
            from torch.distributed import TCPStore

            timeout = datetime.timedelta(seconds=WAIT_S)
            return TCPStore("127.0.0.1", port, None, False, timeout=timeout)
        if self.mode == "floor-threads":
            client = redis.Redis.from_url(url, decode_responses=True)
            client.ping()
            return client
        job = strata_redis.connect(url, job_id, heartbeat_timeout=HEARTBEAT_TIMEOUT)
        job.client.ping()
        return job.barrier(BARRIER, expected=self.n, timeout=WAIT_S)

    def start(self, r: int) -> threading.Event:
        with self.lock:
            return self.starts.setdefault(r, threading.Event())

    def count(self, what: str) -> None:
        with self.lock:
            value = getattr(self, what) + 1
            setattr(self, what, value)
        if value == len(self.ids):
            (self.all_ready if what == "ready" else self.all_done).set()

    def run(self, i: int, url: str, job_id: str, port: int) -> None:
        client = self.client(url, job_id, port)
        self.connected.release()
        r = 0
        while True:
            self.start(r).wait()
            gen = self.gen
            try:
                if self.mode == "tcpstore-threads":
                    client.add(f"arrive{r}", 1)
                    self.count("ready")
                    client.wait([f"go{r}"])
                elif self.mode == "floor-threads":
                    self.count("ready")
                    client.blpop([f"{self.floor_key}:{r}"], timeout=WAIT_S)
                else:
                    self.count("ready")
                    release = client.wait(self.ids[i])
                    if release.generation != gen:
                        self.errors.append(f"{self.ids[i]}: released {release}")
            except Exception as exc:
                self.errors.append(f"{self.ids[i]}: {exc!r}")
            self.woke[i] = time.perf_counter()
            self.count("done")
            r += 1

    def arm(self, r: int, gen: int) -> None:
        self.ready = self.done = 0
        self.all_ready.clear()
        self.all_done.clear()
        self.gen = gen
        self.start(r).set()
        if not self.all_ready.wait(WAIT_S):
            raise TimeoutError("harness threads did not arrive")

    def collect(self) -> tuple[float, list[str]]:
        if not self.all_done.wait(WAIT_S):
            raise TimeoutError(
                f"{self.mode}: {len(self.ids) - self.done} of {len(self.ids)} threads did not"
                f" wake within {WAIT_S:.0f} s (errors: {self.errors[:3]})"
            )
        errors, self.errors = self.errors, []
        return max(self.woke), errors


def harness_main(pipe: Connection, mode: str, url: str, job_id: str, ids: list[str],
                 n: int, port: int) -> None:  # fmt: skip
    """A harness process: build the participants, then serve arm/report commands."""
    raise_fd_limit()
    harness: LoopHarness | ThreadHarness
    if mode in THREADED:
        harness = ThreadHarness(mode, url, job_id, ids, n, port)
    else:
        harness = LoopHarness(mode, url, job_id, ids, n, port)
    pipe.send("ready")
    while True:
        msg = pipe.recv()
        if msg[0] != "arm":
            return
        harness.arm(msg[1], msg[2])
        pipe.send("armed")
        # read the wake-ups as they come, not when the timing side asks for them
        result = harness.collect()
        if pipe.recv() != ("report",):
            return
        pipe.send(result)


# -- the timed side (pyperf worker process) ---------------------------------------------------


class Scenario:
    """N participants of one mode, set up once per pyperf worker process."""

    def __init__(self, mode: str, n: int, url: str, procs: int) -> None:
        import multiprocessing

        raise_fd_limit()
        self.mode, self.n, self.url, self.r = mode, n, url, 0
        self.job_id = f"bench-barrier-{uuid.uuid4().hex[:8]}"
        self.control = redis.Redis.from_url(url, decode_responses=True)
        ids = [f"p{i:04d}" for i in range(n)]
        # the floor pushes to N blocked clients; a barrier's last arrival is the Nth
        self.waiters = ids if mode.startswith("floor") else ids[:-1]
        self.last = ids[-1]
        port = 0
        if mode.startswith("strata"):
            job = strata_redis.connect(url, self.job_id, heartbeat_timeout=HEARTBEAT_TIMEOUT)
            for worker_id in ids:
                job.register_worker(worker_id, heartbeat_interval=None)
            self.barrier = job.barrier(BARRIER, expected=n, timeout=WAIT_S)
        if mode.startswith("tcpstore"):
            from torch.distributed import TCPStore

            self.store = TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
            port = self.store.port
        ctx = multiprocessing.get_context("spawn")
        procs = max(1, min(procs, len(self.waiters)))
        self.pipes: list[Connection] = []
        self.children = []
        for k in range(procs):
            mine, theirs = ctx.Pipe()
            chunk = self.waiters[k::procs]
            child = ctx.Process(
                target=harness_main, args=(theirs, mode, url, self.job_id, chunk, n, port),
                daemon=True,
            )  # fmt: skip
            child.start()
            self.pipes.append(mine)
            self.children.append(child)
        for pipe in self.pipes:
            if not pipe.poll(300) or pipe.recv() != "ready":
                raise RuntimeError("a harness process did not start")
        atexit.register(self.close)

    def close(self) -> None:
        if not self.pipes:
            return
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(("stop",))
        for child in self.children:
            child.join(5)
        self.pipes = []
        with contextlib.suppress(redis.RedisError):  # the server may be gone already
            for key in self.control.scan_iter(match=f"*{{{self.job_id}}}*", count=1000):
                self.control.delete(key)

    def blocked(self) -> bool:
        if self.mode.startswith("tcpstore"):
            return int(self.store.add(f"arrive{self.r}", 0)) >= len(self.waiters)
        if self.mode == "strata-threads":
            # a process's Barrier.wait threads share one blocked connection (waiters.py):
            # count arrivals, not blocked clients
            return len(self.barrier.state().arrived) >= len(self.waiters)
        return int(self.control.info("clients")["blocked_clients"]) >= len(self.waiters)

    def release_once(self) -> float:
        r = self.r
        gen = self.barrier.generation() if self.mode.startswith("strata") else r
        for pipe in self.pipes:
            pipe.send(("arm", r, gen))
        for pipe in self.pipes:
            if pipe.recv() != "armed":
                raise RuntimeError("a harness process failed to arm")
        deadline = time.monotonic() + WAIT_S
        while not self.blocked():
            if time.monotonic() > deadline:
                raise TimeoutError("participants did not block")
            time.sleep(0.001)
        if self.mode.startswith("floor"):
            # packed before the clock starts: the floor times Redis, not redis-py's packing
            key = f"bench:{{{self.job_id}}}:floor:{r}"
            conn = self.control.connection_pool.get_connection()
            push = conn.pack_command("RPUSH", key, *(["t"] * self.n))
        time.sleep(SETTLE_S)
        start = time.perf_counter()
        if self.mode.startswith("floor"):
            conn.send_packed_command(push)
            conn.read_response()
            self.control.connection_pool.release(conn)
        elif self.mode.startswith("tcpstore"):
            self.store.add(f"arrive{r}", 1)
            self.store.set(f"go{r}", "1")
        else:
            release = self.barrier.wait(self.last)
            if (release.generation, release.participants) != (gen, self.n):
                raise RuntimeError(f"wrong release {release}")
        woke = start
        for pipe in self.pipes:
            pipe.send(("report",))
        for pipe in self.pipes:
            last, errors = pipe.recv()
            if errors:
                raise RuntimeError(f"participants saw errors: {errors[:3]}")
            woke = max(woke, last)
        self.r += 1
        return woke - start


# -- command line -----------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", help="write the results as a pyperf JSON suite")
    parser.add_argument("--redis-url", help="default: a private redis-server")
    parser.add_argument("--participants", help="comma-separated; default 100,1000 (smoke: 10)")
    parser.add_argument("--modes", default=",".join(LABELS), help=f"of {','.join(LABELS)}")
    parser.add_argument("--rounds", type=int, help="timed releases per mode (default 200)")
    parser.add_argument("--warmups", type=int, default=5, help="untimed releases first")
    parser.add_argument("--harness-procs", type=int, default=1, help="processes of participants")
    parser.add_argument(
        "--thread-limit", type=int, default=100,
        help="run the *-threads modes only up to this many participants (1,000 threads: "
        "minutes of setup, mostly torch's client connecting)",
    )  # fmt: skip
    parser.add_argument("--fast", action="store_true", help="100 rounds per mode")
    parser.add_argument("--debug-single-value", action="store_true", help="smoke: 1 round")
    parser.add_argument("--quiet", action="store_true", help="only the summary")
    args = parser.parse_args()
    if args.participants is None:
        args.participants = "10" if args.debug_single_value else "100,1000"
    if args.debug_single_value:
        args.rounds, args.warmups = 1, 0
    elif args.rounds is None:
        args.rounds = 100 if args.fast else 200
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(LABELS)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}")
    if any(m.startswith("tcpstore") for m in modes) and not have_torch():
        print("torch is not installed: TCPStore skipped (pip install torch)", file=sys.stderr)
        modes = [m for m in modes if not m.startswith("tcpstore")]
    args.modes = modes
    return args


def measure(args: argparse.Namespace, url: str) -> dict[str, list[float]]:
    """Every mode's releases, interleaved round by round so that load drifts hit all alike."""
    values: dict[str, list[float]] = {}
    for n in (int(x) for x in args.participants.split(",")):
        modes = [m for m in args.modes if m not in THREADED or n <= args.thread_limit]
        if not args.quiet:
            print(f"setting up {n} participants for {', '.join(modes)} ...", flush=True)
        scenarios: dict[str, Scenario] = {}
        try:
            for mode in modes:
                scenarios[mode] = Scenario(mode, n, url, args.harness_procs)
            for r in range(args.warmups + args.rounds):
                k = r % len(modes)  # rotate the order: no mode always runs first
                for mode in modes[k:] + modes[:k]:
                    latency = scenarios[mode].release_once()
                    if r >= args.warmups:
                        values.setdefault(name_of(mode, n), []).append(latency)
        finally:
            for scenario in scenarios.values():
                scenario.close()
    return values


def suite_of(values: dict[str, list[float]], args: argparse.Namespace) -> pyperf.BenchmarkSuite:
    """A pyperf suite: one benchmark per mode and size, one value per release (loops = 1)."""
    benches = []
    for name, xs in values.items():
        meta = {
            "name": name, "unit": "second", "loops": 1, "harness_procs": args.harness_procs,
            "description": "release latency: last arrival -> last participant woken",
        }  # fmt: skip
        benches.append(pyperf.Benchmark([pyperf.Run(xs, metadata=meta)]))
    return pyperf.BenchmarkSuite(benches)


def main() -> int:
    args = parse_args()
    raise_fd_limit()
    server = None
    if args.redis_url is None:
        server = RedisServer().start()
        args.redis_url = server.url
    try:
        values = measure(args, args.redis_url)
    finally:
        if server is not None:
            server.close()
    suite = suite_of(values, args)
    if args.output:
        suite.dump(args.output, replace=True)
    report(suite)
    return 0


def report(suite: pyperf.BenchmarkSuite) -> None:
    """p50 / p99 per benchmark, then the ratios measured side by side in this run."""
    results = {b.get_name(): b for b in suite.get_benchmarks()}
    print(f"\n{'release latency':<38} {'p50 ms':>8} {'p99 ms':>8} {'releases':>9}")
    for name, b in results.items():
        print(f"{name:<38} {b.percentile(50) * 1e3:8.2f} {b.percentile(99) * 1e3:8.2f} "
              f"{b.get_nvalue():9d}")  # fmt: skip
    for subject, reference in RATIOS:
        if subject in results and reference in results:
            s, r = results[subject], results[reference]
            print(f"{subject} / {reference}: p50 {s.percentile(50) / r.percentile(50):.2f}x, "
                  f"p99 {s.percentile(99) / r.percentile(99):.2f}x")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

"""Redis capacity: Redis' own CPU per coordination call, beside the commands it runs and the
raw commands it replaces, in one run on one private redis-server (issue 27 item 2).

    python perf/capacity.py [--results perf/results] [--rounds 7] [--calls 2000] [--smoke]

Every figure is Redis' CPU time per call from ``INFO commandstats`` (``usec`` per call: the
time Redis spends running the command, so the client, the network and the protocol are out
of it), read as differences around each batch of calls:

- a script: the ``EVALSHA`` time of one operation, sent through the library (a lease
  hand-off is ``acquire_shard`` + ``acquire_shard`` completing it, two calls);
- its inner commands: the very commands the operation's scripts ran, captured once with
  ``MONITOR`` and replayed raw in a ``MULTI``/``EXEC`` (``EXEC``'s time, like ``EVALSHA``'s,
  includes the commands it runs): what the same work costs Redis without Lua;
- the raw commands it replaces, what a job without coordination would send (a heartbeat:
  one ``ZADD``; a lease hand-off: ``SET NX PX`` + ``DEL``; a barrier arrival: ``SADD`` +
  ``SCARD``; a checkpoint ack: ``HSET`` + ``HLEN``), sent pipelined.

The kinds are interleaved round by round (``--rounds``), so load drift on a shared machine
hits them all; each figure is the median over rounds. Derived: the workers one Redis core
serves at the default heartbeat interval (a heartbeat thread sends its workers' heartbeats
and a reaper step each tick: one worker per process, and 8, one per GPU of a host, in one
batched call) and the lease hand-offs one core serves per second. The batched heartbeat's
curve: Redis CPU per worker at 1 to 1,000 workers per call.

Writes ``<results>/capacity.json`` (perf/report.py's ``capacity`` summary).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

import strata_redis
from strata_redis.checkpoint.commit import StepProtocol
from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.coordination import registry
from strata_redis.coordination.heartbeats import heartbeat_workers, heartbeat_workers_call
from strata_redis.coordination.workers import register_worker
from strata_redis.data.leases import ShardLeases
from strata_redis.data.sharding import DatasetParams
from strata_redis.server import RedisServer
from strata_redis.storage import LocalStorage

HERE = Path(__file__).resolve().parent
JOB = "capacity"
DATASET = "capacity-data"
#: a host's GPUs: the workers one process heartbeats in one call in the derived rows
PER_HOST = 8
#: workers per batched call in the curve
BATCH_SIZES = (1, 8, 64, 256, 1000)
#: the default heartbeat interval, seconds (``register_worker``'s default)
INTERVAL_S = float(inspect.signature(register_worker).parameters["heartbeat_interval"].default)
#: a barrier's size in the arrival figure (the last arrival of each generation releases it)
BARRIER_SIZE = 8
#: a checkpoint's world size in the ack figure (ranks 0..WORLD-2 ack: no commit in the figure)
WORLD = 8
_END = "capacity:{monitor}:end"


class Stats:
    """``INFO commandstats`` as (calls, usec) per command, and differences of two reads."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def read(self) -> dict[str, tuple[int, int]]:
        found = self.client.info("commandstats")
        return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
                for k, v in found.items()}  # fmt: skip

    @staticmethod
    def usec(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
             commands: tuple[str, ...]) -> int:  # fmt: skip
        """The usec ``commands`` spent between the two reads."""
        return sum(after.get(c, (0, 0))[1] - before.get(c, (0, 0))[1] for c in commands)


def capture(url: str, op: Callable[[], Any]) -> list[list[bytes]]:
    """The commands Redis' Lua ran for one call of ``op`` (``MONITOR``), as argument lists."""
    mon = redis.Redis.from_url(url)
    lines: list[str] = []
    started = threading.Event()

    def listen() -> None:
        with mon.monitor() as m:
            started.set()
            while True:
                line = m.connection.read_response()
                text = line.decode() if isinstance(line, bytes) else str(line)
                if _END in text:
                    return
                lines.append(text)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    started.wait(10)
    time.sleep(0.2)  # MONITOR is on before the call
    op()
    redis.Redis.from_url(url).get(_END)
    thread.join(10)
    mon.close()
    out = []
    for text in lines:
        head, _, rest = text.partition("] ")
        if head.endswith(" lua"):  # "<time> [<db> lua] "CMD" "arg" ..."
            args = re.findall(r'"((?:[^"\\]|\\.)*)"', rest)
            out.append([ast.literal_eval(f'b"{a}"') for a in args])
    if not out:
        raise RuntimeError("MONITOR saw no command from a script")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000, help="operations per kind per round")
    parser.add_argument("--smoke", action="store_true", help="2 rounds of 50 calls")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.calls = 2, 50
    args.results.mkdir(parents=True, exist_ok=True)
    with RedisServer() as server:
        doc = measure(server.url, args.rounds, args.calls)
    doc["command"] = "python perf/capacity.py" + (" --smoke" if args.smoke else "")
    (args.results / "capacity.json").write_text(json.dumps(doc, indent=2))
    print_table(doc)
    return 0


def measure(url: str, rounds: int, calls: int) -> dict[str, Any]:
    """Every kind's Redis CPU per operation: script, inner commands, raw commands replaced."""
    raw = redis.Redis.from_url(url)
    stats = Stats(raw)
    tmpdir = tempfile.TemporaryDirectory(prefix="strata-capacity-")
    tmp = tmpdir.name
    job = strata_redis.connect(url, JOB, heartbeat_timeout=3600.0)
    ctx = job.context
    most = max(BATCH_SIZES)
    workers = [register_worker(ctx, f"w{i:04d}", heartbeat_interval=None) for i in range(most)]
    one = workers[0]
    # a job with leases, a membership and an epoch: every anchor made, the prelude's full check
    manager = strata_redis.ShardManager(job)  # the job's client: nothing more to close
    manager.register_dataset_params(DATASET, 10**7, 10, False)
    params = DatasetParams(DATASET, 10**7, 10, False, 0)
    leases = ShardLeases(ctx, params, 0, one.worker_id)
    leases.prepare()
    barrier = job.barrier("capacity", expected=BARRIER_SIZE)
    protocols = [StepProtocol(ctx, LocalStorage(tmp), worker_id=workers[r].worker_id, rank=r,
                              world_size=WORLD) for r in range(WORLD)]  # fmt: skip
    state = {"gen": 1, "arrived": 0, "step": 0, "ranks": 0}

    def heartbeat() -> None:
        one.heartbeat()

    def handoff() -> None:
        lease = leases.acquire()
        assert lease is not None, "the pool ran dry: fewer --calls"
        leases.complete(lease, prefetch=False)

    def arrive() -> None:
        i = state["arrived"]
        _, keys, a = barrier.arrive_call(workers[i].worker_id, f"t{time.monotonic_ns()}",
                                         state["gen"], 60.0)  # fmt: skip
        job.scripts.call("arrive_barrier", keys, a)
        state["arrived"] = (i + 1) % BARRIER_SIZE
        state["gen"] += state["arrived"] == 0

    def ack_setup() -> None:
        # a new step, begun by the ranks that ack (not measured: the ack is)
        if state["ranks"] == 0:
            state["step"] += 1
            for proto in protocols[: WORLD - 1]:
                proto.begin(CheckpointId(state["step"]))

    def ack() -> None:
        r = state["ranks"]
        protocols[r].ack(CheckpointId(state["step"]), {}, 0, 0.0)
        state["ranks"] = (r + 1) % (WORLD - 1)

    def batched(n: int) -> Callable[[], None]:
        return lambda: _all_ok(heartbeat_workers(ctx, workers[:n]))

    def tick(n: int) -> Callable[[], None]:
        # what a heartbeat thread sends each interval for n workers of its process (one
        # worker: its own heartbeat script; before batching, every worker sent this)
        calls_ = [heartbeat_workers_call(ctx, workers[:n]), registry.reap_call(ctx)]
        return lambda: ctx.heartbeat_scripts.run_many(calls_)

    kinds: dict[str, tuple[Callable[[], Any], int]] = {  # op, scripts per op
        "heartbeat": (heartbeat, 1),
        "lease_handoff": (handoff, 2),
        "barrier_arrival": (arrive, 1),
        "checkpoint_ack": (ack, 1),
        **{f"batch_{n}": (batched(n), 1) for n in BATCH_SIZES},
        "tick_1": (tick(1), 2),
        f"tick_{PER_HOST}": (tick(PER_HOST), 2),
    }
    # the raw commands each kind replaces (pipelined, as a job without scripts would send)
    lease_key = "capacity:{raw}:lease"
    replaced: dict[str, Callable[[Any, int], None]] = {
        "heartbeat": lambda p, i: p.zadd("capacity:{raw}:beats", {"w": i}),
        "lease_handoff": lambda p, i: (p.set(lease_key, "w", nx=True, px=30_000),
                                       p.delete(lease_key)),
        "barrier_arrival": lambda p, i: (p.sadd("capacity:{raw}:arrived", f"w{i % 8}"),
                                         p.scard("capacity:{raw}:arrived")),
        "checkpoint_ack": lambda p, i: (p.hset("capacity:{raw}:acks", str(i % 8), "{}"),
                                        p.hlen("capacity:{raw}:acks")),
    }  # fmt: skip
    for n in BATCH_SIZES:
        members = {f"w{i}": 0 for i in range(n)}
        replaced[f"batch_{n}"] = lambda p, i, m=members: p.zadd("capacity:{raw}:beats", m)
    #: what runs before an operation, outside its figure
    setup: dict[str, Callable[[], None]] = {"checkpoint_ack": ack_setup}
    nothing: Callable[[], None] = lambda: None  # noqa: E731
    for name, (op, _) in kinds.items():
        setup.get(name, nothing)()
        op()  # warm: scripts loaded
    # each kind's inner commands, as its scripts ran them (then replayed raw)
    inner_ops: dict[str, list[list[list[bytes]]]] = {}
    for name, (op, _) in kinds.items():
        sequences = []
        for _ in range(BARRIER_SIZE if name == "barrier_arrival" else 2):
            setup.get(name, nothing)()
            sequences.append(capture(url, op))
        inner_ops[name] = sequences

    script_us: dict[str, list[float]] = {k: [] for k in kinds}
    inner_us: dict[str, list[float]] = {k: [] for k in kinds}
    raw_us: dict[str, list[float]] = {k: [] for k in replaced}
    for _ in range(rounds):
        for name, (op, _) in kinds.items():
            if name in setup:  # a figure per call, around the call alone
                total = 0
                for _ in range(calls):
                    setup[name]()
                    before = stats.read()
                    op()
                    total += Stats.usec(before, stats.read(), ("evalsha",))
                script_us[name].append(total / calls)
                continue
            before = stats.read()
            for _ in range(calls):
                op()
            script_us[name].append(Stats.usec(before, stats.read(), ("evalsha",)) / calls)
        for name, sequences in inner_ops.items():
            before = stats.read()
            with raw.pipeline(transaction=False) as pipe:
                for i in range(calls):
                    pipe.execute_command("MULTI")
                    for cmd in sequences[i % len(sequences)]:
                        pipe.execute_command(*cmd)
                    pipe.execute_command("EXEC")
                    if len(pipe) > 5000:
                        pipe.execute(raise_on_error=False)
                pipe.execute(raise_on_error=False)
            inner_us[name].append(Stats.usec(before, stats.read(), ("exec",)) / calls)
        for name, send in replaced.items():
            before = stats.read()
            with raw.pipeline(transaction=False) as pipe:
                for i in range(calls):
                    send(pipe, i)
                pipe.execute()
            after = stats.read()
            spent = sum(after[c][1] - before.get(c, (0, 0))[1] for c in after
                        if c not in ("info",))  # fmt: skip
            raw_us[name].append(spent / calls)
    job.close()
    raw.close()
    tmpdir.cleanup()
    med = {k: statistics.median(v) for k, v in script_us.items()}
    inner = {k: statistics.median(v) for k, v in inner_us.items()}
    plain = {k: statistics.median(v) for k, v in raw_us.items()}
    doc: dict[str, Any] = {
        "rounds": rounds,
        "calls": calls,
        "how": "INFO commandstats usec per operation (EVALSHA; EXEC of the same commands "
        "replayed raw; the raw commands replaced), medians over interleaved rounds",
        "interval_s": INTERVAL_S,
        "per_host": PER_HOST,
        "kinds": {
            k: {"script_us": med[k], "inner_us": inner[k], "raw_us": plain.get(k),
                "scripts_per_op": kinds[k][1],
                "inner_commands": sum(map(len, inner_ops[k])) / len(inner_ops[k]),
                "rounds_script_us": script_us[k]}
            for k in kinds
        },
    }  # fmt: skip
    for k in ("heartbeat", "lease_handoff", "barrier_arrival", "checkpoint_ack"):
        doc[f"{k}_us"] = med[k]
        doc[f"{k}_inner_us"] = inner[k]
        doc[f"{k}_raw_us"] = plain[k]
    per_worker = {n: med[f"batch_{n}"] / n for n in BATCH_SIZES}
    doc["batch_curve"] = {"workers_per_call": list(BATCH_SIZES),
                          "us_per_worker": [per_worker[n] for n in BATCH_SIZES],
                          "inner_us_per_worker": [inner[f"batch_{n}"] / n for n in BATCH_SIZES],
                          "raw_zadd_us_per_worker": [plain[f"batch_{n}"] / n
                                                     for n in BATCH_SIZES]}  # fmt: skip
    doc["batched_heartbeat_us_per_worker"] = per_worker[PER_HOST]
    doc["batched_heartbeat_inner_us_per_worker"] = inner[f"batch_{PER_HOST}"] / PER_HOST
    doc["batched_heartbeat_raw_us_per_worker"] = plain[f"batch_{PER_HOST}"] / PER_HOST
    # one core: 10^6 us of Redis CPU per second; a worker costs its tick's share per interval
    doc["tick_1_us"] = med["tick_1"]
    doc[f"tick_{PER_HOST}_us"] = med[f"tick_{PER_HOST}"]
    doc["workers_per_core"] = INTERVAL_S * 1e6 / med["tick_1"]
    doc["workers_per_core_batched"] = INTERVAL_S * 1e6 * PER_HOST / med[f"tick_{PER_HOST}"]
    doc["raw_workers_per_core"] = INTERVAL_S * 1e6 / plain["heartbeat"]

    doc["lease_handoffs_per_core_s"] = 1e6 / med["lease_handoff"]
    doc["raw_lease_handoffs_per_core_s"] = 1e6 / plain["lease_handoff"]
    return doc


def _all_ok(verdicts: list[Any]) -> None:
    if any(v is not None for v in verdicts):
        raise RuntimeError(f"a batched heartbeat was refused: {verdicts}")


def print_table(doc: dict[str, Any]) -> None:
    """The figures, as a person reads them."""
    print(f"Redis CPU per operation, us (INFO commandstats; median of {doc['rounds']} rounds "
          f"x {doc['calls']}):")  # fmt: skip
    print(f"  {'operation':22s} {'script':>8s} {'inner':>8s} {'x inner':>8s} {'raw':>8s}")
    for k, v in doc["kinds"].items():
        raw_us = "-" if v["raw_us"] is None else f"{v['raw_us']:.2f}"
        print(f"  {k:22s} {v['script_us']:8.2f} {v['inner_us']:8.2f} "
              f"{v['script_us'] / v['inner_us']:7.2f}x {raw_us:>8s}")  # fmt: skip
    curve = doc["batch_curve"]
    print("  batched heartbeat, us per worker: " + ", ".join(
        f"{n}: {u:.2f}" for n, u in zip(curve["workers_per_call"], curve["us_per_worker"],
                                        strict=True)))  # fmt: skip
    print(f"  one core serves {doc['workers_per_core']:,.0f} workers at {doc['interval_s']:g} s "
          f"(one per process), {doc['workers_per_core_batched']:,.0f} ({doc['per_host']} per "
          f"process, one call), {doc['raw_workers_per_core']:,.0f} raw ZADDs; "
          f"{doc['lease_handoffs_per_core_s']:,.0f} lease hand-offs/s "
          f"({doc['raw_lease_handoffs_per_core_s']:,.0f} raw SET NX + DEL)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

"""``strata demo``: a simulated training cluster of real worker processes on one Redis."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from types import FrameType

from .job import Job, connect
from .server import RedisServer

CTX = multiprocessing.get_context("spawn")


def say(text: str = "") -> None:
    """Print one line of the demo's story, at once."""
    print(text, flush=True)


def _worker_main(url: str, job_id: str, worker_id: str, interval: float, timeout: float) -> None:
    """A demo worker process: register, train (heartbeat), leave on SIGTERM."""
    job = connect(url, job_id, heartbeat_timeout=timeout)
    worker = job.register_worker(
        worker_id,
        host=os.uname().nodename,
        address=f"127.0.0.1:{29500 + os.getpid() % 1000}",
        gpu_count=8,
        labels={"role": "demo"},
        heartbeat_interval=interval,
    )
    stop = False

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    worker.set_status("training")
    while not stop:
        time.sleep(0.05)
    worker.deregister()


@contextlib.contextmanager
def _redis(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    say("starting a private redis-server on a free loopback port ...")
    with RedisServer() as server:
        say(f"  redis-server {server.binary} listening on {server.url}")
        yield server.url
    say("private redis-server stopped")


def _table(job: Job) -> None:
    say(f"  {'WORKER':<12}{'STATUS':<15}{'LAST SEEN':>10}  HOST")
    for w in job.workers():
        seen = "-" if w.last_seen_s is None else f"{w.last_seen_s:.1f}s ago"
        say(f"  {w.worker_id:<12}{w.status:<15}{seen:>10}  {w.host or '-'}")


def _wait(job: Job, what: str, predicate: object, timeout: float) -> float:
    """Poll (reaping as a waiting caller may) until ``predicate()`` holds; return the seconds."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        job.reap()
        if predicate():  # type: ignore[operator]
            return time.monotonic() - start
        time.sleep(0.02)
    raise TimeoutError(f"demo: {what} did not happen within {timeout}s")


def run_demo(
    redis_url: str | None = None,
    *,
    workers: int = 4,
    job_id: str = "demo",
    heartbeat_interval: float = 0.5,
    heartbeat_timeout: float = 2.0,
) -> int:
    """Run the demo; return the process exit code (0 when every check held)."""
    with _redis(redis_url) as url:
        job = connect(url, job_id, heartbeat_timeout=heartbeat_timeout)
        ids = [f"worker-{i:02d}" for i in range(1, workers + 1)]
        say(f"\n== 1. {workers} worker processes register and heartbeat (job {job_id!r})")
        procs: dict[str, BaseProcess] = {}
        for wid in ids:
            proc: BaseProcess = CTX.Process(
                target=_worker_main, args=(url, job_id, wid, heartbeat_interval, heartbeat_timeout)
            )
            proc.start()
            procs[wid] = proc
        try:
            _wait(job, "registration", lambda: len(job.live_workers()) == workers, 60)
            _wait(
                job,
                "training status",
                lambda: all(w.status == "training" for w in job.workers() if w.worker_id in ids),
                30,
            )
            _table(job)
            say(f"  membership generation: {job.membership_generation()}")

            victim = ids[-1]
            say(f"\n== 2. kill -9 {victim} (pid {procs[victim].pid}): no goodbye, heartbeats stop")
            gen_before = job.membership_generation()
            os.kill(procs[victim].pid or 0, signal.SIGKILL)
            procs[victim].join(10)
            detected = _wait(
                job,
                "failure detection",
                lambda: {w.worker_id: w.status for w in job.workers()}[victim] == "failed",
                heartbeat_timeout * 3,
            )
            say(
                f"  {victim} declared failed after {detected:.2f}s "
                f"(heartbeat timeout {heartbeat_timeout}s, bar: timeout + 1s)"
            )
            _table(job)
            say(f"  membership generation: {gen_before} -> {job.membership_generation()}")
            ok = detected <= heartbeat_timeout + 1.0
        finally:
            for proc in procs.values():
                if proc.is_alive():
                    proc.terminate()
            for proc in procs.values():
                proc.join(10)
        say("\n== summary")
        statuses = {w.worker_id: w.status for w in job.workers()}
        say(f"  workers: {', '.join(f'{k}={v}' for k, v in sorted(statuses.items()))}")
        say(f"  failure of {victim} detected in {detected:.2f}s: {'OK' if ok else 'TOO SLOW'}")
        say(
            f"  membership events: {len(job.events(1000))}, "
            f"final generation {job.membership_generation()}"
        )
        job.close()
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_demo())

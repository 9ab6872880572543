"""``strata events``: a job's membership, rendezvous and checkpoint events in time order, and
``--follow`` printing new ones as they happen, as a real subprocess against a real Redis."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

import strata_redis
from strata_redis.cli.feed import Feed
from strata_redis.server import RedisServer

from .procs import Output, wait_for
from .test_dashboard_cli import interrupt, output, popen, strata


def _train(url: str, job_id: str, path: Path) -> None:
    """A short README loop: it joins (a round opens and closes), saves one checkpoint,
    and leaves."""
    with strata_redis.TrainingOrchestrator(
        coordinator_url=url, job_id=job_id, worker_id="w1", checkpoint_path=str(path),
        last_call=0.2,
    ) as orch:  # fmt: skip
        orch.save_checkpoint(state={"x": b"1"}, step=5, epoch=0)
        orch.wait_for_checkpoints(30)


def _printed(out: Output) -> list[dict[str, Any]]:
    """The events ``strata events --json`` printed so far (its whole lines)."""
    return [orjson.loads(line) for line in out.text().split("\n")[:-1]]


def test_events_follow_prints_what_happens_in_time_order(
    redis_factory: Callable[..., RedisServer], tmp_path: Path
) -> None:
    server = redis_factory()
    job = strata_redis.connect(server.url, "feed")
    job.register_worker("early", heartbeat_interval=None).deregister()  # before --follow
    proc = popen("events", "--redis-url", server.url, "--job", "feed", "--follow", "--json",
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    out = output(proc)
    try:  # each step once the follower has printed the last, however long a loaded machine takes
        wait_for(lambda: len(_printed(out)) >= 2, 30, why=out.text)  # what happened before
        _train(server.url, "feed", tmp_path)
        # all it did is in Redis now: the follower has caught up once it printed the newest
        (newest,) = Feed(job.client, "feed").newest(1)
        last = (newest.kind, newest.id)
        wait_for(lambda: last in [(e["kind"], e["id"]) for e in _printed(out)], 30, why=out.text)
    finally:  # the follower stops whatever happened above
        stdout, stderr = interrupt(proc, out)
    assert proc.returncode == 0, stderr
    events = [orjson.loads(line) for line in stdout.splitlines()]
    said = [(e["kind"], e.get("type") or e.get("outcome"), e.get("worker_id")) for e in events]
    # the newest events first (what happened before), then each new one once, in order
    assert said[:2] == [("membership", "join", "early"), ("membership", "leave", "early")]
    rest = said[2:]
    assert ("membership", "join", "w1") in rest and ("checkpoint", "uploaded", "w1") in rest
    assert ("rendezvous", "open", None) in rest and ("rendezvous", "close", None) in rest
    assert rest.index(("membership", "join", "w1")) < rest.index(("rendezvous", "close", None))
    assert rest.index(("rendezvous", "close", None)) < rest.index(("checkpoint", "uploaded", "w1"))
    assert rest[-1] == ("membership", "leave", "w1"), rest
    assert len({e["id"] + e["kind"] for e in events}) == len(events)  # nothing twice
    assert [e["ms"] for e in events] == sorted(e["ms"] for e in events)
    job.close()


def test_events_text_and_count(redis_factory: Callable[..., RedisServer]) -> None:
    server = redis_factory()
    job = strata_redis.connect(server.url, "feed")
    for n in range(5):
        job.register_worker(f"w{n}", heartbeat_interval=None)
    out = strata("events", "--redis-url", server.url, "--job", "feed", "--count", "3")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and [line.split()[1:4] for line in lines] == [
        ["membership", "join", f"w{n}"] for n in (2, 3, 4)
    ], lines
    missing = strata("events", "--redis-url", server.url)
    assert missing.returncode == 2 and "--job" in missing.stderr
    job.close()

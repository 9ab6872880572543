"""Who holds the job's state, with real worker processes and SIGKILL: a worker that joined a
running job, whose every fellow member holding the model is SIGKILLed before their round
passed an epoch barrier, is not left to go on as if it held the model. Its next round is
fresh — the new worker in it resumes from the newest checkpoint — and the joiner stops with
``RoundRestartedError`` (relaunched, it would resume too)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import strata_redis

from .procs import kill9, spawn, wait_for

JOB = "carriers"
DATASET = "ds"


def _worker(url: str, worker_id: str, ckpt: str, out: str) -> None:
    """The README loop in one process (a save every 10 steps), its rounds, resume, batches
    and the error it stopped on written to ``out/<worker>.jsonl``."""
    with open(Path(out, f"{worker_id}.jsonl"), "a") as events:

        def add(ev: str, **fields: Any) -> None:
            events.write(json.dumps({"ev": ev, "t": time.time(), **fields}) + "\n")
            events.flush()

        try:
            with strata_redis.TrainingOrchestrator(
                coordinator_url=url, worker_id=worker_id, job_id=JOB, checkpoint_path=ckpt,
                min_workers=2, max_workers=2, last_call=0.5, heartbeat_timeout=2.0,
                batch_size=4, commit_timeout=30.0, epoch_timeout=60.0,
                state_provider=lambda: b"model",
                on_round=lambda r: add("round", round=r.number, fresh=r.fresh),
            ) as orch:  # fmt: skip
                if orch.resumed is not None:
                    add("resumed", label=orch.resumed.label)
                for step, _ in enumerate(orch.get_shards(DATASET)):
                    time.sleep(0.01)  # training
                    add("batch", round=orch.round.number)
                    if step % 10 == 0:
                        orch.save_checkpoint(step=step, epoch=0)
        except strata_redis.StrataError as exc:
            add("stopped", error=type(exc).__name__, message=str(exc))


def _events(out: Path, worker: str) -> list[dict[str, Any]]:
    path = out / f"{worker}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _rounds(out: Path, worker: str) -> list[tuple[int, bool]]:
    return [(e["round"], e["fresh"]) for e in _events(out, worker) if e["ev"] == "round"]


def test_a_joiner_whose_state_holders_were_killed_restarts_from_the_checkpoint(
    redis_url: str, tmp_path: Path
) -> None:
    strata_redis.ShardManager(redis_url, job_id=JOB).register_dataset_params(
        DATASET, 40_000, 100, True, 7
    )  # (an epoch far longer than the test: no epoch barrier is passed)
    ckpt, out = str(tmp_path / "ckpt"), tmp_path / "out"
    out.mkdir()
    a, b = (spawn(_worker, redis_url, w, ckpt, str(out)) for w in ("a", "b"))
    procs = [a, b]
    manager = strata_redis.CheckpointManager(ckpt, job_id=JOB, redis=redis_url)
    # (each wait below takes a few seconds here: a start, or a heartbeat timeout of 2 s and a
    # rendezvous; 60 s separates "slow on a loaded CI machine" from "never": the failure on
    # the Lua before this rule is that "c" never stops and "d" never resumes)
    try:
        wait_for(lambda: manager.latest() is not None, 60, why=lambda: _events(out, "a")[-3:])
        # round 2: "a" (it holds the model) and "c", new
        kill9(b)
        procs.append(c := spawn(_worker, redis_url, "c", ckpt, str(out)))
        wait_for(lambda: any(e["ev"] == "batch" for e in _events(out, "c")), 60,
                 why=lambda: _events(out, "c")[-3:])  # fmt: skip
        assert _rounds(out, "c") == [(2, False)]  # a continuation: "a" holds the model
        assert _rounds(out, "a") == [(1, True), (2, False)]
        # "a" SIGKILLed before round 2 passed an epoch barrier: "c" may never have got the
        # model; round 3 ("c" and "d", new) is fresh, not a continuation of it
        kill9(a)
        procs.append(spawn(_worker, redis_url, "d", ckpt, str(out)))
        wait_for(lambda: any(e["ev"] == "stopped" for e in _events(out, "c")), 60,
                 why=lambda: (_events(out, "c")[-3:], _events(out, "d")[-3:]))  # fmt: skip
        (stopped,) = [e for e in _events(out, "c") if e["ev"] == "stopped"]
        assert stopped["error"] == "RoundRestartedError", stopped
        assert "round 3 restarts the job from its newest checkpoint" in stopped["message"]
        assert _rounds(out, "c") == [(2, False)]  # (it trained in no fresh round)
        wait_for(lambda: any(e["ev"] == "resumed" for e in _events(out, "d")), 30,
                 why=lambda: _events(out, "d")[-3:])  # fmt: skip
        assert _rounds(out, "d")[0] == (3, True)
        c.join(30)
        assert c.exitcode == 0  # (the loop ended on the error, and closed its orchestrator)
    finally:
        manager.close()
        for proc in procs:
            if proc.is_alive():
                kill9(proc)

"""Preemption (``strata_redis.preemption``): SIGTERM mid-epoch stops the orchestrator loop at a
step its round agrees on, commits a checkpoint within the budget, releases the leases at the
data position and exits 0; past the budget it leaves all the same and exits 75. Real worker
processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from strata_redis import errors
from strata_redis.checkpoint.manager import CheckpointManager
from strata_redis.preemption import EXIT_BUDGET_EXCEEDED, parse_signals

from .procs import join_all, spawn, wait_for

DATASET = "preempt-data"
TOTAL = 480  # 24 shards of 20, batches of 4


def _worker(
    url: str, job: str, worker_id: str, ckpt: str, logdir: str, cfg: dict[str, Any]
) -> None:
    """One loop: ``<worker>-<launch>.log`` gets a line per trained step (step, samples);
    ``cfg["collective"]`` makes every step meet the others (a barrier, as DDP's all_reduce)."""
    import logging

    import strata_redis

    logging.basicConfig(
        filename=os.path.join(logdir, f"log-{worker_id}-{cfg['launch']}"), level=logging.INFO,
        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s",
    )  # fmt: skip
    out = open(os.path.join(logdir, f"{worker_id}-{cfg['launch']}.log"), "a")  # noqa: SIM115
    job_handle = strata_redis.connect(url, job_id=job)
    orch = strata_redis.TrainingOrchestrator(
        coordinator_url=url, worker_id=worker_id, job_id=job, checkpoint_path=ckpt,
        min_workers=cfg["min_workers"], last_call=2.0, batch_size=4,
        heartbeat_timeout=cfg.get("heartbeat", 3.0), state_provider=lambda: b"model",
        preempt_budget=cfg["budget"],
    )  # fmt: skip
    try:
        stream = orch.get_shards(DATASET)
        for epoch in orch.epochs(1):
            for step, batch in enumerate(stream):
                if cfg.get("fail") == worker_id and step == 3:  # as a trainer's exception
                    orch.close(end=False)  # (leaving its ``with`` block)
                    raise SystemExit(1)
                if cfg["collective"]:
                    name = f"step-r{orch.round.number}-e{epoch}-s{step}"
                    job_handle.barrier(name, expected=orch.world_size).wait(worker_id, timeout=60)
                time.sleep(cfg["sleep"])
                out.write(f"{step} {' '.join(map(str, batch.tolist()))}\n")
                out.flush()
        out.write("done\n")
        out.flush()
        orch.close()
    finally:
        out.close()


def _start(url: str, job: str, tmp: Path, launch: int, workers: int, **cfg: Any) -> list[Any]:
    cfg = {"launch": launch, "min_workers": workers, "budget": 25.0, "collective": True,
           "sleep": 0.03, **cfg}  # fmt: skip
    return [spawn(_worker, url, job, f"w{i}", str(tmp / "ckpt"), str(tmp), cfg)
            for i in range(workers)]  # fmt: skip


def _steps(tmp: Path, launch: int) -> dict[str, list[tuple[int, list[int]]]]:
    """worker -> [(step, samples)] it trained in ``launch``."""
    out = {}
    for path in tmp.glob(f"*-{launch}.log"):
        lines = [line.split() for line in path.read_text().splitlines() if line != "done"]
        out[path.name.split("-")[0]] = [(int(s), [int(x) for x in rest]) for s, *rest in lines]
    return out


def _register(url: str, job: str) -> None:
    import strata_redis

    manager = strata_redis.ShardManager(url, job_id=job)
    manager.register_dataset_params(DATASET, TOTAL, 20, True, 3)
    manager.context.close()


def _committed(url: str, tmp: Path, job: str) -> list[Any]:
    manager = CheckpointManager(path=str(tmp / "ckpt"), job_id=job, redis=url)
    try:
        return list(manager.list())
    finally:
        manager.close()


@pytest.mark.timeout(120)
def test_sigterm_mid_epoch_saves_the_agreed_step_and_relaunch_trains_each_sample_once(
    redis_url: str, job_id: str, tmp_path: Path
) -> None:
    _register(redis_url, job_id)
    procs = _start(redis_url, job_id, tmp_path, launch=1, workers=2)
    wait_for(lambda: sum(map(len, _steps(tmp_path, 1).values())) >= 20, 60)
    for proc in procs:  # as torchrun's agent forwards its SIGTERM to every rank
        os.kill(proc.pid, signal.SIGTERM)
    signalled = time.monotonic()
    assert join_all(procs, timeout=60) == [0, 0]
    took = time.monotonic() - signalled
    assert took < 25.0  # within the default budget (a hang would run to the 60 s join)
    print(f"preempted: both loops exited 0 {took:.2f}s after SIGTERM")
    (saved,) = [c for c in _committed(redis_url, tmp_path, job_id) if c.epoch == 0]
    first = _steps(tmp_path, 1)
    # every rank stopped at the agreed step and saved it: no step trained after the saved one
    assert {w: max(s for s, _ in steps) for w, steps in first.items()} == {
        "w0": saved.step,
        "w1": saved.step,
    }

    relaunch = _start(redis_url, job_id, tmp_path, launch=2, workers=2)
    assert join_all(relaunch, timeout=90) == [0, 0]
    trained: Counter[int] = Counter()
    for launch in (1, 2):
        for steps in _steps(tmp_path, launch).values():
            for _, samples in steps:
                trained.update(samples)
    assert trained == Counter(range(TOTAL))  # none lost, none twice


@pytest.mark.timeout(120)
def test_budget_exceeded_aborts_the_save_releases_the_leases_and_exits_75(
    redis_url: str, job_id: str, tmp_path: Path
) -> None:
    # Only w0 is signalled, and the loops do not meet every step: w1 never saves the agreed
    # step, so w0's checkpoint cannot commit within its 2 s budget.
    _register(redis_url, job_id)
    procs = _start(redis_url, job_id, tmp_path, launch=1, workers=2, min_workers=1,
                   budget=2.0, collective=False)  # fmt: skip
    wait_for(lambda: len(_steps(tmp_path, 1).get("w0", [])) >= 10, 60)
    os.kill(procs[0].pid, signal.SIGTERM)
    signalled = time.monotonic()
    procs[0].join(30)
    took = time.monotonic() - signalled
    assert procs[0].exitcode == EXIT_BUDGET_EXCEEDED
    # the budget, then leaving: well under the commit_timeout (300 s) it would wait without one
    assert took < 2.0 + 10.0
    print(f"budget exceeded: exit 75 {took:.2f}s after SIGTERM (budget 2 s)")
    assert join_all(procs[1:], timeout=90) == [0]  # w1 finished the epoch alone
    # all or nothing: the aborted save never commits
    assert not _committed(redis_url, tmp_path, job_id)
    # w0's leases went back at its data position: what it trained is not trained again,
    # and what it did not train, w1 did
    trained: Counter[int] = Counter()
    for steps in _steps(tmp_path, 1).values():
        for _, samples in steps:
            trained.update(samples)
    assert trained == Counter(range(TOTAL))


@pytest.mark.timeout(150)
def test_a_survivor_signalled_while_its_broken_round_regroups_leaves_and_the_restart_trains_all(
    redis_url: str, job_id: str, tmp_path: Path
) -> None:
    """torchrun's teardown of a failed group: w1 fails, its agent SIGTERMs w0 (which is
    rejoining, its round broken) and SIGKILLs it past the grace, then starts both again.
    w0 must leave at the signal (75: nothing saved), not wait in the next round: killed
    there, it would stay a member of it for its heartbeat timeout, and the restarted pair
    would close that round as the old one's continuation, with the old round's shards done
    and in no model (before the fix, 60 of 240 samples of torchrun's restart untrained)."""
    import strata_redis
    from strata_redis.coordination.rendezvous import Rendezvous

    _register(redis_url, job_id)
    # (a heartbeat timeout long enough for the restart to meet a killed w0's membership)
    procs = _start(redis_url, job_id, tmp_path, launch=1, workers=2, collective=False,
                   fail="w1", sleep=0.05, heartbeat=20.0)  # fmt: skip
    assert join_all(procs[1:], timeout=60) == [1]
    job = strata_redis.connect(redis_url, job_id)
    rendezvous = Rendezvous(job.context)
    # w0 saw its round break and waits in the next one for a second member
    wait_for(lambda: "w0" in rendezvous.members(2), 30, why=rendezvous.state)
    os.kill(procs[0].pid, signal.SIGTERM)
    signalled = time.monotonic()
    procs[0].join(5.0)  # torchrun waits 30 s, then SIGKILLs: 5 s here
    if procs[0].is_alive():
        os.kill(procs[0].pid, signal.SIGKILL)
    procs[0].join(10)
    took = time.monotonic() - signalled
    assert procs[0].exitcode == EXIT_BUDGET_EXCEEDED, procs[0].exitcode
    print(f"the survivor left {took:.2f}s after SIGTERM, exit 75")
    before = sum(len(steps) for steps in _steps(tmp_path, 1).values())
    assert before > 3  # both trained in launch 1 (w1 its 3 steps)

    # the restart: w1 first, as a slower rank 0 would let it (before the fix it closed round
    # 2 with the killed w0, alive to Redis for its heartbeat timeout, as the old round's
    # continuation)
    cfg = {"launch": 2, "min_workers": 2, "budget": 25.0, "collective": False, "sleep": 0.03}
    w1 = spawn(_worker, redis_url, job_id, "w1", str(tmp_path / "ckpt"), str(tmp_path), cfg)
    wait_for(lambda: "w1" in rendezvous.members(2) or not w1.is_alive(), 30)
    time.sleep(2.0 + 1.0)  # the last call (2 s): round 2 would close now with a killed w0
    job.close()
    w0 = spawn(_worker, redis_url, job_id, "w0", str(tmp_path / "ckpt"), str(tmp_path), cfg)
    assert join_all([w0, w1], timeout=90) == [0, 0]
    assert not _committed(redis_url, tmp_path, job_id)  # nothing saved: from the start
    again: Counter[int] = Counter()
    for steps in _steps(tmp_path, 2).values():
        for _, samples in steps:
            again.update(samples)
    assert again == Counter(range(TOTAL))  # each sample once, the first launch's too


def test_parse_signals() -> None:
    assert parse_signals("SIGTERM, usr1,2") == (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
    assert parse_signals("") == ()
    assert parse_signals([signal.SIGTERM, "TERM"]) == (signal.SIGTERM,)
    with pytest.raises(ValueError, match="SIGKILL cannot be caught"):
        parse_signals("KILL")
    with pytest.raises(ValueError, match="'NOPE' is not a signal"):
        parse_signals("NOPE")


def test_preempted_is_a_system_exit_with_its_story() -> None:
    exc = errors.Preempted(
        75, job_id="j", worker_id="w0", signal="SIGTERM", checkpoint="epoch_0_step_9",
        committed=False, seconds=2.5,
    )  # fmt: skip
    assert isinstance(exc, SystemExit) and not isinstance(exc, Exception)
    assert exc.code == 75
    assert "did not commit within the budget" in str(exc)
    assert json.dumps(exc.code) == "75"


def test_the_round_stops_at_the_first_proposal(redis_url: str, job_id: str, tmp_path: Path) -> None:
    # two members of one round: the first preempted proposes the step after its own; the
    # other, a step behind or already there, stops at that same step
    import threading

    import strata_redis

    made: dict[str, Any] = {}

    def make(worker: str) -> None:
        made[worker] = strata_redis.TrainingOrchestrator(
            redis_url, worker, job_id=job_id, min_workers=2, last_call=0.5,
            checkpoint_path=tmp_path, preempt_signals="",
        )  # fmt: skip

    threads = [threading.Thread(target=make, args=(w,)) for w in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    a, b = made["a"], made["b"]
    try:
        assert not a.preempted and not a.should_stop(5)  # no preemption: a flag read
        a.request_preemption()
        b.request_preemption()
        assert a.preempted
        assert not a.should_stop(5)  # proposes 6: the others may be in step 6 already
        assert b.should_stop(6)  # b had finished step 6: it stops there
        assert a.should_stop(6)
    finally:
        a.close(end=False)
        b.close(end=False)


def test_the_handler_flags_then_passes_a_second_signal_on_and_is_put_back(
    redis_url: str, job_id: str, tmp_path: Path
) -> None:
    import strata_redis

    seen: list[int] = []

    def previous(signum: int, frame: object) -> None:
        seen.append(signum)

    before = signal.signal(signal.SIGUSR1, previous)
    try:
        orch = strata_redis.TrainingOrchestrator(
            redis_url, "w0", job_id=job_id, checkpoint_path=tmp_path, preempt_signals="USR1"
        )
        try:
            assert not orch.preempted
            os.kill(os.getpid(), signal.SIGUSR1)
            wait_for(lambda: orch.preempted, 5)  # the handler runs on the main thread
            assert seen == []  # the first signal only sets the flag
            os.kill(os.getpid(), signal.SIGUSR1)
            wait_for(lambda: seen == [signal.SIGUSR1], 5)  # the second goes to the previous
        finally:
            orch.close(end=False)
        assert signal.getsignal(signal.SIGUSR1) is previous  # put back
        again = strata_redis.TrainingOrchestrator(
            redis_url, "w0", job_id=job_id, checkpoint_path=tmp_path, preempt_signals="USR1"
        )
        try:
            assert not again.preempted  # the closed loop's preemption is not the new one's
        finally:
            again.close(end=False)
        os.kill(os.getpid(), signal.SIGUSR1)  # every loop closed: the previous handler's
        wait_for(lambda: len(seen) == 2, 5)
    finally:
        signal.signal(signal.SIGUSR1, before)


def _single(redis_url: str, job_id: str, tmp_path: Path, **kwargs: Any) -> Any:
    import strata_redis

    _register(redis_url, job_id)
    return strata_redis.TrainingOrchestrator(
        redis_url, "solo", job_id=job_id, checkpoint_path=tmp_path, last_call=0.1,
        batch_size=4, preempt_signals="", **kwargs,
    )  # fmt: skip


def test_preempt_exit_after_the_loop_saved_that_step_itself(
    redis_url: str, job_id: str, tmp_path: Path
) -> None:
    orch = _single(redis_url, job_id, tmp_path)
    stream = orch.get_shards(DATASET)
    orch.request_preemption()
    with pytest.raises(errors.Preempted) as caught:
        for step, _ in enumerate(stream):
            if step == 1:  # the loop's own save, at the step the round stops at
                orch.save_checkpoint(step, 0, b"model").result(10)
            if orch.should_stop(step):
                assert step == 1  # the call at step 0 proposed 1
                orch.preempt_exit(step, 0)  # (the step is saved: nothing more to save)
    assert caught.value.code == 0 and caught.value.committed
    assert caught.value.checkpoint == "epoch_0_step_1"
    assert orch._closed


def test_preempt_exit_past_the_budget_exits_75(redis_url: str, job_id: str, tmp_path: Path) -> None:
    from concurrent.futures import Future

    orch = _single(redis_url, job_id, tmp_path, preempt_budget=0.5)
    orch.request_preemption()
    never: Future[Any] = Future()  # a framework's save that does not commit in time
    started = time.monotonic()
    with pytest.raises(errors.Preempted) as caught:
        orch.preempt_exit(0, 0, save=lambda: never)
    assert caught.value.code == EXIT_BUDGET_EXCEEDED and not caught.value.committed
    # the budget, not the commit_timeout (300 s) a save waits for otherwise
    assert time.monotonic() - started < 0.5 + 5.0
    assert orch._closed


def test_a_loop_that_numbers_its_own_steps_is_not_stopped_by_the_walks_count(
    redis_url: str, job_id: str, tmp_path: Path
) -> None:
    # a framework's loop numbers steps its own way (Lightning's global step: 100 here, as
    # after a resume) and calls should_stop itself; preempted after its check, the next
    # batch's fetch comes first: the walk's own check must not propose its count (4), which
    # would stop the loop's ranks at whichever step each reaches next, not at one agreed step
    orch = _single(redis_url, job_id, tmp_path)
    stream = orch.get_shards(DATASET)
    with pytest.raises(errors.Preempted) as caught:
        for i, _ in enumerate(stream):
            step = 100 + i
            if orch.should_stop(step):
                orch.preempt_exit(step, 0, b"model")
            if i == 3:
                orch.request_preemption()  # between the loop's check and the next fetch
    assert caught.value.code == 0
    assert caught.value.checkpoint == "epoch_0_step_105"  # the loop proposed 104 + 1

"""A rank SIGKILLed mid-epoch and relaunched under its old worker id (the supervisor pattern:
same host and ``RANK``, so the same derived id, taking it back with ``replace``) rejoins
cleanly: the others re-rendezvous with it, its checkpoint steps line up with theirs, its next
save commits within one save interval (plus the rendezvous), and no sample is trained twice —
in real worker processes against a real redis-server."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import strata_redis
from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.checkpoint.rounds import RoundCheckpoints
from strata_redis.context import JobContext
from strata_redis.data.sharding import DatasetParams
from strata_redis.errors import CheckpointAbortedError

from .procs import join_all, kill9, spawn, wait_for

JOB = "rejoin"
DATASET = "imagenet_total"
#: the loop saves every this many steps (the README's ``step % 100``)
EVERY = 100


def _loop(url: str, rank: int, ckpt: str, logdir: str, cfg: dict[str, Any]) -> None:
    """One rank: the README loop with no worker id (derived from the host and ``RANK``), plus
    a line per batch, and a record of every save's fate."""
    os.environ["RANK"] = str(rank)
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(cfg["restarts"])  # replace: a restart
    run = f"{cfg['restarts']}-{rank}"
    log = open(os.path.join(logdir, f"{run}.log"), "a")  # noqa: SIM115
    saves: list[dict[str, Any]] = []
    trained: list[int] = []
    try:
        orchestrator = strata_redis.TrainingOrchestrator(
            coordinator_url=url, job_id=JOB, checkpoint_path=ckpt, min_workers=3,
            last_call=1.0, heartbeat_timeout=3.0, batch_size=4, rendezvous_timeout=30.0,
            state_provider=lambda: np.asarray(trained, dtype=np.int64).tobytes(),
            commit_timeout=cfg["commit_timeout"], epoch_timeout=30.0,
        )  # fmt: skip
        joined = time.time()
        Path(logdir, f"joined-{run}").write_text(json.dumps(
            {"t": joined, "worker": orchestrator.worker_id, "round": orchestrator.round.number}
        ))  # fmt: skip

        def record(entry: dict[str, Any], future: Any) -> None:
            exc = future.exception()
            entry["t_done"] = time.time()
            entry["outcome"] = "committed" if exc is None else f"{type(exc).__name__}: {exc}"
            if exc is None:
                entry["label"] = future.result().label

        with orchestrator:
            shard_info = orchestrator.get_shards(DATASET)
            for epoch in range(orchestrator.epoch, 2):
                trained.clear()
                for step, batch in enumerate(shard_info):
                    time.sleep(cfg["sleep"])
                    trained.extend(batch.tolist())
                    log.write(f"{epoch} {' '.join(map(str, batch.tolist()))}\n")
                    log.flush()
                    if step % EVERY == 0:
                        future = orchestrator.save_checkpoint(step=step, epoch=epoch)
                        entry: dict[str, Any] = {"epoch": epoch, "step": step, "t": time.time()}
                        saves.append(entry)
                        if future is not None:
                            future.add_done_callback(lambda f, e=entry: record(e, f))
                        else:
                            entry["outcome"] = "skipped"
                orchestrator.advance_epoch()
            orchestrator.wait_for_checkpoints(cfg["commit_timeout"] + 30)
    except Exception as exc:
        Path(logdir, f"error-{run}").write_text(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        Path(logdir, f"saves-{run}.json").write_text(json.dumps(saves))
        log.close()


def _samples(paths: list[Path]) -> dict[int, Counter[int]]:
    """epoch -> how many times each sample was trained, from these logs."""
    out: dict[int, Counter[int]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            epoch, *samples = line.split()
            out.setdefault(int(epoch), Counter()).update(int(s) for s in samples)
    return out


def _shard_samples(params: DatasetParams, epoch: int, shard: int) -> set[int]:
    return set(params.shard(shard, epoch).indices().tolist())


def test_a_rank_relaunched_mid_epoch_under_its_id_commits_its_next_save(
    redis_url: str, tmp_path: Path
) -> None:
    params = strata_redis.ShardManager(redis_url, job_id=JOB).register_dataset_params(
        DATASET, 6000, 100, True, 7
    )
    logs, ckpt_dir = tmp_path / "logs", tmp_path / "ckpt"
    logs.mkdir()
    sleep = 0.01
    cfg = {"restarts": 0, "sleep": sleep, "commit_timeout": 30.0}
    procs = [spawn(_loop, redis_url, r, str(ckpt_dir), str(logs), cfg) for r in range(3)]
    ckpt = strata_redis.CheckpointManager(ckpt_dir, job_id=JOB, redis=redis_url)
    # mid-epoch: after (0, 100) committed, well before the epoch's end (~500 steps a rank)
    wait_for(
        lambda: any(i.id == CheckpointId(EVERY, 0) for i in ckpt.list()), 90,
        why=lambda: [i.label for i in ckpt.list()],
    )  # fmt: skip
    kill9(procs[1])
    killed_at = time.time()
    reader = strata_redis.connect(redis_url, JOB)
    done_at_kill = reader.leases(DATASET, 0, "reader").completions()  # through the owner
    reader.close()
    assert len(done_at_kill) < params.num_shards - 10, "the kill came too late in the epoch"
    victim = json.loads((logs / "joined-0-1").read_text())["worker"]
    relaunched = spawn(_loop, redis_url, 1, str(ckpt_dir), str(logs), {**cfg, "restarts": 1})
    assert join_all([procs[0], procs[2], relaunched], timeout=90) == [0, 0, 0], [
        p.read_text() for p in logs.glob("error-*")
    ]

    rejoined = json.loads((logs / "joined-1-1").read_text())
    assert rejoined["worker"] == victim  # the same id, taken back
    assert rejoined["round"] >= 2  # a new round with the others
    # its next save commits: the first it saved after the relaunch, within one save
    # interval (EVERY steps) plus the rendezvous, measured from its join
    saves = json.loads((logs / "saves-1-1.json").read_text())
    made = [s for s in saves if s["outcome"] != "skipped"]
    assert made, saves
    first = made[0]
    assert first["outcome"] == "committed", saves
    took = first["t_done"] - rejoined["t"]
    assert took <= EVERY * sleep * 4 + 5.0, (took, saves)
    # it took the round's step: its checkpoint is the others' (their loops' own step)
    lined_up = CheckpointId.from_label(first["label"])
    assert lined_up is not None and lined_up.epoch == 0 and lined_up.step > first["step"]
    assert all(s["outcome"] == "committed" for s in made), saves
    print(
        f"relaunched rank: next save {lined_up} (its loop's step {first['step']}) committed "
        f"{took:.2f} s after it rejoined round {rejoined['round']} "
        f"({rejoined['t'] - killed_at:.2f} s after the kill, its start included)"
    )
    # the others: none of their saves waited out commit_timeout (those open at the kill
    # were aborted at once), and from that checkpoint on every one committed
    for run in ("0-0", "0-2"):
        outcomes = [s for s in json.loads((logs / f"saves-{run}.json").read_text())
                    if s["outcome"] != "skipped"]  # fmt: skip
        assert all(s["t_done"] - s["t"] < cfg["commit_timeout"] for s in outcomes), outcomes
        later = [s for s in outcomes if (s["epoch"], s["step"]) >= (0, lined_up.step)]
        assert later and all(s["outcome"] == "committed" for s in later), (run, outcomes)

    # the committed checkpoints after the relaunch hold all three ranks' parts, with the
    # relaunched id among them
    after = [i for i in ckpt.list() if i.acked_ms / 1000 > rejoined["t"]]
    assert after and all(i.world_size == 3 for i in after)
    assert all(victim in i.workers.values() for i in after)

    # no sample trained twice: the killed incarnation's work that survived it is the shards
    # it completed (recorded done under its id before the kill); its shard in flight died
    # with it (with its model) and is trained again from its start by whoever leases it
    own = {shard for shard, (worker, _) in done_at_kill.items() if worker == victim}
    kept = set().union(*(_shard_samples(params, 0, s) for s in own)) if own else set()
    killed = _samples([logs / "0-1.log"])[0]
    lost = set(killed) - kept
    assert len(lost) <= 2 * params.samples_per_shard, len(lost)  # at most its leases in flight
    survived = _samples([p for p in logs.glob("*.log") if p.name != "0-1.log"])
    survived[0].update(Counter({s: n for s, n in killed.items() if s in kept}))
    for epoch in (0, 1):
        assert survived[epoch] == Counter(range(params.total_samples)), epoch
    ckpt.close()


def test_a_mid_epoch_joiner_takes_the_step_of_the_round_before(
    redis_url: str, tmp_path: Path
) -> None:
    """``RoundCheckpoints.line_up``, step by step: the base is the epoch's newest checkpoint
    opened in the round before or committed (never one opened in the joiner's own round),
    the loop's steps of that epoch count from it, and the round before's open checkpoints
    are aborted, so a member that saves one again fails at once."""
    ctx = JobContext(redis_url, "lineup")
    storage = strata_redis.LocalStorage(tmp_path)
    old = RoundCheckpoints(ctx, storage, worker_id="a", commit_timeout=30.0)
    old.join(1, True, 0, 1)  # round 1 (fresh): "a" alone
    committed = old.save(1, CheckpointId(100, 0), 0, {"model.bin": b"100"}).result(30)
    assert committed.id == CheckpointId(100, 0)
    old.announce(1, CheckpointId(200, 0), 0)  # opened by a member that died before its commit
    old.announce(1, CheckpointId(900, 1), 1)  # (another epoch's: not this one's)
    old.close()

    new = RoundCheckpoints(ctx, storage, worker_id="b", commit_timeout=30.0)
    new.join(2, False, 1, 2)  # round 2, not fresh: "b" joins it mid-epoch 0
    new.announce(2, CheckpointId(300, 0), 0)  # "a" saved in round 2 before "b" lined up
    assert new.line_up(2, 0) == CheckpointId(200, 0)
    assert new.base == new.last == CheckpointId(200, 0)
    assert new.checkpoint(0, 0) is None  # its step 0 is the base: saved by the others
    assert new.checkpoint(100, 0) == CheckpointId(300, 0)  # round 2's: it takes part
    assert new.checkpoint(0, 1) == CheckpointId(0, 1)  # the next epoch: the loop's own steps

    survivor = RoundCheckpoints(ctx, storage, worker_id="a", commit_timeout=30.0)
    survivor.join(2, False, 0, 2)
    with pytest.raises(CheckpointAbortedError, match="joined round 2 mid-epoch"):
        survivor.save(2, CheckpointId(200, 0), 0, {"model.bin": b"200"}).result(10)
    survivor.close()
    new.close()
    # a joiner in an epoch with no checkpoint yet counts from the loop's step 0, like all
    late = RoundCheckpoints(ctx, storage, worker_id="c", commit_timeout=30.0)
    late.join(2, False, 2, 3)
    assert late.line_up(2, 2) is None and late.base is None
    assert late.checkpoint(0, 2) == CheckpointId(0, 2)
    late.close()
    ctx.close()


# -- a dead rank relaunched at once, outside torchrun, with no replace=True --------------------

RELAUNCH_JOB = "relaunch"


def _rank(url: str, worker_id: str, ckpt: str, logdir: str, run: str) -> None:
    """One rank of a two-rank job (``min_workers`` = the world size), outside torchrun, its
    worker id given: one epoch of the README loop, a line per batch."""
    for var in ("RANK", "LOCAL_RANK", "GROUP_RANK", "TORCHELASTIC_RESTART_COUNT"):
        os.environ.pop(var, None)  # not torchrun: ``replace`` is off by default
    log = open(os.path.join(logdir, f"{run}.log"), "a")  # noqa: SIM115
    try:
        # the heartbeat timeout (30 s) is far longer than a relaunch takes: the dead rank's
        # registration still looks alive by its heartbeat when its relaunch registers
        orchestrator = strata_redis.TrainingOrchestrator(
            coordinator_url=url, worker_id=worker_id, job_id=RELAUNCH_JOB, checkpoint_path=ckpt,
            min_workers=2, last_call=0.5, heartbeat_timeout=30.0, heartbeat_interval=0.5,
            lease_ttl=2.0, batch_size=4, rendezvous_timeout=60.0, epoch_timeout=60.0,
        )  # fmt: skip
        Path(logdir, f"joined-{run}").write_text(json.dumps(
            {"incarnation": orchestrator.worker.incarnation, "round": orchestrator.round.number}
        ))  # fmt: skip
        with orchestrator:
            for batch in orchestrator.get_shards(DATASET):
                time.sleep(0.01)
                log.write(f"0 {' '.join(map(str, batch.tolist()))}\n")
                log.flush()
    except Exception as exc:
        Path(logdir, f"error-{run}").write_text(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        log.close()


def test_a_rank_killed_and_relaunched_at_once_under_its_id_takes_its_place(
    redis_url: str, tmp_path: Path
) -> None:
    """SIGKILL one rank of two (``min_workers=2``) and relaunch it at once under the same
    worker id, outside torchrun and without ``replace=True``: its registration, whose
    heartbeat is still fresh, is taken over (its process is gone on this host), the job
    goes on with both ranks, and every sample of the epoch is trained once."""
    manager = strata_redis.ShardManager(redis_url, job_id=RELAUNCH_JOB)
    params = manager.register_dataset_params(DATASET, 4000, 100, True, 3)
    logs, ckpt = tmp_path / "logs", str(tmp_path / "ckpt")
    logs.mkdir()
    procs = [spawn(_rank, redis_url, f"w{r}", ckpt, str(logs), f"0-{r}") for r in range(2)]
    first_log = logs / "0-1.log"
    wait_for(
        lambda: first_log.exists() and first_log.read_text().count("\n") > 10, 90,
        why=lambda: [p.read_text() for p in logs.glob("error-*")],
    )  # fmt: skip
    kill9(procs[1])
    job = manager.job
    # every grant to the killed process has a token up to this; its relaunch's, above it
    granted_at_kill = int(job.client.get(job.keys.fence) or 0)
    relaunched = spawn(_rank, redis_url, "w1", ckpt, str(logs), "1-1")
    codes = join_all([relaunched, procs[0]], timeout=120)
    assert codes == [0, 0], [p.read_text() for p in logs.glob("error-*")]

    first = json.loads((logs / "joined-0-1").read_text())
    again = json.loads((logs / "joined-1-1").read_text())
    assert again["incarnation"] > first["incarnation"]
    # taken over before anyone declared the dead rank failed (30 s): a replace, no failure
    kinds = [(e["type"], e["worker"]) for e in job.events(1000)]
    assert ("replace", "w1") in kinds and ("fail", "w1") not in kinds, kinds
    assert (logs / "1-1.log").read_text(), "the relaunched rank trained nothing"

    # each sample once: the killed process's work that survived it is the shards it
    # completed (recorded under w1 with a token granted before the kill); its shards in
    # flight died with it and were trained again from their start
    done = manager.job.leases(DATASET, 0, "reader").completions()
    assert sorted(done) == list(range(params.num_shards))
    own = {s for s, (worker, token) in done.items() if worker == "w1" and token <= granted_at_kill}
    kept = set().union(*(_shard_samples(params, 0, s) for s in own)) if own else set()
    killed = _samples([logs / "0-1.log"]).get(0, Counter())
    trained = _samples([logs / "0-0.log", logs / "1-1.log"])[0]
    trained.update(Counter({s: n for s, n in killed.items() if s in kept}))
    assert trained == Counter(range(params.total_samples))
    job.close()

"""strata_redis.torch: the lease batch sampler under a prefetching DataLoader, torch state in
checkpoints, the Redis store for torch.distributed, and the DDP example killed mid-epoch."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import torch
from torch.distributed import DistStoreError

import strata_redis
import strata_redis.torch as strata_torch
from strata_redis.data.position import POSITION_PART, Position, decode_positions
from strata_redis.data.sharding import DatasetParams
from strata_redis.errors import CheckpointError

from .procs import wait_for

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp_train.py"
JOB = "torch"
DATASET = "ds"


def _orchestrator(url: str, tmp: Path, **kwargs: Any) -> strata_redis.TrainingOrchestrator:
    return strata_redis.TrainingOrchestrator(
        coordinator_url=url, worker_id=kwargs.pop("worker_id", "w0"), job_id=JOB,
        checkpoint_path=tmp / "ckpt", last_call=0.1, heartbeat_timeout=3.0, **kwargs,
    )  # fmt: skip


def _register(url: str, total: int = 600, per_shard: int = 50) -> DatasetParams:
    return strata_redis.ShardManager(url, job_id=JOB).register_dataset_params(
        DATASET, total, per_shard, True, 3
    )


class Ids(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample i is the tensor [i] (the loop sees exactly which samples it got)."""

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


def _position_samples(params: DatasetParams, position: Position) -> set[int]:
    """The samples a position says the model consumed."""
    out: set[int] = set()
    for shard in position.done():
        out |= set(params.shard(shard, position.epoch).indices().tolist())
    for shard, offset in position.partial.items():
        if shard not in position.done():
            out |= set(params.shard(shard, position.epoch).indices()[:offset].tolist())
    return out


def test_prefetching_loader_saves_what_the_step_consumed(redis_url: str, tmp_path: Path) -> None:
    """num_workers=2 with prefetching: the checkpoint's position (and state_dict) is exactly
    what the loop consumed, never what the loader asked for ahead; leases complete only once
    their last batch is consumed."""
    params = _register(redis_url)
    with _orchestrator(redis_url, tmp_path) as orch:
        sampler = strata_torch.LeaseBatchSampler(orch, DATASET, batch_size=8)
        loader = strata_torch.DataLoader(Ids(), batch_sampler=sampler, num_workers=2,
                                         prefetch_factor=3)  # fmt: skip
        sampler.set_epoch(0)
        consumed: list[int] = []
        for n, batch in enumerate(loader, 1):
            consumed += batch.ravel().tolist()
            if n == 23:  # mid-shard (50 samples a shard: batches of 8, 8, ..., 2)
                break_in_flight = sampler.stream.in_flight
                state = sampler.state_dict()
                future = strata_torch.save(orch, step=n, epoch=0)
                break
        assert future is not None
        info = future.result(30)
        assert break_in_flight > 0, "the loader prefetched nothing: the test shows nothing"
        position = Position.from_json(state["position"])
        assert _position_samples(params, position) == set(consumed)
        (saved,), _ = decode_positions(orch.checkpoints.load(info.step, POSITION_PART, 0))
        assert _position_samples(params, saved) == set(consumed)
        with strata_redis.connect(redis_url, JOB) as reader:
            done = set(reader.leases(DATASET, 0, "reader").completions())
        assert done <= position.done(), "a lease completed before its last batch was consumed"


def test_a_full_epoch_through_the_loader_is_exactly_once(redis_url: str, tmp_path: Path) -> None:
    params = _register(redis_url, total=410, per_shard=30)
    with _orchestrator(redis_url, tmp_path) as orch:
        sampler = strata_torch.LeaseBatchSampler(orch, DATASET, batch_size=7)
        loader = strata_torch.DataLoader(Ids(), batch_sampler=sampler, num_workers=2)
        for epoch in range(orch.epoch, 2):
            sampler.set_epoch(epoch)
            seen = Counter(int(i) for batch in loader for i in batch.ravel())
            assert seen == Counter(range(params.total_samples))
            assert sampler.stream.in_flight == 0
            orch.advance_epoch()


def test_misuse_is_loud(redis_url: str, tmp_path: Path) -> None:
    _register(redis_url)
    with _orchestrator(redis_url, tmp_path) as orch:
        sampler = strata_torch.LeaseBatchSampler(orch, DATASET, batch_size=8)
        with pytest.raises(ValueError, match=r"set_epoch\(1\) but the job is at epoch 0"):
            sampler.set_epoch(1)  # a loop counting on its own after a resume
        with pytest.raises(TypeError, match="LeaseBatchSampler"):
            strata_torch.DataLoader(Ids(), batch_sampler=[[1, 2]])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="in_order=False"):
            strata_torch.DataLoader(Ids(), batch_sampler=sampler, in_order=False)
        with pytest.raises(TypeError, match="TrainingOrchestrator"):
            strata_torch.LeaseBatchSampler(object(), DATASET)  # type: ignore[arg-type]
        loader = strata_torch.DataLoader(Ids(), batch_sampler=sampler)
        iterator = iter(loader)
        next(iterator)
        with pytest.raises(RuntimeError, match="during an iteration"):
            sampler.set_epoch(0)  # would never reach the batches already asked for
        with pytest.raises(RuntimeError, match="already being iterated"):
            next(iter(loader))  # a second walk would hand the same shards out twice
        with pytest.raises(RuntimeError, match="during an iteration"):
            sampler.load_state_dict(sampler.state_dict())
        state = sampler.state_dict()
        iterator.close()  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="did not resume a position"):
            sampler.load_state_dict(state)
        with pytest.raises(ValueError, match="not a LeaseBatchSampler state"):
            sampler.load_state_dict({"position": None})
        with pytest.raises(TypeError, match="no state_dict"):
            strata_torch.save(orch, step=1, epoch=0, model=object())


def test_state_round_trip_through_a_resume(redis_url: str, tmp_path: Path) -> None:
    """Model, optimizer and scheduler saved mid-epoch; a relaunched worker loads all three
    (and its sampler state checks out against the resumed position)."""
    _register(redis_url)
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    with _orchestrator(redis_url, tmp_path) as orch:
        sampler = strata_torch.LeaseBatchSampler(orch, DATASET, batch_size=8)
        for n, batch in enumerate(strata_torch.DataLoader(Ids(), batch_sampler=sampler), 1):
            opt.zero_grad()
            model(batch.float().repeat(1, 4)).sum().backward()
            opt.step()
            sched.step()
            if n == 9:
                saved = strata_torch.save(orch, step=n, epoch=0, model=model, optimizer=opt,
                                          scheduler=sched)  # fmt: skip
                assert saved is not None
                saved.result(30)
                sampler_state = sampler.state_dict()
                break
    with _orchestrator(redis_url, tmp_path) as orch:
        assert orch.resumed is not None and (orch.resumed.epoch, orch.resumed.step) == (0, 9)
        fresh = torch.nn.Linear(4, 2)
        fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.1)
        fresh_sched = torch.optim.lr_scheduler.StepLR(fresh_opt, step_size=1, gamma=0.5)
        info = strata_torch.load(orch, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched)
        assert info == orch.resumed
        for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
            assert torch.equal(a, b)
        assert fresh_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
        assert fresh_sched.get_last_lr() == sched.get_last_lr()
        sampler = strata_torch.LeaseBatchSampler(orch, DATASET, batch_size=8)
        sampler.load_state_dict(sampler_state)  # the position the job resumed from: accepted
        other = {**sampler_state, "position": Position(DATASET, 0, 12, own={0, 1, 2, 3}).to_json()}
        with pytest.raises(ValueError, match="not part of the checkpoint the job resumed from"):
            sampler.load_state_dict(other)
        with pytest.raises(CheckpointError, match=r"has no part 'extra1.pt'"):
            strata_torch.load(orch, extra={"extra1": torch.nn.Linear(1, 1)})


def test_redis_store(redis_url: str) -> None:
    ctx = strata_redis.connect(redis_url, job_id=JOB).context
    store = strata_torch.RedisStore(ctx, 7, timeout=0.3)
    store.set("a", b"\x00\xffbytes")
    assert store.get("a") == b"\x00\xffbytes"
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5
    assert store.get("n") == b"5"
    assert store.check(["a", "n"]) and not store.check(["a", "missing"])
    assert store.compare_set("a", b"wrong", b"x") == b"\x00\xffbytes"
    assert store.compare_set("a", b"\x00\xffbytes", b"x") == b"x"
    assert store.compare_set("new", b"", b"first") == b"first"
    assert store.num_keys() == 3
    assert store.delete_key("new") and not store.delete_key("new")
    with pytest.raises(DistStoreError, match=r"'missing' did not appear within 0\.3s"):
        store.get("missing")
    with pytest.raises(DistStoreError, match="did not appear"):
        store.wait(["a", "missing"], timedelta(seconds=0.1))
    raw = redis.Redis.from_url(redis_url, decode_responses=True)
    assert raw.type(f"strata:{{{JOB}}}:torch_store:7") == "hash"  # one key, the job's slot
    assert 0 < raw.ttl(f"strata:{{{JOB}}}:torch_store:7") <= 86_400
    raw.close()
    ctx.close()


# -- the example, killed mid-epoch -------------------------------------------------------------
def _launch(
    url: str, tmp: Path, run: str, ids: list[str], **flags: Any
) -> list[subprocess.Popen[str]]:
    args = {"redis-url": url, "storage": tmp / "ckpt", "log-dir": tmp / run, "workers": len(ids),
            "epochs": 3, "samples": 2390, "samples-per-shard": 40, "batch-size": 16,
            "checkpoint-every": 5, "lr": 0.005, "heartbeat-timeout": 3.0,
            "collective-timeout": 30.0, **flags}  # fmt: skip
    argv = [f"--{k}" if v is True else f"--{k}={v}" for k, v in args.items()]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = []
    for w in ids:
        with open(tmp / f"{run}-{w}.out", "w") as out:  # the child keeps its own copy
            procs.append(subprocess.Popen(
                [sys.executable, str(EXAMPLE), f"--worker-id={w}", *argv], env=env, text=True,
                stdout=out, stderr=subprocess.STDOUT,
            ))  # fmt: skip
    return procs


def _log(path: Path, kind: str, worker: str = "*") -> list[tuple[int, int, int, list[str]]]:
    """(round, epoch, step, values) lines of the workers' ``kind`` logs under ``path``."""
    out = []
    for f in sorted(path.glob(f"{worker}.{kind}")):
        for line in f.read_text().splitlines():
            r, e, s, *values = line.split()
            out.append((int(r), int(e), int(s), values))
    return out


def _once(counts: Counter[int], total: int, dropped_below: int) -> None:
    """Each sample at most once, and fewer than ``dropped_below`` never (0: none missing)."""
    assert max(counts.values()) == 1, counts.most_common(3)
    assert set(counts) <= set(range(total))
    missing = total - len(counts)
    assert missing <= max(0, dropped_below - 1), missing


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["join", "lockstep"])
def test_ddp_example_killed_mid_epoch_resumes_exactly_once(
    redis_url: str, tmp_path: Path, mode: str
) -> None:
    """3 DDP ranks (gloo); one SIGKILLed mid-epoch after a checkpoint: the survivors stop
    with an error (no hang); relaunched with 2 ranks, the job resumes from the checkpoint and
    finishes: every sample of every epoch trained exactly once relative to the kept model
    (lockstep: fewer than ranks x batch dropped per epoch, and every rank the same number of
    steps, with no Join), and the loss goes on falling from where the model was."""
    ids = ["worker-0", "worker-1", "worker-2"]
    lockstep = {"lockstep": True} if mode == "lockstep" else {}
    batch = 16
    procs = _launch(redis_url, tmp_path, "a", ids, **{"step-sleep": 0.03}, **lockstep)
    ckpt = strata_redis.CheckpointManager(tmp_path / "ckpt", job_id="ddp-example", redis=redis_url)

    def mid_epoch_1() -> bool:
        if all(p.poll() is not None for p in procs):
            raise AssertionError(f"the workers ended: {(tmp_path / 'a-worker-0.out').read_text()}")
        return any(i.epoch == 1 and i.step >= 10 for i in ckpt.list())

    def why() -> Any:
        return [i.label for i in ckpt.list()], [p.poll() for p in procs]

    wait_for(mid_epoch_1, 120, step=0.05, why=why)
    procs[1].send_signal(signal.SIGKILL)
    codes = [p.wait(90) for p in procs]  # raises TimeoutExpired if a survivor hangs
    assert codes[1] == -signal.SIGKILL
    assert codes[0] != 0 and codes[2] != 0, codes  # the survivors stopped, with an error...
    for w in ("worker-0", "worker-2"):  # ... that says why
        out = (tmp_path / f"a-{w}.out").read_text()
        assert re.search(r"RoundBrokenError|Connection (reset|closed) by peer", out), out[-2000:]
    info = ckpt.list()[0]
    kept_epoch, kept_step = info.epoch, info.step
    assert kept_epoch == 1

    params = DatasetParams("synthetic-regression", 2390, 40, True, 42)  # last shard: 30
    # the kept model: epoch 0 whole, and in epoch 1 what its ranks' positions record ...
    positions = [decode_positions(ckpt.load(info.step, POSITION_PART, r))[0][0]
                 for r in range(info.world_size)]  # fmt: skip
    model = Counter(s for p in positions for s in _position_samples(params, p))

    procs = _launch(redis_url, tmp_path, "b", ["worker-0", "worker-2"], **lockstep)
    codes = [p.wait(180) for p in procs]
    assert codes == [0, 0], [(tmp_path / f"b-{w}.out").read_text()[-2000:] for w in ids[::2]]
    for w in ("worker-0", "worker-2"):
        assert f"resumed from {info.step}" in (tmp_path / f"b-{w}.out").read_text()

    everything = Counter(range(params.total_samples))
    # ... which is exactly what the ranks logged before that step (position == consumption)
    a = _log(tmp_path / "a", "samples")
    before = Counter(int(i) for _, e, s, v in a if e == 1 and s < kept_step for i in v)
    assert model == before
    b = _log(tmp_path / "b", "samples")
    after = {e: Counter(int(i) for _, ep, _, v in b if ep == e for i in v) for e in (1, 2)}
    epoch0 = Counter(int(i) for _, e, _, v in a if e == 0 for i in v)
    if mode == "join":
        assert epoch0 == everything
        assert model + after[1] == everything  # none skipped, none twice
        assert after[2] == everything
    else:
        total = params.total_samples
        _once(epoch0, total, 3 * batch)
        _once(model + after[1], total, 2 * batch)  # none twice; dropped: the resumed round's
        _once(after[2], total, 2 * batch)
        # every rank the same number of steps in each whole epoch (run a's epoch 1 was cut)
        for run, epoch, workers in (("a", 0, ids), ("b", 1, ids[::2]), ("b", 2, ids[::2])):
            steps = {w: sum(e == epoch for _, e, _, _ in _log(tmp_path / run, "samples", w))
                     for w in workers}  # fmt: skip
            assert len(set(steps.values())) == 1, (run, epoch, steps)

    losses_a = [float(v[0]) for _, e, _, v in _log(tmp_path / "a", "loss") if e == 0]
    losses_b = [float(v[0]) for _, _, _, v in _log(tmp_path / "b", "loss")]
    assert np.mean(losses_b[:10]) < 0.8 * np.mean(losses_a[:10])  # restored, not from scratch
    assert np.mean(losses_b[-20:]) < 0.5 * np.mean(losses_b[:20])  # and still going down
    ckpt.close()

"""strata_redis.torch.save stages the state and serializes it off the loop: what is restored is
bit-exact, the loop may change its tensors at once, a worker killed mid-write commits
nothing, staging memory stays bounded, and a failure in the background is never lost."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import strata_redis
import strata_redis.torch as strata_torch
from strata_redis import CheckpointManager
from strata_redis.errors import CheckpointError
from strata_redis.storage.base import TMP_PREFIX
from strata_redis.storage.local import LocalStorage
from strata_redis.torch import staging
from strata_redis.torch.staging import ALIGN, StagingArea

from .procs import kill9, spawn, wait_for

pytestmark = pytest.mark.torch

JOB = "torch-async"


def _orchestrator(url: str, tmp: Path, **kwargs: Any) -> strata_redis.TrainingOrchestrator:
    return strata_redis.TrainingOrchestrator(
        coordinator_url=url, worker_id=kwargs.pop("worker_id", "w0"), job_id=JOB,
        checkpoint_path=tmp / "ckpt", last_call=0.1, heartbeat_timeout=3.0, **kwargs,
    )  # fmt: skip


class Odd(torch.nn.Module):
    """Every kind of tensor a state holds: dtypes, NaN payloads and -0.0, tied weights, a
    view sharing its storage, a non-contiguous tensor, a 0-dim one."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight  # tied: one storage, two keys
        self.low = torch.nn.Parameter(torch.randn(5, 3).to(torch.bfloat16))
        odd = torch.tensor([float("nan"), -0.0, float("inf"), 1e-310], dtype=torch.float64)
        odd[0:1].view(torch.int64).bitwise_xor_(0x5)  # a NaN with a payload
        self.register_buffer("odd", odd)
        self.register_buffer("count", torch.tensor(7, dtype=torch.int64))
        self.register_buffer("mask", torch.rand(9) > 0.5)
        base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
        self.register_buffer("base", base)
        self.register_buffer("transposed", base.t())  # non-contiguous, same storage
        self.register_buffer("row", base[1])  # a view into the same storage


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if (a.dtype, a.shape, a.stride(), a.storage_offset()) != (
        b.dtype, b.shape, b.stride(), b.storage_offset()
    ):  # fmt: skip
        return False
    return torch.equal(
        a.detach().reshape(-1).contiguous().view(torch.uint8),
        b.detach().reshape(-1).contiguous().view(torch.uint8),
    )


def _frozen(state: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of a state (what a save must record, whatever the loop does after)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))


def _saved(orch: strata_redis.TrainingOrchestrator, step: int, part: str) -> dict[str, Any]:
    raw = orch.checkpoints.load(step, name=part, epoch=0, rank=0)
    return dict(torch.load(io.BytesIO(raw), weights_only=True))


def _trained() -> tuple[Odd, torch.optim.Optimizer]:
    torch.manual_seed(3)
    model = Odd()
    opt = torch.optim.Adam([p for p in model.parameters() if p.dtype == torch.float32], lr=0.1)
    model.emb(torch.tensor([1, 2])).sum().backward()
    opt.step()
    return model, opt


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Holds every serialized part's write (a slow disk) until the test sets the event."""
    event = threading.Event()
    original = LocalStorage.write_chunks

    def held(self: LocalStorage, path: str, chunks: Any) -> None:
        assert event.wait(60), "the test never opened the gate"
        original(self, path, chunks)

    monkeypatch.setattr(LocalStorage, "write_chunks", held)
    yield event
    event.set()


def test_restore_is_bit_exact(redis_url: str, tmp_path: Path) -> None:
    """Model and optimizer saved through the staging area load back bit for bit, tied
    weights still tied and views still views; a relaunched worker loads them."""
    model, opt = _trained()
    expected = _frozen(model.state_dict())
    with _orchestrator(redis_url, tmp_path) as orch:
        future = strata_torch.save(orch, step=1, epoch=0, model=model, optimizer=opt)
        assert future is not None
        info = future.result(30)
        assert info.step == 1 and "model.pt" in info.part_names()
        saved = _saved(orch, 1, "model.pt")
        assert saved.keys() == expected.keys()
        for key, tensor in expected.items():
            assert _same_bits(saved[key], tensor), key
        # sharing as torch.save records it: tied weights one storage, views of one storage
        ptr = lambda t: t.untyped_storage().data_ptr()  # noqa: E731
        assert ptr(saved["emb.weight"]) == ptr(saved["head.weight"])
        assert ptr(saved["base"]) == ptr(saved["transposed"]) == ptr(saved["row"])
        assert saved.keys() == model.state_dict().keys()
        staged_opt = _saved(orch, 1, "optimizer.pt")
        assert staged_opt["param_groups"] == opt.state_dict()["param_groups"]
        for index, values in opt.state_dict()["state"].items():
            for name, value in values.items():
                assert _same_bits(staged_opt["state"][index][name], value), (index, name)
    with _orchestrator(redis_url, tmp_path) as orch:
        fresh = Odd()
        fresh_opt = torch.optim.Adam(
            [p for p in fresh.parameters() if p.dtype == torch.float32], lr=0.5
        )
        assert strata_torch.load(orch, model=fresh, optimizer=fresh_opt) == orch.resumed
        for key, tensor in model.state_dict().items():
            assert torch.equal(
                fresh.state_dict()[key].reshape(-1).contiguous().view(torch.uint8),
                tensor.reshape(-1).contiguous().view(torch.uint8),
            ), key
        assert fresh_opt.state_dict()["param_groups"][0]["lr"] == 0.1


def test_the_loop_may_change_its_tensors_once_save_returns(
    redis_url: str, tmp_path: Path, gate: threading.Event
) -> None:
    """save() returns before the part is serialized or written (the write is held here);
    the loop then changes every tensor and the optimizer's values in place: the checkpoint
    holds the state as it was when save() was called."""
    model, opt = _trained()
    expected, expected_opt = _frozen(model.state_dict()), _frozen(opt.state_dict())
    with _orchestrator(redis_url, tmp_path) as orch:
        future = strata_torch.save(orch, step=1, epoch=0, model=model, optimizer=opt)
        assert future is not None and not future.done()
        with torch.no_grad():
            storages = {t.untyped_storage()._cdata: t.untyped_storage()
                        for t in model.state_dict().values()}  # fmt: skip
            for storage in storages.values():  # every byte of every tensor, once
                torch.empty(0, dtype=torch.uint8).set_(storage).bitwise_xor_(1)
            for state in opt.state.values():
                for value in state.values():
                    value.add_(1000)
        opt.param_groups[0]["lr"] = 42.0
        gate.set()
        future.result(30)
        saved = _saved(orch, 1, "model.pt")
        for key, tensor in expected.items():
            assert _same_bits(saved[key], tensor), key
            assert not _same_bits(saved[key], model.state_dict()[key]), key  # it did change
        saved_opt = _saved(orch, 1, "optimizer.pt")
        assert saved_opt["param_groups"][0]["lr"] == 0.1
        for index, values in expected_opt["state"].items():
            for name, value in values.items():
                assert _same_bits(saved_opt["state"][index][name], value), (index, name)


def test_staging_memory_is_bounded_and_a_busy_buffer_is_waited_for(
    redis_url: str, tmp_path: Path, gate: threading.Event
) -> None:
    """One buffer of the state's size by default, reused save after save; a save that finds
    it busy (the previous save still writing) waits, and both checkpoints hold their own
    state; with two buffers the second save copies while the first writes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 3))
    state_bytes = sum(-(-t.untyped_storage().nbytes() // ALIGN) * ALIGN
                      for t in model.state_dict().values())  # fmt: skip
    first = _frozen(model.state_dict())
    with _orchestrator(redis_url, tmp_path) as orch:
        area = strata_torch.staging_area(orch)
        assert isinstance(area, StagingArea) and area.buffers == 1
        one = strata_torch.save(orch, step=1, epoch=0, model=model)
        assert one is not None
        assert area.nbytes == state_bytes and area.in_use == 1
        with torch.no_grad():
            model[0].weight.fill_(2.0)
        second = _frozen(model.state_dict())
        results: list[Any] = []
        saver = threading.Thread(
            target=lambda: results.append(strata_torch.save(orch, step=2, epoch=0, model=model))
        )
        saver.start()
        time.sleep(0.5)
        assert saver.is_alive(), "the second save copied into the buffer the first writes from"
        assert area.nbytes == state_bytes  # never a second buffer
        gate.set()
        saver.join(30)
        assert not saver.is_alive() and results[0] is not None
        one.result(30)
        results[0].result(30)
        for step, expected in ((1, first), (2, second)):
            saved = _saved(orch, step, "model.pt")
            for key, tensor in expected.items():
                assert _same_bits(saved[key], tensor), (step, key)
        for step in range(3, 6):  # reused: the same memory, save after save
            future = strata_torch.save(orch, step=step, epoch=0, model=model)
            assert future is not None
            future.result(30)
        assert area.nbytes == state_bytes and area.in_use == 0

        gate.clear()
        area = strata_torch.staging_area(orch, buffers=2)
        a = strata_torch.save(orch, step=6, epoch=0, model=model)
        b = strata_torch.save(orch, step=7, epoch=0, model=model)  # returns: the other buffer
        assert a is not None and b is not None
        assert area.nbytes == 2 * state_bytes and area.in_use == 2
        gate.set()
        a.result(30)
        b.result(30)
        strata_torch.close(orch)
        assert area.nbytes == 0  # freed; the next save allocates again


class Unpicklable:
    """An object whose state cannot be serialized (a local function): torch.save fails on
    the upload thread, after save() returned."""

    def state_dict(self) -> dict[str, Any]:
        return {"fn": lambda: 1, "t": torch.ones(3)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def test_a_failure_in_the_background_is_never_lost(redis_url: str, tmp_path: Path) -> None:
    """A save whose serialization fails on the upload thread: its future holds the error;
    if nobody looked, the next save (or wait) raises it, once; it never commits."""
    model = torch.nn.Linear(3, 2)
    with _orchestrator(redis_url, tmp_path) as orch:
        bad = strata_torch.save(orch, step=1, epoch=0, model=model, extra={"bad": Unpicklable()})
        assert bad is not None
        wait_for(bad.inner.done, 30)
        with pytest.raises(CheckpointError, match=r"earlier strata_redis.torch.save .*step_1"):
            strata_torch.save(orch, step=2, epoch=0, model=model)
        assert bad.seen
        good = strata_torch.save(orch, step=3, epoch=0, model=model)  # raised once only
        assert good is not None and good.result(30).step == 3
        assert [i.step for i in orch.checkpoints.list()] == [3]

        again = strata_torch.save(orch, step=4, epoch=0, model=model, extra={"bad": Unpicklable()})
        assert again is not None
        with pytest.raises(CheckpointError, match="step_4"):
            strata_torch.wait(orch, timeout=30)
        strata_torch.wait(orch, timeout=30)  # reported: not again

        seen = strata_torch.save(orch, step=5, epoch=0, model=model, extra={"bad": Unpicklable()})
        assert seen is not None
        with pytest.raises(CheckpointError, match=r"[Pp]ickle"):
            seen.result(30)  # seen through its future: not raised again
        strata_torch.close(orch, timeout=30)
        assert [i.step for i in orch.checkpoints.list()] == [3]
        assert strata_torch.staging_area(orch).in_use == 0


# -- a worker killed during the background write ------------------------------------------------
def _big_model(mb: int) -> torch.nn.Module:
    torch.manual_seed(5)
    return torch.nn.Linear(1024, mb * 256, bias=False)  # mb MiB of float32


def save_then_die_mid_write(url: str, root: str, mb: int, marker: str) -> None:
    """Commit step 1 of a small model, then save step 2 of a big one: the write announces
    itself (marker) halfway and goes on slowly, so the parent kills us inside it."""
    import os

    import strata_redis.storage.local as local

    orch = strata_redis.TrainingOrchestrator(
        coordinator_url=url, worker_id="doomed", job_id=JOB, checkpoint_path=root,
        last_call=0.1, heartbeat_timeout=3.0,
    )  # fmt: skip
    small = _big_model(1)
    saved = strata_torch.save(orch, step=1, epoch=0, model=small)
    assert saved is not None
    saved.result(60)
    real_writev = os.writev

    def slow_writev(fd: int, views: Any) -> int:
        written = real_writev(fd, views[:2])
        Path(marker).touch()
        time.sleep(2)
        return written

    local.os.writev = slow_writev  # type: ignore[attr-defined]
    big = _big_model(mb)
    strata_torch.save(orch, step=2, epoch=0, model=big)  # returns; the write goes on
    time.sleep(120)


def test_a_worker_killed_during_the_background_write_commits_nothing(
    redis_url: str, tmp_path: Path
) -> None:
    root, marker = tmp_path / "ckpt", tmp_path / "writing"
    proc = spawn(save_then_die_mid_write, redis_url, str(root), 8, str(marker))
    wait_for(lambda: marker.exists() or not proc.is_alive(), 60)
    assert proc.is_alive(), "the child died before its write"
    kill9(proc)  # in the middle of writing model.pt of step 2
    step2 = root / JOB / "checkpoints" / "epoch_0_step_2"
    assert any(p.name.startswith(TMP_PREFIX) for p in step2.rglob("*")), "no partial write"
    assert not (step2 / "metadata.json").exists()
    with CheckpointManager(root, redis=redis_url, job_id=JOB) as ckpt:
        assert [i.step for i in ckpt.list()] == [1]
        raw = ckpt.load(name="model.pt")
        state = torch.load(io.BytesIO(raw), weights_only=True)
        assert _same_bits(state["weight"], _big_model(1).state_dict()["weight"])


def test_a_reused_buffer_is_never_written_from_again() -> None:
    """A part saved again later (an epoch-end fill-in re-saves the last parts) holds its
    buffer only while nothing was staged into it since; a buffer a save holds is never
    staged into (stage waits, here until its timeout)."""
    area = StagingArea(1, name="job")
    state = {"w": torch.arange(1000, dtype=torch.float32)}
    first = area.stage({"model.pt": state})["model.pt"]
    first.hold()  # the save takes the reservation
    with pytest.raises(TimeoutError, match="no staging buffer came free"):
        area.stage({"model.pt": state}, timeout=0.2)
    raw = b"".join(first.chunks())
    assert torch.equal(torch.load(io.BytesIO(raw), weights_only=True)["w"], state["w"])
    first.release()
    first.hold()  # nothing staged since: a fill-in may save it again
    first.release()
    second = area.stage({"model.pt": {"w": state["w"] * 2}})["model.pt"]
    with pytest.raises(CheckpointError, match="reused by a later save"):
        first.hold()
    second.drop()  # not taken by a save: the reservation goes
    assert area.in_use == 0 and area.nbytes == -(-4000 // ALIGN) * ALIGN


def test_a_failed_allocation_frees_the_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A staging buffer that cannot be allocated (MemoryError on a tight host) fails that
    save only: the next one gets the buffer instead of waiting for it forever. (The
    allocator's failure is injected: a real one cannot be had on demand.)"""
    area = StagingArea(1, name="job")
    state = {"w": torch.arange(1000, dtype=torch.float32)}
    real = staging.np.empty

    def no_memory(size: Any, *args: Any, **kwargs: Any) -> Any:
        if size:
            raise MemoryError("injected: no memory for the staging buffer")
        return real(size, *args, **kwargs)

    monkeypatch.setattr(staging.np, "empty", no_memory)
    with pytest.raises(MemoryError, match="injected"):
        area.stage({"model.pt": state})
    assert area.in_use == 0
    monkeypatch.undo()
    part = area.stage({"model.pt": state}, timeout=5)["model.pt"]  # not a TimeoutError
    assert torch.equal(torch.load(io.BytesIO(b"".join(part.chunks())), weights_only=True)["w"],
                       state["w"])  # fmt: skip
    part.drop()

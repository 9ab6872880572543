"""The save pipeline (``checkpoint/pipeline.py``) through a fake storage and a fake commit
protocol (``fakes.CommitGroup``): what is written where, acks in order, the leader's commit,
aborts, and the refusals. (The commit scripts are the process tier's: test_checkpoint.py.)"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest

from strata_redis.checkpoint import pipeline as pipeline_module
from strata_redis.checkpoint.checksum import format_checksum
from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.checkpoint.manifest import METADATA, checkpoint_dir, decode_metadata
from strata_redis.checkpoint.pipeline import SavePipeline
from strata_redis.errors import CheckpointAbortedError, CheckpointError, StepNotForwardError

from .fakes import JOB, CommitGroup, FakeProtocol, MemoryStorage

Made = list[SavePipeline]


@pytest.fixture
def prunes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The retention passes the pipelines queued (their keep_count)."""
    calls: list[int] = []
    monkeypatch.setattr(pipeline_module, "prune", lambda storage, ctx, keep: calls.append(keep))
    return calls


@pytest.fixture
def made() -> Iterator[Made]:
    pipelines: Made = []
    yield pipelines
    for p in pipelines:
        p.close(wait=False)


def pipelines(made: Made, storage: MemoryStorage, world: int, **kw: Any
              ) -> tuple[CommitGroup, list[SavePipeline]]:  # fmt: skip
    group = CommitGroup(world, storage)
    out = []
    for rank in range(world):
        p = SavePipeline(
            SimpleNamespace(job_id=JOB), storage, FakeProtocol(group, rank),  # type: ignore[arg-type]
            keep_count=kw.get("keep_count", 3), max_in_flight=kw.get("max_in_flight", 2),
            commit_timeout=kw.get("commit_timeout", 10.0), progress_interval=60.0,
            hasher=ThreadPoolExecutor(1),
        )  # fmt: skip
        made.append(p)
        out.append(p)
    return group, out


def part(data: bytes, immutable: bool = True) -> tuple[memoryview, bool]:
    return memoryview(data), immutable


def test_one_rank_saves_its_parts_and_commits(made: Made, prunes: list[int]) -> None:
    storage = MemoryStorage()
    group, (p,) = pipelines(made, storage, 1, keep_count=4)
    cid = CheckpointId(10, 1)
    future = p.submit(cid, {"model.bin": part(b"weights"), "opt/a.bin": part(b"xy")}, True, None)
    info = future.result(timeout=10)
    assert future.phase == "committed" and future.checkpoint == cid and future.step == 10
    base = checkpoint_dir(JOB, cid)
    assert storage.objects[f"{base}/model.bin"] == b"weights"
    assert storage.objects[f"{base}/opt/a.bin"] == b"xy"
    assert info.files["model.bin"].checksum == format_checksum(zlib.crc32(b"weights"))
    assert info.nbytes == 9 and future.nbytes == 9
    assert decode_metadata(storage.objects[f"{base}/{METADATA}"], JOB, cid) == info
    assert group.begun == [(0, cid)] and cid in group.committed
    p.wait(timeout=10)
    assert prunes == [4]  # one retention pass after the commit


def test_ranks_write_under_their_rank_and_one_leads(made: Made, prunes: list[int]) -> None:
    storage = MemoryStorage()
    _group, ranks = pipelines(made, storage, 2)
    cid = CheckpointId(5)
    futures = [p.submit(cid, {"model.bin": part(bytes([r]) * 3)}, True, None)
               for r, p in enumerate(ranks)]  # fmt: skip
    infos = [f.result(timeout=10) for f in futures]
    assert infos[0] == infos[1]
    assert set(infos[0].files) == {"rank_0/model.bin", "rank_1/model.bin"}
    assert infos[0].workers == {0: "w0", 1: "w1"}
    assert storage.objects[f"{JOB}/checkpoints/step_5/rank_1/model.bin"] == b"\x01\x01\x01"
    for p in ranks:
        p.wait(timeout=10)
    assert prunes == [3]  # the leader alone


def test_a_failed_write_aborts_the_checkpoint_for_every_rank(made: Made, prunes: list[int]) -> None:
    storage = MemoryStorage()
    storage.fail_writes = "rank_1/"
    group, ranks = pipelines(made, storage, 2)
    cid = CheckpointId(7, 0)
    ok = ranks[0].submit(cid, {"model.bin": part(b"a")}, True, None)
    bad = ranks[1].submit(cid, {"model.bin": part(b"b")}, True, None)
    with pytest.raises(CheckpointAbortedError, match="rank 1 could not save its parts"):
        bad.result(timeout=10)
    with pytest.raises(CheckpointAbortedError, match="aborted by worker 'w1'"):
        ok.result(timeout=10)
    assert bad.phase == "failed" and group.aborted[cid][0] == 1
    assert not any(k.endswith(METADATA) for k in storage.objects) and prunes == []


def test_a_checkpoint_already_in_storage_is_not_overwritten(made: Made, prunes: list[int]) -> None:
    storage = MemoryStorage()
    cid = CheckpointId(3)
    storage.write(f"{checkpoint_dir(JOB, cid)}/{METADATA}", b"{}")
    group, (p,) = pipelines(made, storage, 1)
    future = p.submit(cid, {"model.bin": part(b"new")}, True, None)
    with pytest.raises(CheckpointError, match="already committed in memory://fake"):
        future.result(timeout=10)
    assert f"{checkpoint_dir(JOB, cid)}/model.bin" not in storage.objects
    assert cid in group.aborted and group.begun == []


def test_checkpoints_must_go_forward(made: Made, prunes: list[int]) -> None:
    _, (p,) = pipelines(made, MemoryStorage(), 1)
    p.submit(CheckpointId(4, 1), {"m": part(b"x")}, True, None).result(timeout=10)
    for cid in (CheckpointId(4, 1), CheckpointId(3, 1), CheckpointId(100, 0)):
        with pytest.raises(StepNotForwardError, match="this manager already saved"):
            p.submit(cid, {"m": part(b"x")}, True, None)
    with pytest.raises(StepNotForwardError, match=f"job {JOB!r} already committed") as err:
        p.submit(CheckpointId(9, 1), {"m": part(b"x")}, True, CheckpointId(0, 2))
    assert err.value.newest == CheckpointId(0, 2) and isinstance(err.value, ValueError)
    # a refused save does not block the next one
    p.submit(CheckpointId(0, 0, run=1), {"m": part(b"y")}, True, None).result(timeout=10)


def test_a_closed_pipeline_refuses_saves(made: Made, prunes: list[int]) -> None:
    _, (p,) = pipelines(made, MemoryStorage(), 1)
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        p.submit(CheckpointId(1), {"m": part(b"x")}, True, None)


def test_a_mutable_buffer_is_copied_before_submit_returns(made: Made, prunes: list[int]) -> None:
    storage = MemoryStorage()
    _, (p,) = pipelines(made, storage, 1)
    buf = bytearray(b"before")
    future = p.submit(CheckpointId(1), {"m": (memoryview(buf), False)}, True, None)
    buf[:] = b"AFTER!"  # the loop goes on with its buffer at once
    future.result(timeout=10)
    assert storage.objects[f"{JOB}/checkpoints/step_1/m"] == b"before"


def test_acks_go_out_in_checkpoint_order(made: Made, prunes: list[int]) -> None:
    storage = MemoryStorage()
    group, ranks = pipelines(made, storage, 2, max_in_flight=3)
    first, second = CheckpointId(1), CheckpointId(2)
    gate = threading.Event()
    original = storage.write

    def slow_first(path: str, data: object) -> None:
        if "step_1/" in path:
            gate.wait(10)  # rank 0's first upload is slow: its second must not ack first
        original(path, data)

    storage.write = slow_first  # type: ignore[method-assign]
    f1 = ranks[0].submit(first, {"m": part(b"1")}, True, None)
    f2 = ranks[0].submit(second, {"m": part(b"2")}, True, None)
    others = [ranks[1].submit(c, {"m": part(b"o")}, True, None) for c in (first, second)]
    gate.set()
    for f in (f1, f2, *others):
        f.result(timeout=10)
    mine = [c for r, c in group.order if r == 0]
    assert mine == [first, second]


def test_abort_pending_wakes_a_rank_waiting_for_the_others(made: Made, prunes: list[int]) -> None:
    group, (alone, _) = pipelines(made, MemoryStorage(), 2)
    cid = CheckpointId(8)
    future = alone.submit(cid, {"m": part(b"x")}, True, None)
    with group.lock:
        group.lock.wait_for(lambda: (0, cid) in group.order, 10)  # acked; the peer never will
    assert future.phase == "waiting"
    assert alone.abort_pending("the round broke") == [cid]
    with pytest.raises(CheckpointAbortedError, match="the round broke"):
        future.result(timeout=10)
    assert alone.abort_pending("again") == []


def test_a_save_cannot_be_cancelled(made: Made, prunes: list[int]) -> None:
    storage = MemoryStorage()
    gate = threading.Event()
    original = storage.write

    def slow(path: str, data: object) -> None:
        gate.wait(10)
        original(path, data)

    storage.write = slow  # type: ignore[method-assign]
    _, (p,) = pipelines(made, storage, 1)
    future = p.submit(CheckpointId(5), {"m": part(b"x")}, True, None)
    assert future.cancel() is False  # (it would not stop the upload or the commit)
    gate.set()
    p.wait(timeout=10)  # returns once the save is done, not at the cancel
    assert future.result(timeout=10).step == 5 and future.phase == "committed"


def test_a_save_whose_snapshot_failed_leaves_its_step_to_a_retry(
    made: Made, prunes: list[int]
) -> None:
    _, (p,) = pipelines(made, MemoryStorage(), 1)

    class Failing(pipeline_module.DeferredPart):
        size_hint = 1

        def hold(self) -> None:
            raise MemoryError("no room to stage it (fake)")

        def chunks(self) -> list[memoryview]:
            raise AssertionError("never made")

        def release(self) -> None:
            pass

    cid = CheckpointId(7)
    with pytest.raises(MemoryError):
        p.submit(cid, {"m": Failing()}, True, None)  # nothing of it started
    assert p.submit(cid, {"m": part(b"x")}, True, None).result(timeout=10).step == 7


def test_a_done_callback_may_save_again_at_once(made: Made, prunes: list[int]) -> None:
    _, (p,) = pipelines(made, MemoryStorage(), 1, max_in_flight=1)
    saved = threading.Event()
    second: list[Any] = []

    def save_next(_: Any) -> None:  # runs on the upload thread, the first save resolved
        second.append(p.submit(CheckpointId(2), {"m": part(b"b")}, True, None))
        saved.set()

    first = p.submit(CheckpointId(1), {"m": part(b"a")}, True, None)
    first.add_done_callback(save_next)
    assert first.result(timeout=10).step == 1
    assert saved.wait(10), "the callback's save waited for the slot its own save held"
    assert second[0].result(timeout=10).step == 2

"""The orchestrator's checkpoints are the loop's (epoch, step): big numbers, runs, a warning."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

import strata_redis
from strata_redis.chaos.stand_in import BUCKET, S3StandIn
from strata_redis.storage.local import LocalStorage
from strata_redis.storage.s3 import S3Storage

from .procs import wait_for

JOB = "ckpt-ids-job"
LOGGER = "strata_redis.orchestrator"


def _orch(
    url: str, root: Path | LocalStorage | S3Storage, **kwargs: Any
) -> strata_redis.TrainingOrchestrator:
    kwargs.setdefault("keep_count", 3)
    path = str(root) if isinstance(root, Path) else root
    return strata_redis.TrainingOrchestrator(
        url, "w0", job_id=JOB, checkpoint_path=path, last_call=0.1, **kwargs
    )


def _dirs(root: Path) -> list[str]:
    return sorted(p.name for p in (root / JOB / "checkpoints").iterdir())


def test_a_big_step_and_epoch_commit_as_given(redis_url: str, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    with _orch(redis_url, root) as orch:
        future = orch.save_checkpoint(step=2**25, epoch=10_000, state=b"model")
        assert future is not None
        info = future.result(30)
        assert (info.epoch, info.step, info.run) == (10_000, 2**25, 0)
        assert orch.checkpoints.load(step=2**25, epoch=10_000) == b"model"
        with pytest.raises(ValueError, match="step must be between 0 and 9007199254740992"):
            orch.save_checkpoint(step=2**53 + 1, epoch=0)
    assert _dirs(root) == ["epoch_10000_step_33554432"]
    doc = orjson.loads((root / JOB / "checkpoints" / _dirs(root)[0] / "metadata.json").read_bytes())
    assert (doc["epoch"], doc["step"], doc["run"]) == (10_000, 2**25, 0)


def test_a_relaunch_saves_after_the_old_run(
    redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ckpt"
    with _orch(redis_url, root) as first:
        for step in (100, 200):
            saved = first.save_checkpoint(step=step, epoch=1, state=f"a{step}".encode())
            assert saved is not None
            saved.result(30)
    # the whole job relaunched: its loop counts from step 0 of the epoch again
    with caplog.at_level(logging.WARNING, logger=LOGGER), _orch(redis_url, root) as second:
        assert second.resumed is not None and second.resumed.label == "epoch_1_step_200"
        for step in (0, 100):
            saved = second.save_checkpoint(step=step, epoch=1, state=f"b{step}".encode())
            assert saved is not None
            assert saved.result(30).run == 1
        second.wait_for_checkpoints(30)
        second.checkpoints.wait(30)
        listed = [i.label for i in second.checkpoints.list()]
        assert second.checkpoints.load(step=100, epoch=1) == b"b100"  # the newest run's
    assert listed == ["run_1_epoch_1_step_100", "run_1_epoch_1_step_0", "epoch_1_step_200"]
    assert _dirs(root) == ["epoch_1_step_200", "run_1_epoch_1_step_0", "run_1_epoch_1_step_100"]
    assert "found in storage only" not in caplog.text  # Redis held the checkpoints


def test_resuming_from_storage_alone_warns_once(
    redis_url: str, raw: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ckpt"
    with _orch(redis_url, root) as first:
        saved = first.save_checkpoint(step=5, epoch=0, state=b"m")
        assert saved is not None
        info = saved.result(30)
    raw.flushall()  # a new Redis: nothing of the job but what storage holds
    with caplog.at_level(logging.WARNING, logger=LOGGER), _orch(redis_url, root) as second:
        assert second.resumed is not None and second.resumed.id == info.id
        assert second.load_state() == b"m"
    warned = [r for r in caplog.records if "found in storage only" in r.getMessage()]
    assert len(warned) == 1, caplog.text
    message = warned[0].getMessage()
    assert "checkpoint (epoch 0, step 5)" in message
    assert " seconds ago" in message
    assert f"{root}/{JOB}/checkpoints/epoch_0_step_5" in message


def test_the_resume_warning_reaches_stderr_of_a_plain_script(
    redis_url: str, raw: Any, tmp_path: Path
) -> None:
    """A loop with no logging set up: the one WARNING is on stderr (Python's last resort)."""
    root = tmp_path / "ckpt"
    with _orch(redis_url, root) as first:
        saved = first.save_checkpoint(step=300, epoch=2, state=b"m")
        assert saved is not None
        saved.result(30)
    raw.flushall()
    script = (
        "import strata_redis, sys\n"
        f"o = strata_redis.TrainingOrchestrator({redis_url!r}, 'w0', job_id={JOB!r}, "
        f"checkpoint_path={str(root)!r}, last_call=0.1)\n"
        "print(o.resumed.label)\n"
        "o.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "epoch_2_step_300"
    assert out.stderr.count("found in storage only") == 1, out.stderr
    assert "checkpoint (epoch 2, step 300)" in out.stderr and " seconds ago" in out.stderr


@pytest.mark.parametrize("as_part", [False, True], ids=["state", "dict-value"])
def test_an_object_array_is_refused_like_checkpoint_manager_does(
    redis_url: str, tmp_path: Path, as_part: bool
) -> None:
    objects = np.array([object(), object(), object()])
    root = tmp_path / "ckpt"
    with _orch(redis_url, root) as orch:
        state: Any = {"weights": np.arange(4.0), "meta": objects} if as_part else objects
        where = r"state\['meta'\]" if as_part else "state"
        with pytest.raises(TypeError, match=rf"{where} must hold plain data.*dtype object"):
            orch.save_checkpoint(step=5, epoch=0, state=state)
        assert orch.checkpoints.list() == []  # nothing saved, and the step is still free
        future = orch.save_checkpoint(step=5, epoch=0, state=b"model")
        assert future is not None and future.result(30).step == 5
    assert _dirs(root) == ["epoch_0_step_5"]


class GatedStorage(LocalStorage):
    """Local storage whose writes wait for a gate (to hold a save's upload in flight)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = threading.Event()

    def write(self, path: str, data: object) -> None:
        assert self.gate.wait(30)
        super().write(path, data)

    def write_chunks(self, path: str, chunks: Any) -> None:
        assert self.gate.wait(30)
        super().write_chunks(path, chunks)


def test_the_status_shows_checkpointing_while_the_upload_runs_and_the_loop_never_writes_it(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = GatedStorage(tmp_path / "gated")
    job = strata_redis.connect(redis_url, JOB)
    status = lambda: {w.worker_id: w.status for w in job.workers()}["w0"]  # noqa: E731
    with _orch(redis_url, storage) as orch:
        loop = threading.current_thread()
        writers: list[threading.Thread] = []
        set_status = orch.worker.set_status

        def recording(value: str) -> None:
            writers.append(threading.current_thread())
            set_status(value)

        monkeypatch.setattr(orch.worker, "set_status", recording)
        future = orch.save_checkpoint(step=1, epoch=0, state=b"model")
        assert future is not None
        wait_for(lambda: status() == "checkpointing", 10)
        assert not future.done()  # the upload is held at the gate
        storage.gate.set()
        future.result(30)
        wait_for(lambda: status() == "idle", 10)  # back to the loop's status once committed
        assert writers and loop not in writers, "the loop's thread wrote a status"


def test_a_storage_outage_at_resume_is_ridden_out(redis_url: str) -> None:
    # the S3 stand-in behind a proxy: a relaunched job's first reads (its checkpoint's data
    # positions) meet the storage refusing every connection for 2 s
    with S3StandIn().start() as s3, s3.credentials():
        assert s3.proxy is not None
        storage = S3Storage(BUCKET, "us-east-1", f"http://{s3.proxy.address}", prefix="o",
                            max_attempts=1)  # fmt: skip
        with _orch(redis_url, storage) as first:
            saved = first.save_checkpoint(step=7, epoch=0, state=b"m7")
            assert saved is not None
            info = saved.result(30)
        s3.proxy.cut()
        back = threading.Timer(2.0, s3.proxy.cut, args=(False,))
        back.start()
        try:
            # without the ride-out: StorageError from the fresh round's resume, at once
            with _orch(redis_url, storage, redis_retry=30) as second:
                assert second.resumed is not None and second.resumed.id == info.id
                assert second.load_state() == b"m7"
        finally:
            back.cancel()
            s3.proxy.cut(False)

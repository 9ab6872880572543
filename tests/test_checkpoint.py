"""Checkpoints: non-blocking all-or-nothing saves, verified loads, retention, records.

Against a real redis-server, a real S3 endpoint (moto over HTTP) and real worker processes.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import psutil
import pytest
import redis

import strata_redis
from strata_redis import (
    CheckpointError,
    CheckpointManager,
    CheckpointNotFoundError,
    CheckpointSkippedWarning,
    LocalStorage,
    S3Storage,
    StorageError,
    identity,
)
from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.errors import CheckpointAbortedError
from strata_redis.server import RedisServer
from strata_redis.storage.base import TMP_PREFIX

from .procs import join_all, kill9, spawn, wait_for

pytestmark = pytest.mark.both_backends  # conftest: on one redis-server and on a Redis Cluster

JOB = "ckpt-job"  # the job_id fixture's name for this module's job
MiB = 1024 * 1024

Factory = Callable[..., CheckpointManager]


@pytest.fixture
def manager(redis_url: str, job_id: str, tmp_path: Path) -> Iterator[Factory]:
    """CheckpointManagers on the test Redis, local storage in tmp_path by default; closed after."""
    made: list[CheckpointManager] = []

    def make(path: Any = None, **kwargs: Any) -> CheckpointManager:
        kwargs.setdefault("redis", redis_url)
        kwargs.setdefault("job_id", job_id)
        ckpt = CheckpointManager(tmp_path / "store" if path is None else path, **kwargs)
        made.append(ckpt)
        return ckpt

    yield make
    for ckpt in made:
        ckpt.close()


def step_path(root: Path, step: int, job: str, epoch: int | None = None) -> Path:
    label = f"step_{step}" if epoch is None else f"epoch_{epoch}_step_{step}"
    return root / job / "checkpoints" / label


def part(step: int, rank: int = 0, size: int = 4096) -> bytes:
    """Recognizable bytes for a (step, rank)."""
    return np.random.default_rng(step * 1000 + rank).bytes(size)


# -- the seeds' example, on both backends ------------------------------------------------------


def test_seed_example_local(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRATA_REDIS_URL", redis_url)
    monkeypatch.setenv("LOCAL_STORAGE_PATH", str(tmp_path))
    model_state_bytes = part(5000, size=100_000)
    with strata_redis.CheckpointManager(keep_count=5) as ckpt:  # storage and Redis from the env
        future = ckpt.save(model_state_bytes, step=5000, epoch=2)
        info = future.result(timeout=30)
        assert (info.step, info.epoch, info.nbytes) == (5000, 2, 100_000)
        latest = ckpt.latest()
        assert latest is not None and latest.step == 5000
        assert ckpt.load() == model_state_bytes
        assert [i.step for i in ckpt.list()] == [5000]
        assert ckpt.job_id == identity.job_id()  # the process's default job, as connect()'s
    step_dir = step_path(tmp_path, 5000, identity.job_id(), epoch=2)
    assert sorted(p.name for p in step_dir.iterdir()) == ["metadata.json", "model.bin"]


def test_seed_example_s3(redis_url: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    monkeypatch.setenv("STRATA_REDIS_URL", redis_url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    admin = boto3.session.Session().client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    admin.create_bucket(Bucket="my-bucket")
    model_state_bytes = part(5000, size=6 * MiB)  # above the 5 MiB multipart minimum
    with strata_redis.CheckpointManager(path="s3://my-bucket/models", keep_count=5) as ckpt:
        ckpt.save(model_state_bytes, step=5000, epoch=2).result(timeout=60)
        latest = ckpt.latest()
        assert latest is not None and latest.location.startswith("s3://my-bucket/models/")
        assert ckpt.load() == model_state_bytes
    keys = [o["Key"] for o in admin.list_objects_v2(Bucket="my-bucket")["Contents"]]
    job = identity.job_id()  # the process's default job
    assert sorted(keys) == [
        f"models/{job}/checkpoints/epoch_2_step_5000/metadata.json",
        f"models/{job}/checkpoints/epoch_2_step_5000/model.bin",
    ]
    admin.close()


def test_metadata_lists_sizes_and_checksums(manager: Factory, job_id: str, tmp_path: Path) -> None:
    ckpt = manager()
    parts = {"model.bin": part(1), "optim/adam.bin": part(2, size=10)}
    info = ckpt.save(parts, step=7, epoch=1).result(timeout=30)
    doc = orjson.loads((step_path(tmp_path / "store", 7, job_id, 1) / "metadata.json").read_bytes())
    assert doc["step"] == 7 and doc["epoch"] == 1 and doc["run"] == 0 and doc["world_size"] == 1
    assert doc["job_id"] == job_id and doc["workers"] == {"0": ckpt.worker_id}
    for name, data in parts.items():
        entry = doc["files"][name]
        assert entry["size"] == len(data)
        assert entry["checksum"] == f"crc32:{zlib.crc32(data):08x}"
        assert (step_path(tmp_path / "store", 7, job_id, 1) / name).read_bytes() == data
        assert ckpt.load(name=name) == data
    assert set(info.files) == set(parts)


# -- saving: snapshots, in-flight bound, records ----------------------------------------------


class GatedStorage(LocalStorage):
    """Local storage whose part writes wait for a gate (to hold saves in flight)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.writing = threading.Semaphore(0)

    def write(self, path: str, data: object) -> None:
        self.writing.release()
        assert self.gate.wait(30)
        super().write(path, data)


def test_save_returns_after_the_snapshot_and_later_changes_are_not_saved(
    manager: Factory, tmp_path: Path
) -> None:
    storage = GatedStorage(tmp_path / "gated")
    ckpt = manager(storage)
    buffer = np.frombuffer(bytearray(part(1)), dtype=np.uint8).copy()
    expected = buffer.tobytes()
    future = ckpt.save(buffer, step=1)
    assert storage.writing.acquire(timeout=10)  # the upload started, and is held
    assert not future.done() and future.phase == "uploading"
    buffer[:] = 0  # the training loop moves on and changes its buffer
    storage.gate.set()
    future.result(timeout=30)
    assert ckpt.load() == expected


def test_at_most_max_in_flight_saves_then_save_waits_for_room(
    manager: Factory, tmp_path: Path
) -> None:
    storage = GatedStorage(tmp_path / "gated")
    ckpt = manager(storage, max_in_flight=2)
    first = [ckpt.save(part(s), step=s) for s in (1, 2)]
    third: list[Any] = []
    thread = threading.Thread(target=lambda: third.append(ckpt.save(part(3), step=3)))
    thread.start()
    thread.join(0.5)
    assert thread.is_alive(), "a third save must wait while two are in flight"
    storage.gate.set()
    thread.join(10)
    assert not thread.is_alive()
    for future in [*first, *third]:
        future.result(timeout=30)
    assert [i.step for i in ckpt.list()] == [3, 2, 1]


def test_a_long_upload_is_logged_while_it_runs(
    manager: Factory, job_id: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = GatedStorage(tmp_path / "gated")
    ckpt = manager(storage, progress_interval=0.2)
    with caplog.at_level("INFO", logger="strata_redis.checkpoint"):
        future = ckpt.save(part(1), step=1)
        deadline = time.monotonic() + 10
        while "still uploading" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        storage.gate.set()
        future.result(timeout=30)
    assert f"checkpoint (step 1) of job '{job_id}' still uploading after" in caplog.text
    assert f"checkpoint (step 1) of job '{job_id}' committed: 1 files" in caplog.text


def test_every_save_is_recorded(manager: Factory) -> None:
    ckpt = manager()
    for step in (1, 2):
        ckpt.save(part(step, size=MiB), step=step).result(timeout=30)
    records = ckpt.records()
    assert [(r.step, r.rank, r.nbytes, r.outcome) for r in records] == [
        (1, 0, MiB, "uploaded"),
        (2, 0, MiB, "uploaded"),
    ]
    assert all(r.seconds > 0 and r.mb_s > 0 and r.worker_id == ckpt.worker_id for r in records)


def test_memory_stays_flat_over_200_saves_of_64_mib(manager: Factory, tmp_path: Path) -> None:
    # tmpfs when there is one: the test is about memory, not the disk's speed.
    shm = Path("/dev/shm")
    root = shm / f"strata-test-{os.getpid()}" if shm.is_dir() else tmp_path / "flat"
    try:
        ckpt = manager(root, keep_count=1, max_in_flight=2)
        state = np.zeros(64 * MiB, dtype=np.uint8)  # the training state, changed every step
        proc = psutil.Process()
        futures = []
        rss = []
        for step in range(1, 201):
            state[step] = step % 256
            futures.append(ckpt.save(state, step=step))
            if len(futures) > 4:
                futures.pop(0).result(timeout=60)
            if step in (20, 200):
                gc.collect()
                rss.append(proc.memory_info().rss)
        for future in futures:
            future.result(timeout=60)
        ckpt.wait(60)
        growth = rss[1] - rss[0]
        print(f"RSS at save 20: {rss[0] / MiB:.0f} MiB, at save 200: {rss[1] / MiB:.0f} MiB")
        assert growth < 48 * MiB, f"RSS grew {growth / MiB:.0f} MiB from save 20 to save 200"
        assert [i.step for i in ckpt.list()] == [200]
        assert ckpt.load()[:201] == state[:201].tobytes()
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


# -- all or nothing ------------------------------------------------------------------------------


def test_ranks_commit_together_with_exactly_one_leader(
    manager: Factory, job_id: str, tmp_path: Path
) -> None:
    ranks = [manager(world_size=3, rank=r, worker_id=f"w{r}") for r in range(3)]
    futures = [ranks[r].save(part(1, r), step=1, epoch=0) for r in (0, 1)]
    time.sleep(0.3)
    assert not any(f.done() for f in futures), "no commit before every rank acked"
    assert not (step_path(tmp_path / "store", 1, job_id) / "metadata.json").exists()
    futures.append(ranks[2].save(part(1, 2), step=1, epoch=0))
    infos = [f.result(timeout=30) for f in futures]
    assert infos[0] == infos[1] == infos[2]
    assert sorted(infos[0].files) == [f"rank_{r}/model.bin" for r in range(3)]
    assert infos[0].workers == {0: "w0", 1: "w1", 2: "w2"}
    for r in range(3):
        assert ranks[0].load(rank=r) == part(1, r)


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_failed_upload_aborts_the_step_and_the_others_are_told_at_once(
    backend: str, manager: Factory, job_id: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    good = manager(world_size=2, rank=0, worker_id="good", commit_timeout=120)
    if backend == "local":
        (tmp_path / "a-file").write_bytes(b"")
        refusing: Any = LocalStorage(tmp_path / "a-file" / "root")  # a file where a dir must be
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        refusing = S3Storage("no-such-bucket", endpoint_url=endpoint, max_attempts=1)
    bad = manager(refusing, world_size=2, rank=1, worker_id="bad")
    waiting = good.save(part(1), step=1)
    wait_for(lambda: waiting.phase == "waiting", 30)  # the good rank acked and waits
    start = time.monotonic()
    failing = bad.save(part(1, 1), step=1)
    with pytest.raises(CheckpointAbortedError, match="worker 'bad'") as caught:
        failing.result(timeout=30)
    assert isinstance(caught.value.__cause__, StorageError)
    with pytest.raises(
        CheckpointAbortedError, match=r"checkpoint \(step 1\) .*aborted by worker 'bad'"
    ):
        waiting.result(timeout=30)
    assert time.monotonic() - start < 10, "the waiting rank must not wait for its timeout"
    assert good.list() == [] and good.latest() is None
    assert not (step_path(tmp_path / "store", 1, job_id) / "metadata.json").exists()
    with pytest.raises(CheckpointNotFoundError):
        good.load()
    assert [r.outcome for r in good.records()] == ["uploaded", "aborted"]


class LostMetadataReply(LocalStorage):
    """Local storage whose metadata.json write lands but reports a failure (a lost reply),
    and whose read of it fails too (the storage unreachable a moment)."""

    def write_if_absent(self, path: str, data: object) -> None:
        super().write_if_absent(path, data)
        if path.endswith("/metadata.json"):
            raise StorageError("the reply was lost (fake)", backend=self.describe(), path=path)

    def read(self, path: str) -> bytes:
        if path.endswith("/metadata.json"):
            raise StorageError("unreachable (fake)", backend=self.describe(), path=path)
        return super().read(path)


def test_a_leader_that_cannot_tell_whether_its_metadata_landed_does_not_abort(
    manager: Factory, job_id: str, tmp_path: Path
) -> None:
    # the leader's metadata.json landed though its write failed, and reading it back failed:
    # aborting then would report aborted a step that is visible in storage; it is left
    # committing, and the other rank's takeover commits it
    waiting = manager(world_size=2, rank=0, worker_id="waits", commit_timeout=3)
    leader = manager(LostMetadataReply(tmp_path / "store"), world_size=2, rank=1,
                     worker_id="leads")  # fmt: skip
    first = waiting.save(part(1), step=1)
    wait_for(lambda: first.phase == "waiting", 30)
    led = leader.save(part(1, 1), step=1)  # the last ack: this rank leads
    with pytest.raises(CheckpointError, match="may have landed") as caught:
        led.result(timeout=30)
    assert not isinstance(caught.value, CheckpointAbortedError)
    info = first.result(timeout=30)  # taken over at the waiting rank's timeout: committed
    assert info.step == 1 and [i.step for i in waiting.list()] == [1]
    assert waiting.load(rank=1) == part(1, 1)


def test_a_rank_that_never_acks_times_out_and_aborts(manager: Factory) -> None:
    ckpt = manager(world_size=2, rank=0, commit_timeout=1.5)
    start = time.monotonic()
    with pytest.raises(CheckpointAbortedError, match="timed out waiting for 1 of 2 acks"):
        ckpt.save(part(1), step=1).result(timeout=30)
    assert 1.0 < time.monotonic() - start < 10
    assert ckpt.list() == []


def test_a_registered_rank_declared_failed_aborts_the_step(
    manager: Factory, job: strata_redis.Job
) -> None:
    # rank 1 registers, begins its upload, and dies (no more heartbeats) before acking
    dead = job.register_worker("dead-rank", heartbeat_interval=None)
    assert dead.incarnation >= 1
    lost = manager(world_size=2, rank=1, worker_id="dead-rank", job_id=job.job_id)
    lost.protocol.begin(CheckpointId(1))
    ckpt = manager(world_size=2, rank=0, job_id=job.job_id, commit_timeout=120)
    future = ckpt.save(part(1), step=1)
    deadline = time.monotonic() + 10
    while not job.reap() and time.monotonic() < deadline:
        time.sleep(0.2)
    with pytest.raises(CheckpointAbortedError, match=r"dead-rank.*no longer live"):
        future.result(timeout=10)


# -- crashes: a worker killed mid-upload ---------------------------------------------------------


def save_then_die_mid_upload(url: str, job_id: str, root: str, big_mb: int) -> None:
    """Commit step 1, then save step 2 with a big second part (the parent kills us in it)."""
    ckpt = CheckpointManager(root, keep_count=5, redis=url, job_id=job_id, worker_id="doomed")
    ckpt.save(part(1), step=1).result(timeout=60)
    ckpt.save({"model.bin": part(2), "optim.bin": bytes(big_mb * MiB)}, step=2).result()


def test_worker_killed_mid_upload_never_shows_its_step(
    manager: Factory, redis_url: str, job_id: str, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    proc = spawn(save_then_die_mid_upload, redis_url, job_id, str(root), 512)
    step2 = step_path(root, 2, job_id)
    deadline = time.monotonic() + 60
    # model.bin (small) is in place and optim.bin (512 MiB) is being written
    while not (
        (step2 / "model.bin").exists()
        and any(p.name.startswith(TMP_PREFIX) for p in step2.iterdir())
    ):
        assert time.monotonic() < deadline and proc.is_alive(), "the upload never started"
        time.sleep(0.001)
    kill9(proc)  # in the middle of writing optim.bin
    assert (step2 / "model.bin").exists(), "the first part landed: a partial step"
    assert not (step2 / "metadata.json").exists()

    ckpt = manager(keep_count=5)
    latest = ckpt.latest()
    assert latest is not None and latest.step == 1
    assert ckpt.load() == part(1)
    assert [i.step for i in ckpt.list()] == [1]
    # step 2 has no metadata.json: it is not a committed checkpoint a load could find
    with pytest.raises(CheckpointNotFoundError, match=r"in checkpoint \(step 2\) of job"):
        ckpt.load(step=2)

    ckpt.save(part(3), step=3).result(timeout=30)  # the next commit cleans up
    ckpt.wait(30)
    assert not step2.exists(), f"leftovers remain: {list(step2.rglob('*'))}"
    assert [i.step for i in ckpt.list()] == [3, 1]
    assert ckpt.load(step=1) == part(1)


# -- reading: corruption, lost metadata ----------------------------------------------------------


def test_corrupt_byte_is_skipped_for_the_previous_valid_step(
    manager: Factory, job_id: str, tmp_path: Path
) -> None:
    ckpt = manager()
    for step in (1, 2):
        ckpt.save(part(step), step=step).result(timeout=30)
    model = step_path(tmp_path / "store", 2, job_id) / "model.bin"
    raw = bytearray(model.read_bytes())
    raw[1234] ^= 0x01
    model.write_bytes(bytes(raw))
    with pytest.warns(CheckpointSkippedWarning, match=r"step_2 skipped: model.bin: checksum"):
        loaded = ckpt.load_checkpoint()
    assert (loaded.step, loaded.data) == (1, part(1))
    with pytest.raises(CheckpointError, match=r"checkpoint \(step 2\) of job .*does not verify"):
        ckpt.verify(2)
    # and when no step is valid: a clear error, never bad bytes
    (step_path(tmp_path / "store", 1, job_id) / "model.bin").write_bytes(part(1)[:-1])
    with (
        pytest.warns(CheckpointSkippedWarning, match="step_1 skipped: model.bin: 4095 bytes"),
        pytest.warns(CheckpointSkippedWarning, match="step_2 skipped"),
        pytest.raises(CheckpointNotFoundError, match=r"no valid checkpoint of part 'model\.bin'"),
    ):
        ckpt.load()


def test_partial_and_half_deleted_steps_are_skipped(
    manager: Factory, job_id: str, tmp_path: Path
) -> None:
    ckpt = manager()
    for step in (1, 2, 3):
        ckpt.save(part(step), step=step).result(timeout=30)
    root = tmp_path / "store"
    (step_path(root, 3, job_id) / "metadata.json").unlink()  # as retention leaves it half-way
    (step_path(root, 2, job_id) / "model.bin").unlink()
    with pytest.warns(CheckpointSkippedWarning) as caught:
        assert ckpt.load() == part(1)
        latest = ckpt.latest()
    assert latest is not None and latest.step == 1
    messages = " ".join(str(w.message) for w in caught)
    assert "step_3 skipped" in messages and "step_2 skipped" in messages


def test_redis_losing_its_metadata_loads_from_storage_alone(
    manager: Factory, job_id: str, raw: redis.Redis
) -> None:
    ckpt = manager(keep_count=5)
    for step in (1, 2, 3):
        ckpt.save(part(step), step=step).result(timeout=30)
    raw.flushall()
    assert ckpt.load() == part(3)  # from storage: Redis has no index
    fresh = manager(keep_count=5)
    assert [i.step for i in fresh.list()] == [3, 2, 1]  # index rebuilt from metadata.json
    assert raw.zrange(f"strata:{{{job_id}}}:checkpoints", 0, -1) == [
        f"0000000000000000:-:{s:016d}" for s in (1, 2, 3)
    ]
    fresh.save(part(4), step=4).result(timeout=30)
    with pytest.raises(ValueError, match="checkpoints must go forward"):
        fresh.save(part(3), step=3)
    raw.delete(f"strata:{{{job_id}}}:checkpoints")  # a partial loss: the marker survived
    assert fresh.load() == part(4)
    assert fresh.rebuild_index() == [CheckpointId(s) for s in (4, 3, 2, 1)]


@pytest.mark.single_only("kills and restarts its own redis-server (redis_factory)")
def test_redis_killed_with_aof_keeps_every_committed_checkpoint(
    redis_factory: Callable[..., RedisServer], tmp_path: Path
) -> None:
    server = redis_factory(aof=True)
    ckpt = CheckpointManager(tmp_path / "store", keep_count=10, redis=server.url, job_id=JOB)
    try:
        for step in range(1, 6):
            ckpt.save(part(step), step=step).result(timeout=30)
        before = ckpt.list()
        server.restart(kill=True)  # kill -9, then start on the same port and AOF
        assert ckpt.list() == before
        assert ckpt.load() == part(5)
        assert ckpt.save(part(6), step=6).result(timeout=30).step == 6
        assert [i.step for i in ckpt.list()] == [6, 5, 4, 3, 2, 1]
    finally:
        ckpt.close()


# -- retention -----------------------------------------------------------------------------------


def test_retention_keeps_the_newest_and_touches_only_this_job(
    manager: Factory, job_id: str, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    other = LocalStorage(root)
    other.write("other-job/checkpoints/step_1/model.bin", b"theirs")
    other.write("other-job/checkpoints/step_1/metadata.json", b"{}")
    other.write(f"{job_id}/notes.txt", b"mine, not a step")
    other.write(f"{job_id}/checkpoints/step_x/model.bin", b"not a step either")
    ckpt = manager(keep_count=2)
    for step in range(1, 6):
        ckpt.save(part(step), step=step).result(timeout=30)
    ckpt.wait(30)
    steps = sorted(p.name for p in (root / job_id / "checkpoints").iterdir())
    assert steps == ["step_4", "step_5", "step_x"]
    assert [i.step for i in ckpt.list()] == [5, 4]
    assert other.read("other-job/checkpoints/step_1/model.bin") == b"theirs"
    assert other.read(f"{job_id}/notes.txt") == b"mine, not a step"
    one = manager(keep_count=1, job_id="solo")
    one.save(part(1), step=1).result(timeout=30)
    one.wait(30)
    assert [i.step for i in one.list()] == [1], "the newest committed step is never deleted"


def test_retention_keeps_a_checkpoint_committed_after_its_listing(
    manager: Factory, job_id: str, tmp_path: Path
) -> None:
    # the pass listed step 1 before its leader wrote metadata.json; by the time it asks Redis,
    # step 1 is committed (not "committing"): it is no leftover. (CI under load: a four-rank
    # retention test found a kept checkpoint's part deleted this way.)
    ckpt = manager(keep_count=3)
    for step in (1, 2):
        ckpt.save(part(step), step=step).result(timeout=30)
    ckpt.wait(30)
    root = tmp_path / "store" / job_id / "checkpoints"
    (root / "step_1" / "metadata.json").unlink()  # as the listing saw it
    report = ckpt.prune()
    assert report.leftovers == [], "a committed checkpoint was deleted as a leftover"
    assert (root / "step_1" / "model.bin").exists()


def rank_saver(url: str, job_id: str, root: str, rank: int, steps: int) -> None:
    """One of 4 ranks: save its part of every step, overlapping saves, then close."""
    ckpt = CheckpointManager(
        root, keep_count=3, redis=url, job_id=job_id, worker_id=f"rank-{rank}", rank=rank,
        world_size=4, commit_timeout=60,
    )  # fmt: skip
    futures = [ckpt.save(part(s, rank), step=s, epoch=s // 5) for s in range(1, steps + 1)]
    for future in futures:
        future.result(timeout=60)
    ckpt.close()


def test_four_processes_twenty_steps_keep_the_three_newest(
    manager: Factory, redis_url: str, job_id: str, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    procs = [spawn(rank_saver, redis_url, job_id, str(root), rank, 20) for rank in range(4)]
    assert join_all(procs, timeout=120) == [0, 0, 0, 0]
    reader = manager()
    reader.prune()  # every rank closed after its last retention pass; this one must be idle
    assert sorted(p.name for p in (root / job_id / "checkpoints").iterdir()) == [
        "epoch_3_step_18", "epoch_3_step_19", "epoch_4_step_20",
    ]  # fmt: skip
    assert [i.step for i in reader.list()] == [20, 19, 18]
    for step in (18, 19, 20):
        info = reader.verify(step)
        assert info.world_size == 4 and info.epoch == step // 5
        assert sorted(info.files) == [f"rank_{r}/model.bin" for r in range(4)]
        for rank in range(4):
            assert reader.load(step=step, rank=rank) == part(step, rank)
    assert len([r for r in reader.records(1000) if r.outcome == "uploaded"]) == 80


# -- bad input -----------------------------------------------------------------------------------


def test_bad_input_is_refused_clearly(manager: Factory, job_id: str, tmp_path: Path) -> None:
    ckpt = manager()
    ok = part(1)
    cases: list[tuple[Callable[[], Any], type[Exception], str]] = [
        (lambda: ckpt.save(ok, step=-1), ValueError, "step must be between 0 and"),
        (lambda: ckpt.save(ok, step=2**60), ValueError, "step must be between 0 and"),
        (lambda: ckpt.save(ok, step=True), TypeError, "step must be an int, got bool"),
        (lambda: ckpt.save(ok, step=1.5), TypeError, "step must be an int, got float"),
        (lambda: ckpt.save(ok, step="1"), TypeError, "step must be an int, got str"),
        (lambda: ckpt.save(ok, step=1, epoch=-2), ValueError, "epoch must be between"),
        (lambda: ckpt.save(b"", step=1), ValueError, "data must not be empty"),
        (lambda: ckpt.save("text", step=1), TypeError, "data must be a bytes-like object"),
        (lambda: ckpt.save([1, 2], step=1), TypeError, "data must be a bytes-like object"),
        (lambda: ckpt.save(None, step=1), TypeError, "data must be a bytes-like object"),
        (lambda: ckpt.save({}, step=1), ValueError, "data must not be an empty mapping"),
        (lambda: ckpt.save({"a.bin": b""}, step=1), ValueError, r"data\['a.bin'\] must not be"),
        (lambda: ckpt.save(np.zeros((4, 4))[:, 0], step=1), ValueError, "C-contiguous"),
        (lambda: ckpt.save(ok, step=1, name="metadata.json"), ValueError, "reserved"),
        (lambda: ckpt.save(ok, step=1, name="../up.bin"), ValueError, "name '../up.bin'"),
        (lambda: ckpt.save(ok, step=1, name="rank_0/x"), ValueError, "rank_<N>"),
        (lambda: ckpt.save(ok, step=1, name=3), TypeError, "name must be a str"),
        (lambda: ckpt.save(ok, step=1, copy="no"), TypeError, "copy must be a bool"),
        (lambda: ckpt.load(name="nope.bin"), CheckpointNotFoundError, "no valid checkpoint"),
        (lambda: ckpt.load(step=-3), ValueError, "step must be between"),
        (lambda: CheckpointManager(tmp_path, keep_count=0), ValueError, "keep_count must be"),
        (lambda: CheckpointManager(tmp_path, world_size=2), ValueError, "rank must be given"),
        (lambda: CheckpointManager(tmp_path, world_size=2, rank=2), ValueError, "rank must be"),
        (lambda: CheckpointManager(tmp_path, job_id="a/b"), ValueError, "job_id must not"),
        (lambda: CheckpointManager(tmp_path, job_id=".."), ValueError, "job_id"),
        (lambda: CheckpointManager(tmp_path, max_in_flight=0), ValueError, "max_in_flight"),
        (lambda: CheckpointManager("ftp://x/y"), ValueError, "unsupported scheme 'ftp'"),
    ]
    for call, exc_type, match in cases:
        with pytest.raises(exc_type, match=match):
            call()
    ckpt.save(ok, step=5).result(timeout=30)
    with pytest.raises(
        ValueError,
        match=r"must go forward: got \(step 5\), but this manager already saved \(step 5\)",
    ):
        ckpt.save(ok, step=5)
    with pytest.raises(ValueError, match=r"must go forward: got \(step 4\)"):
        ckpt.save(ok, step=4)
    with pytest.raises(ValueError, match=r"'nope.bin' is not a part .* parts: \['model.bin'\]"):
        ckpt.load(name="nope.bin")
    other = manager(worker_id="another")  # another manager of the same job
    with pytest.raises(ValueError, match=rf"job '{job_id}' already committed \(step 5\)"):
        other.save(ok, step=3)
    assert ckpt.load() == ok and [i.step for i in ckpt.list()] == [5], "nothing corrupted"
    ckpt.close()
    with pytest.raises(RuntimeError, match="closed"):
        ckpt.save(ok, step=6)


def test_a_stale_rank_cannot_reuse_a_committed_or_aborted_step(manager: Factory) -> None:
    first = manager(worker_id="w-a")
    first.save(part(1), step=1).result(timeout=30)
    stale = manager(worker_id="w-b")
    stale._indexed = True  # as if it had read the index long ago
    with pytest.raises(ValueError, match=r"already committed \(step 1\)"):
        stale.save(part(1), step=1)
    with pytest.raises(CheckpointError, match="already committed"):
        stale.protocol.begin(CheckpointId(1))
    with pytest.raises(
        CheckpointError, match=r"not after the newest committed checkpoint \(step 1\)"
    ):
        stale.protocol.begin(CheckpointId(0))

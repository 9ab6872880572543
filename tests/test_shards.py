"""strata_redis.shards: datasets as webdataset tars in storage (local and the S3 stand-in),
written, indexed in place, registered and read by lease; bad input gets its error."""

from __future__ import annotations

import io
import multiprocessing
import os
import re
import tarfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest

import strata_redis
from strata_redis.errors import (
    ShardChecksumError,
    ShardFormatError,
    ShardManifestError,
    StorageError,
    StorageNotFoundError,
)
from strata_redis.shards import (
    ShardReader,
    ShardWriter,
    index_tar_shards,
    read_manifest,
    register_shards,
)
from strata_redis.shards.index import (
    binary_index_path,
    index_pack_path,
    index_path,
    read_index,
    read_pack,
    shard_name,
    shard_path,
)
from strata_redis.storage import LocalStorage, S3Storage, Storage

from .procs import kill9
from .shardstores import Counting, Outage, sample_bytes, sample_id

DATASET = "ds"


@pytest.fixture
def s3(s3_endpoint: str) -> Iterator[S3Storage]:
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="shards")
    client.close()
    with S3Storage("shards", endpoint_url=s3_endpoint, prefix="data", max_attempts=2) as storage:
        yield storage


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return LocalStorage(tmp_path / "root")
    return request.getfixturevalue("s3")  # type: ignore[no-any-return]


@pytest.fixture
def local(tmp_path: Path) -> Counting:
    return Counting(LocalStorage(tmp_path / "root"))


def _write(storage: Storage, total: int = 95, per: int = 10) -> None:
    with ShardWriter(storage, DATASET, samples_per_shard=per) as writer:
        for i in range(total):
            writer.write(sample_bytes(i))


def _orchestrator(url: str, job_id: str, tmp: Path, **kwargs: Any) -> Any:
    return strata_redis.TrainingOrchestrator(
        coordinator_url=url, worker_id=kwargs.pop("worker_id", "w0"), job_id=job_id,
        checkpoint_path=tmp / "ckpt", last_call=0.1, heartbeat_timeout=3.0, **kwargs,
    )  # fmt: skip


def _register(url: str, job_id: str, storage: Storage) -> strata_redis.DatasetParams:
    manager = strata_redis.ShardManager(url, job_id=job_id)
    try:
        return register_shards(manager, storage, DATASET)
    finally:
        manager.job.close()


def _epoch(reader: ShardReader) -> Counter[int]:
    seen: Counter[int] = Counter()
    for batch in reader.batches():
        for sample in batch:
            assert sample_id(sample["bin"]) == sample["__id__"], sample
            assert sample["__key__"] == f"{sample['__id__']:09d}"
            seen[sample["__id__"]] += 1
    return seen


# -- writing ---------------------------------------------------------------------------------------
def test_the_writer_makes_webdataset_tars_indexed_and_a_manifest(storage: Storage) -> None:
    with ShardWriter(storage, DATASET, samples_per_shard=4) as writer:
        for i in range(10):
            writer.write({"__key__": f"s/{i:03d}", "txt": f"sample {i}", "npy": np.arange(i)})
    shards = writer.shard_set
    assert (shards.total, shards.num_shards, shards.samples_per_shard) == (10, 3, 4)
    manifest = read_manifest(storage, DATASET)
    assert [(s.name, s.count) for s in manifest.shards] == [
        ("shard-000000.tar", 4), ("shard-000001.tar", 4), ("shard-000002.tar", 2)
    ]  # fmt: skip
    data = storage.read(shard_path(DATASET, "shard-000001.tar"))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:  # any tar reader reads it
        assert tar.getnames()[:2] == ["s/004.txt", "s/004.npy"]
        assert tar.extractfile("s/005.txt").read() == b"sample 5"  # type: ignore[union-attr]
    import orjson

    index = orjson.loads(storage.read(index_path(DATASET, "shard-000001.tar")))
    start, size = index["offsets"][1], index["sizes"][1]
    # a sample's span is a small tar of its own: exactly its members
    with tarfile.open(fileobj=io.BytesIO(data[start : start + size] + bytes(1024))) as part:
        assert part.getnames() == ["s/005.txt", "s/005.npy"]
        assert part.extractfile("s/005.npy").read() == np.arange(5).tobytes()  # type: ignore[union-attr]
    assert (
        storage.read_range(shard_path(DATASET, "shard-000001.tar"), start, size)
        == (data[start : start + size])
    )


def test_the_writer_refuses_bad_samples(tmp_path: Path) -> None:
    writer = ShardWriter(LocalStorage(tmp_path), DATASET, samples_per_shard=2)
    with pytest.raises(TypeError, match="sample must be bytes or a mapping"):
        writer.write(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"no '\.' in its last name"):
        writer.write({"__key__": "a.b", "bin": b"x"})
    with pytest.raises(ValueError, match="has no field"):
        writer.write({"__key__": "a"})
    with pytest.raises(ValueError, match="no sample was written"):
        writer.close()


# -- existing tars, indexed in place ---------------------------------------------------------------
def _webdataset_tar(first: int, count: int, *, long_names: bool = False) -> bytes:
    """A tar as ``webdataset.TarWriter`` (Python's tarfile, pax format) writes one."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(first, first + count):
            key = ("d" * 120 + "/" if long_names else "") + f"{i:09d}"
            for field, data in (("bin", sample_bytes(i)), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{key}.{field}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()  # (padded to tarfile's 10 KiB records: bytes past the end marker)


@pytest.mark.parametrize("checksums", [False, True])
def test_existing_tars_are_indexed_in_place(
    storage: Storage, redis_url: str, job_id: str, tmp_path: Path, checksums: bool
) -> None:
    tars = {f"part-{n:02d}.tar": _webdataset_tar(n * 7, 7 if n < 4 else 3, long_names=n == 1)
            for n in range(5)}  # fmt: skip
    for name, data in tars.items():
        storage.write(shard_path(DATASET, name), data)
    counting = Counting(storage)
    manifest = index_tar_shards(counting, DATASET, checksums=checksums)
    assert [s.count for s in manifest.shards] == [7, 7, 7, 7, 3]
    assert sorted(storage.list(f"{DATASET}/shards/")) == sorted(
        [shard_path(DATASET, n) for n in tars] + [index_path(DATASET, n) for n in tars]
        + [binary_index_path(DATASET, n) for n in tars] + [f"{DATASET}/shards/index.json"]
        + [index_pack_path(DATASET)]
    )  # fmt: skip
    if not checksums:  # headers only: ranged reads, never the whole object
        assert not counting.reads and counting.ranged
        assert all(s.checksum == "" for s in manifest.shards)
    params = _register(redis_url, job_id, storage)
    assert (params.total_samples, params.samples_per_shard) == (31, 7)
    with _orchestrator(redis_url, job_id, tmp_path) as orch, ShardReader(
        orch, DATASET, storage, batch_size=3
    ) as reader:  # fmt: skip
        seen: Counter[int] = Counter()
        for batch in reader.batches():
            for sample in batch:
                i = sample["__id__"]
                assert sample["bin"] == sample_bytes(i) and sample["cls"] == str(i).encode()
                assert sample["__key__"].endswith(f"{i:09d}")
                seen[i] += 1
    assert seen == Counter(range(31))


def test_unequal_shards_are_refused_but_a_shorter_last_one(tmp_path: Path) -> None:
    """The lease unit is one shard of ``samples_per_shard`` ids: shards of unequal counts
    (but the last) have no such mapping, and are refused rather than padded."""
    storage = LocalStorage(tmp_path)
    for n, count in enumerate([5, 4, 5]):
        storage.write(shard_path(DATASET, f"p{n}.tar"), _webdataset_tar(n * 5, count))
    with pytest.raises(ShardManifestError, match=r"'p1.tar' holds 4 samples where every shard"):
        index_tar_shards(storage, DATASET)
    storage.write(shard_path(DATASET, "p1.tar"), _webdataset_tar(5, 5))
    assert index_tar_shards(storage, DATASET).total == 15


def test_a_tar_cut_short_is_refused_when_indexed(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    data = _webdataset_tar(0, 5)
    storage.write(shard_path(DATASET, "p0.tar"), data[:2000])
    with pytest.raises(ShardFormatError, match=r"p0.tar'.*(truncated|ends)"):
        index_tar_shards(storage, DATASET)


# -- registering -----------------------------------------------------------------------------------
def test_register_refuses_a_manifest_the_storage_does_not_match(
    local: Counting, redis_url: str, job_id: str
) -> None:
    _write(local, total=40, per=10)
    params = _register(redis_url, job_id, local)
    assert (params.total_samples, params.samples_per_shard, params.num_shards) == (40, 10, 4)
    local.delete(shard_path(DATASET, "shard-000002.tar"))
    with pytest.raises(ShardManifestError, match=r"lists 4 shards but 1 objects it names are not"):
        _register(redis_url, job_id, local)
    local.write(shard_path(DATASET, "shard-000002.tar"), b"x")
    local.write(shard_path(DATASET, "stray.tar"), b"x")
    with pytest.raises(ShardManifestError, match=r"1 tars in storage are not in it \(\['stray"):
        _register(redis_url, job_id, local)
    with pytest.raises(StorageNotFoundError, match=r"index\.json"):
        _register(redis_url, job_id, Counting(LocalStorage(local.inner.root + "-none")))  # type: ignore[attr-defined]


def test_a_dataset_registered_with_other_counts_is_refused(
    local: Counting, redis_url: str, job_id: str, tmp_path: Path
) -> None:
    _write(local, total=95, per=10)
    strata_redis.ShardManager(redis_url, job_id=job_id).register_dataset_params(DATASET, 95, 8)
    with _orchestrator(redis_url, job_id, tmp_path) as orch, pytest.raises(
        ShardManifestError, match=r"registered with 95 samples in shards of 8 \(12 shards\), but"
    ):  # fmt: skip
        ShardReader(orch, DATASET, local)


# -- reading by lease ------------------------------------------------------------------------------
def test_a_plain_loop_reads_every_sample_once_per_epoch_prefetching_within_its_bound(
    storage: Storage, redis_url: str, job_id: str, tmp_path: Path
) -> None:
    _write(storage)
    params = _register(redis_url, job_id, storage)
    with _orchestrator(redis_url, job_id, tmp_path) as orch:
        reader = ShardReader(orch, DATASET, storage, batch_size=4, prefetch=2)
        for _ in range(orch.epoch, 2):
            assert _epoch(reader) == Counter(range(params.total_samples))
            orch.advance_epoch()
        stats = reader.stats()
        reader.close()
    assert stats["fetched_shards"] == 2 * params.num_shards
    assert stats["prefetch_hits"] > 0, stats  # the background fetch ran ahead of the loop
    assert stats["max_ahead_shards"] <= 2, stats  # the stated bound
    assert stats["held_shards"] == 0 and stats["held_bytes"] == 0, stats  # all released


def test_a_walk_broken_off_leaves_nothing_held_once_the_next_walk_ends(
    local: Counting, redis_url: str, job_id: str, tmp_path: Path
) -> None:
    _write(local)
    _register(redis_url, job_id, local)
    with _orchestrator(redis_url, job_id, tmp_path) as orch:
        reader = ShardReader(orch, DATASET, local, batch_size=4, prefetch=2)
        for _ in reader.batches():
            break  # one batch handed out and never consumed: the loop broke off
        _epoch(reader)  # the next walk runs to the epoch's end
        stats = reader.stats()
        reader.close()
    # the broken walk's item is forgotten with it (counted against this walk's shards, the
    # last shard's copy was never released)
    assert stats["held_shards"] == 0 and stats["held_bytes"] == 0, stats


def test_a_cache_dir_keeps_shards_within_its_size_limit(
    local: Counting, redis_url: str, job_id: str, tmp_path: Path
) -> None:
    _write(local)
    shard_bytes = read_manifest(local, DATASET).shards[0].size
    _register(redis_url, job_id, local)
    cache = tmp_path / "cache"
    with _orchestrator(redis_url, job_id, tmp_path) as orch:
        reader = ShardReader(orch, DATASET, local, batch_size=4, cache_dir=cache,
                             cache_bytes=3 * shard_bytes)  # fmt: skip
        for _ in range(orch.epoch, 2):
            assert _epoch(reader) == Counter(range(95))
            cached = [f for f in (cache / DATASET).iterdir() if not f.name.startswith(".")]
            assert sum(f.stat().st_size for f in cached) <= 3 * shard_bytes
            orch.advance_epoch()
        reader.close()
    stats = reader.stats()
    assert stats["evicted"] > 0 and stats["cached_bytes"] <= 3 * shard_bytes, stats
    # a second run on the same cache reads what it holds from disk, not from storage
    with _orchestrator(redis_url, job_id, tmp_path) as orch:
        local.reads.clear()
        reader = ShardReader(orch, DATASET, local, batch_size=4, cache_dir=cache)
        assert _epoch(reader) == Counter(range(95))
        reader.close()
    assert reader.stats()["cache_hits"] == 3
    assert sum(n for p, n in local.reads.items() if p.endswith(".tar")) == 10 - 3


def test_a_resume_mid_shard_reads_no_done_shard_and_the_rest_by_range(
    local: Counting, redis_url: str, job_id: str, tmp_path: Path
) -> None:
    """Resuming costs the same whatever was done before: no done shard is read again, a
    shard done part-way is read by ranges (only what is left), and every sample comes once
    relative to the checkpoint."""
    _write(local, total=200, per=10)
    _register(redis_url, job_id, local)
    trained: list[int] = []
    with _orchestrator(redis_url, job_id, tmp_path,
                       state_provider=lambda: np.asarray(trained).tobytes()) as orch:  # fmt: skip
        reader = ShardReader(orch, DATASET, local, batch_size=4)
        for step, batch in enumerate(reader.batches(), 1):
            trained.extend(s["__id__"] for s in batch)
            if step == 23:  # 7 shards (3 batches each) and 2 batches of the 8th
                orch.save_checkpoint(step=step, epoch=0)
                orch.wait_for_checkpoints(30)
                break
        reader.close()
    done_shards = {i // 10 for i in trained} - {trained[-1] // 10}
    assert len(done_shards) == 7
    local.reads.clear()
    local.ranged.clear()
    with _orchestrator(redis_url, job_id, tmp_path) as orch:
        assert orch.resumed is not None
        reader = ShardReader(orch, DATASET, local, batch_size=4)
        after = _epoch(reader)
        stats = reader.stats()
        reader.close()
    assert Counter(trained) + after == Counter(range(200))
    read = {p for p in [*local.reads, *local.ranged] if p.endswith(".tar")}
    assert not read & {shard_path(DATASET, f"shard-{s:06d}.tar") for s in done_shards}
    partial = shard_path(DATASET, f"shard-{trained[-1] // 10:06d}.tar")
    assert local.ranged[partial] >= 1 and local.reads[partial] == 0
    assert stats["partial_shards"] == 1 and stats["fetched_shards"] == 20 - 7


# -- bad input -------------------------------------------------------------------------------------
def _read_all(url: str, job: str, tmp: Path, storage: Storage, **kwargs: Any) -> Counter[int]:
    with (
        _orchestrator(url, job, tmp) as orch,
        ShardReader(orch, DATASET, storage, batch_size=4, **kwargs) as reader,
    ):
        return _epoch(reader)


def test_a_shard_whose_checksum_does_not_match_is_named_not_done_and_not_retried(
    storage: Storage, redis_url: str, job_id: str, tmp_path: Path
) -> None:
    _write(storage, total=30, per=10)
    _register(redis_url, job_id, storage)
    path = shard_path(DATASET, "shard-000001.tar")
    data = bytearray(storage.read(path))
    data[600] ^= 0xFF  # a flipped bit in a sample's bytes: the same size
    storage.write(path, bytes(data))
    start = time.monotonic()
    with pytest.raises(
        ShardChecksumError, match=re.escape(f"{path!r}: its bytes' checksum")
    ) as info:
        _read_all(redis_url, job_id, tmp_path, storage, prefetch=0)
    assert time.monotonic() - start < 30  # (not retried forever: raised, not waited on)
    assert info.value.path == path and info.value.dataset == DATASET
    with strata_redis.connect(redis_url, job_id) as job:
        assert 1 not in job.leases(DATASET, 0, "reader").completions()


def test_a_missing_shard_object_is_the_storages_not_found(
    local: Counting, redis_url: str, job_id: str, tmp_path: Path
) -> None:
    _write(local, total=30, per=10)
    _register(redis_url, job_id, local)
    local.delete(shard_path(DATASET, "shard-000002.tar"))
    with pytest.raises(StorageNotFoundError, match=r"no object at 'ds/shards/shard-000002.tar'"):
        _read_all(redis_url, job_id, tmp_path, local)


def test_a_truncated_shard_is_refused_naming_it(
    storage: Storage, redis_url: str, job_id: str, tmp_path: Path
) -> None:
    _write(storage, total=30, per=10)
    _register(redis_url, job_id, storage)
    path = shard_path(DATASET, "shard-000000.tar")
    storage.write(path, storage.read(path)[:3000])
    with pytest.raises(ShardFormatError, match=re.escape(f"{path!r}: truncated: 3000 bytes")):
        _read_all(redis_url, job_id, tmp_path, storage)


def _fetch_then_wait(endpoint: str, out: str, end: str) -> None:
    """A training process's fetcher of the S3 dataset: one shard copied by a helper process,
    its local file's path and the helpers' pids written to ``out``; then it waits, to be
    killed (``end`` "kill -9"), or returns without closing the fetcher ("exit")."""
    import psutil

    from strata_redis.shards import ShardFetcher
    from strata_redis.shards.index import read_manifest

    storage = S3Storage("shards", endpoint_url=endpoint, prefix="data")
    fetcher = ShardFetcher(storage, read_manifest(storage, DATASET), prefetch=0, processes=2)
    deadline = time.monotonic() + 60
    while fetcher.stats()["helper_copies"] == 0 and time.monotonic() < deadline:
        fetched = fetcher.demand(3).result(timeout=60)  # (in a thread until the helpers start)
        fetcher.release(3)
        time.sleep(0.2)
    fetched = fetcher.demand(3).result(timeout=60)
    helpers = [p.pid for p in psutil.Process().children()]
    with open(out + ".tmp", "w") as file:
        file.write(
            f"{fetcher.stats()['helper_copies']} {fetched.path} {' '.join(map(str, helpers))}"
        )
    os.replace(out + ".tmp", out)
    if end == "kill -9":
        time.sleep(600)


@pytest.mark.parametrize("end", ["kill -9", "exit"])
def test_helper_processes_copy_s3_shards_and_end_with_the_training_process(
    s3: S3Storage, s3_endpoint: str, tmp_path: Path, request: pytest.FixtureRequest, end: str
) -> None:
    """Killed or ended without closing its fetcher, a training process leaves no helper
    behind; ended, nothing makes it wait for them (it once hung at exit, joining them)."""
    import psutil

    _write(s3)
    out = str(tmp_path / "fetched")
    # (not procs.spawn's daemonic process: a daemonic one may have no children)
    proc = multiprocessing.get_context("spawn").Process(
        target=_fetch_then_wait, args=(s3_endpoint, out, end)
    )
    proc.start()
    request.addfinalizer(lambda: proc.kill() if proc.is_alive() else None)
    deadline = time.monotonic() + 90  # (a spawned interpreter importing torch, on a loaded CI)
    while not os.path.exists(out):
        assert time.monotonic() < deadline and proc.is_alive(), "the fetcher did not report"
        time.sleep(0.1)
    copies, path, *pids = Path(out).read_text().split()
    assert int(copies) >= 1 and len(pids) == 2, (copies, pids)
    with open(path, "rb") as file:
        assert file.read() == s3.read(shard_path(DATASET, shard_name(3))), "the copy differs"
    if end == "kill -9":
        kill9(proc)
    else:
        # it ends within a second here; 30 s separates "ends" from "hangs at exit joining its
        # helpers" (the fault this test is for: it never ended) on a loaded CI machine
        proc.join(30)
        assert proc.exitcode == 0, f"the training process did not end: {proc.exitcode}"
    # a helper exits once its socket's other end is gone (or, that end held open by a
    # process forked later, its watchdog sees its parent gone within 0.5 s): 10 s separates
    # "exits once its parent is gone" from "outlives it"
    deadline = time.monotonic() + 10

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    while any(alive(int(p)) for p in pids):
        assert time.monotonic() < deadline, "a helper outlived the training process"
        time.sleep(0.1)


def test_a_helper_process_killed_leaves_its_copies_to_the_training_process(
    s3: S3Storage, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A helper gone (OOM-killed, say): the copy it had, and the next, are made in the
    calling thread, with a warning; the other helper goes on; nothing is lost."""
    import signal

    from strata_redis.shards.copier import CopyJob, CopyProcesses

    _write(s3)
    manifest = read_manifest(s3, DATASET)

    def job(shard: int) -> CopyJob:
        entry = manifest.shards[shard]
        return CopyJob(DATASET, shard, entry, manifest.binary_index, None, None,
                       str(tmp_path), None, 5.0)  # fmt: skip

    helpers = CopyProcesses(s3, 2)
    try:
        deadline = time.monotonic() + 30
        while not helpers.ready:
            assert time.monotonic() < deadline, "the helpers did not start"
            time.sleep(0.05)
        pids = [h.pid for h in helpers._all]
        os.kill(pids[0], signal.SIGKILL)
        os.waitpid(pids[0], 0)  # (reaped here: a pid that is not reused meanwhile)
        with caplog.at_level("WARNING", logger="strata_redis.shards"):
            for shard in range(len(manifest.shards)):
                copied = helpers.copy(job(shard))
                with open(copied.path, "rb") as file:
                    assert file.read() == s3.read(shard_path(DATASET, shard_name(shard)))
        assert [h.pid for h in helpers._all] == pids[1:], "the dead helper is still counted"
        assert any(f"pid {pids[0]}) is gone" in r.getMessage() for r in caplog.records)
        assert helpers.ready, "the other helper is still used"
    finally:
        helpers.close()


def test_a_storage_outage_mid_epoch_is_waited_out(
    local: Counting, redis_url: str, job_id: str, tmp_path: Path
) -> None:
    _write(local, total=95, per=10)
    _register(redis_url, job_id, local)
    flaky = Outage(local.inner, after=4, fail=6)
    assert _read_all(redis_url, job_id, tmp_path, flaky) == Counter(range(95))
    assert flaky.failed == 6


def test_a_storage_outage_longer_than_storage_wait_raises_the_storages_error(
    local: Counting, redis_url: str, job_id: str, tmp_path: Path
) -> None:
    _write(local, total=95, per=10)
    _register(redis_url, job_id, local)
    down = Outage(local.inner, after=4, fail=None)
    with pytest.raises(StorageError, match="Connection refused"):
        _read_all(redis_url, job_id, tmp_path, down, storage_wait=0.5)
    assert down.failed >= 2  # it did wait (retried) before giving up


def test_cleanup_leaves_no_temporary_file(
    local: Counting, redis_url: str, job_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(local, total=30, per=10)
    _register(redis_url, job_id, local)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    assert _read_all(redis_url, job_id, tmp_path, local) == Counter(range(30))
    assert os.listdir(tmp_path / "tmp") == []


def test_a_sample_reads_the_same_through_its_indexed_fields_or_its_tar_headers(
    tmp_path: Path,
) -> None:
    """An index from this version holds each field's span (no header parsed to read a
    sample); one without them (``fields`` None) has its tar headers parsed: the same."""
    from strata_redis.shards import WorkItem
    from strata_redis.shards.index import read_index

    storage = LocalStorage(tmp_path)
    with ShardWriter(storage, DATASET, samples_per_shard=8) as writer:
        for i in range(8):
            writer.write({"bin": sample_bytes(i), "cls": str(i), "npy": np.arange(i % 3)})
    index = read_index(storage, DATASET, read_manifest(storage, DATASET).shards[0])
    assert index.fields is not None
    path = str(tmp_path / DATASET / "shards" / index.name)
    spans = list(zip(index.offsets, index.sizes, strict=True))
    ids = list(range(8))[::-1]
    fast = WorkItem(DATASET, index.name, path, ids, spans[::-1], fields=index.fields[::-1],
                    keys=index.keys[::-1]).samples()  # fmt: skip
    parsed = WorkItem(DATASET, index.name, path, ids, spans[::-1]).samples()
    assert fast == parsed
    assert [s["bin"] for s in fast] == [sample_bytes(i) for i in ids]
    assert fast[0] == {"__key__": "000000007", "__id__": 7, "bin": sample_bytes(7),
                       "cls": b"7", "npy": np.arange(1).tobytes()}  # fmt: skip
    # one field, no dict: from the columns (every sample has the same fields), from the
    # per-sample fields, and by the tar headers, the same bytes; a field no sample has is
    # refused, naming it
    columns = index.columns
    assert columns is not None
    at = np.asarray(ids)
    by_columns = WorkItem(DATASET, index.name, path, ids, (), keys=index.keys[::-1],
                          columns=(columns[0], columns[1][at]))  # fmt: skip
    for item in (by_columns, WorkItem(DATASET, index.name, path, ids, spans[::-1],
                                      fields=index.fields[::-1], keys=index.keys[::-1]),
                 WorkItem(DATASET, index.name, path, ids, spans[::-1])):  # fmt: skip
        assert item.field("bin") == [sample_bytes(i) for i in ids]
        assert item.field("cls") == [str(i).encode() for i in ids]
        with pytest.raises(ShardFormatError, match="no field 'jpg'"):
            item.field("jpg")
    assert by_columns.samples() == fast


def test_a_local_storages_shards_are_read_in_place_and_left_there(
    redis_url: str, job_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``LocalStorage``'s shards are read where they are (no copy held: ``max_held_bytes``
    0), their checksums checked all the same — once while a file keeps its stamp (device,
    inode, size, mtime), again once it changes — and released shards' files stay (the
    storage's, not the fetcher's): a second epoch reads them again."""
    from strata_redis.shards import fetcher

    checked: list[int] = []
    real = fetcher.file_checksum
    monkeypatch.setattr(fetcher, "file_checksum", lambda fd: checked.append(fd) or real(fd))
    storage = LocalStorage(tmp_path / "root")
    _write(storage, total=30, per=10)
    _register(redis_url, job_id, storage)
    before = {n: storage.read(shard_path(DATASET, n)) for n in (shard_name(k) for k in range(3))}
    with (
        _orchestrator(redis_url, job_id, tmp_path) as orch,
        ShardReader(orch, DATASET, storage, batch_size=4) as reader,
    ):
        for epoch in range(3):
            if epoch == 2:  # the file of shard 1 touched: its stamp is not the one checked
                file = tmp_path / "root" / shard_path(DATASET, shard_name(1))
                os.utime(file, ns=(file.stat().st_atime_ns, file.stat().st_mtime_ns + 10**9))
            assert _epoch(reader) == Counter(range(30))
            assert len(checked) == [3, 3, 4][epoch], (epoch, checked)
            orch.advance_epoch()
        stats = reader.stats()
    assert stats["fetched_shards"] == 9 and stats["max_held_bytes"] == 0, stats
    assert {n: storage.read(shard_path(DATASET, n)) for n in before} == before


def test_a_local_shard_with_nothing_to_fetch_is_made_in_the_training_thread(
    redis_url: str, job_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``LocalStorage``'s shard read in place whose checksum was checked (and whose index
    is at hand) is made ready in the thread that demands it: no fetch thread is woken for it
    and nothing is fetched ahead for it. A shard still to check is checked in a fetch
    thread, ahead, as before."""
    from strata_redis.shards.fetcher import ShardFetcher

    where: list[tuple[int, str]] = []
    real = ShardFetcher._fetch

    def fetch(self: ShardFetcher, shard: int, positions: list[int] | None) -> Any:
        where.append((shard, threading.current_thread().name))
        return real(self, shard, positions)

    monkeypatch.setattr(ShardFetcher, "_fetch", fetch)
    storage = LocalStorage(tmp_path / "root")
    _write(storage, total=60, per=10)
    assert all(entry.checksum for entry in read_manifest(storage, DATASET).shards)
    _register(redis_url, job_id, storage)
    with (
        _orchestrator(redis_url, job_id, tmp_path) as orch,
        ShardReader(orch, DATASET, storage, batch_size=4, prefetch=2) as reader,
    ):
        assert _epoch(reader) == Counter(range(60))
        first = list(where)
        ahead = reader.stats()["prefetched"]
        orch.advance_epoch()
        where.clear()
        assert _epoch(reader) == Counter(range(60))
        stats = reader.stats()
    assert sorted(s for s, _ in first) == list(range(6)), first
    assert all(name.startswith("strata-fetch") for _, name in first), first
    assert ahead > 0
    assert sorted(s for s, _ in where) == list(range(6)), where
    assert {name for _, name in where} == {threading.current_thread().name}, where
    assert stats["prefetched"] == ahead and stats["fetched_shards"] == 12, stats


def test_a_shard_file_changed_while_read_in_place_is_refused(
    redis_url: str, job_id: str, tmp_path: Path
) -> None:
    """A shard read in place is checked once; its file replaced after that (a dataset
    written again under a running job) is refused with ``ShardChecksumError`` naming it, not
    read unchecked."""
    storage = LocalStorage(tmp_path / "root")
    _write(storage, total=30, per=10)
    _register(redis_url, job_id, storage)
    with (
        _orchestrator(redis_url, job_id, tmp_path) as orch,
        ShardReader(orch, DATASET, storage, batch_size=4) as reader,
    ):
        batches = reader.batches()
        first = next(batches)  # 4 samples of one shard: its file checked and mapped
        shard = shard_name(first[0]["__id__"] // 10)
        file = tmp_path / "root" / shard_path(DATASET, shard)
        replaced = file.with_name(file.name + ".new")
        replaced.write_bytes(file.read_bytes())  # the same bytes, another file
        os.replace(replaced, file)
        with pytest.raises(ShardChecksumError, match="changed after its checksum") as caught:
            next(batches)  # the rest of that shard
        assert shard in str(caught.value)


# -- the binary index ------------------------------------------------------------------------------
def test_the_binary_index_reads_as_the_json_one_and_is_checked(tmp_path: Path) -> None:
    """The writer and ``index_tar_shards`` write each index in binary form too, and the
    manifest says so; read back it is the JSON index (keys, spans, fields, columns), for
    samples of the same fields and of unequal ones; one that does not fit its tar, or is cut
    short, is refused naming it."""
    from strata_redis.shards.index import ShardIndex, read_index

    storage = LocalStorage(tmp_path / "root")
    with ShardWriter(storage, DATASET, samples_per_shard=4) as writer:
        for i in range(10):
            extra = {"cls": str(i)} if i % 3 else {}
            writer.write({"__key__": f"s/é{i:03d}", "bin": sample_bytes(i), **extra})
    manifest = read_manifest(storage, DATASET)
    assert manifest.binary_index
    tars = {f"part-{n:02d}.tar": _webdataset_tar(n * 7, 7, long_names=n == 1) for n in range(2)}
    for name, data in tars.items():
        storage.write(shard_path("tars", name), data)
    indexed = index_tar_shards(storage, "tars")
    assert indexed.binary_index and read_manifest(storage, "tars").binary_index
    for dataset, entries in ((DATASET, manifest.shards), ("tars", indexed.shards)):
        for entry in entries:
            doc = read_index(storage, dataset, entry)
            binary = read_index(storage, dataset, entry, binary=True)
            assert (binary.name, binary.size, binary.checksum) == (doc.name, doc.size,
                                                                    doc.checksum)  # fmt: skip
            assert list(binary.keys) == list(doc.keys) and binary.keys[-1] == doc.keys[-1]
            assert (binary.offsets, binary.sizes) == (doc.offsets, doc.sizes)
            assert doc.fields is not None and binary.fields is not None
            assert [list(f) for f in binary.fields] == [list(f) for f in doc.fields]
            if doc.columns is None:
                assert binary.columns is None
            else:
                assert binary.columns is not None and binary.columns[0] == doc.columns[0]
                assert (binary.columns[1] == doc.columns[1]).all()
    assert read_index(storage, "tars", indexed.shards[0], binary=True).columns is not None
    assert read_index(storage, DATASET, manifest.shards[0], binary=True).columns is None
    raw = storage.read(binary_index_path(DATASET, shard_name(0)))
    index = ShardIndex.from_binary(raw, dataset=DATASET, path="p", backend="b")
    small = ShardIndex(index.name, index.offsets[-1], "", list(index.keys), index.offsets,
                       index.sizes, [list(f) for f in index.fields or []])  # fmt: skip
    for bad, why in (
        (small.to_binary(), "do not fit together or in its"),
        (raw[:-200], "bytes, its arrays need|do not fit"),
        (b"NOTANIDX" + raw[8:], "not a binary shard index"),
    ):
        with pytest.raises(ShardFormatError, match=why):
            ShardIndex.from_binary(bad, dataset=DATASET, path="p", backend="b")


def test_a_dataset_written_before_the_binary_index_is_read_through_its_json_indexes(
    local: Counting, redis_url: str, job_id: str, tmp_path: Path
) -> None:
    """A manifest without ``binary_index`` (a dataset written by an earlier version: JSON
    indexes only) is read as before, through the JSON indexes; a new one's readers read the
    binary indexes and no JSON one."""
    _write(local, total=30, per=10)
    assert local.inner.exists(binary_index_path(DATASET, shard_name(0)))
    _register(redis_url, job_id, local)
    assert _read_all(redis_url, job_id, tmp_path, local) == Counter(range(30))
    read = set(local.reads)
    # (each shard's binary index, read on its own or, once loaded, from the index pack)
    own = {binary_index_path(DATASET, shard_name(k)) for k in range(3)}
    assert own <= read or index_pack_path(DATASET) in read, read
    assert not {index_path(DATASET, shard_name(k)) for k in range(3)} & read
    # the same dataset as an earlier version wrote it: no binary index, none in the manifest
    import orjson

    from strata_redis.shards.index import manifest_path

    for k in range(3):
        local.inner.delete(binary_index_path(DATASET, shard_name(k)))
    local.inner.delete(index_pack_path(DATASET))
    doc = orjson.loads(local.inner.read(manifest_path(DATASET)))
    del doc["binary_index"], doc["index_pack"]
    local.inner.write(manifest_path(DATASET), orjson.dumps(doc))
    assert not read_manifest(local, DATASET).binary_index
    local.reads.clear()
    with _orchestrator(redis_url, job_id, tmp_path) as orch:
        orch.advance_epoch()
    assert _read_all(redis_url, job_id, tmp_path, local) == Counter(range(30))
    assert {index_path(DATASET, shard_name(k)) for k in range(3)} <= set(local.reads)


def test_the_index_pack_is_one_read_for_every_shards_index(
    s3: S3Storage, redis_url: str, job_id: str, tmp_path: Path
) -> None:
    """A dataset of small shards has an index pack (its size and CRC-32 in the manifest): a
    reader fetching the shards from the S3 stand-in reads it once, in the background, and
    then each shard's tar alone; only shards fetched before it was loaded read their own
    index (the first and those prefetched with it). Without it, a shard is two requests."""
    log = str(tmp_path / "reads.log")  # (the helper processes' reads too)
    storage = Counting(s3, log=log)
    _write(storage, total=200, per=10)
    manifest = read_manifest(storage, DATASET)
    assert manifest.index_pack is not None and manifest.index_pack.size > 0
    packed = read_pack(storage, manifest).index(7)
    own = read_index(storage, DATASET, manifest.shards[7], binary=True)
    assert (packed.name, packed.offsets, packed.sizes) == (own.name, own.offsets, own.sizes)
    _register(redis_url, job_id, storage)
    os.unlink(log)
    seen: Counter[int] = Counter()
    with (
        _orchestrator(redis_url, job_id, tmp_path) as orch,
        ShardReader(orch, DATASET, storage, batch_size=4, prefetch=2) as reader,
    ):
        batches = reader.batches()
        seen.update(s["__id__"] for s in next(batches))
        deadline = time.monotonic() + 30  # (it is never waited for: wait here, to count)
        while not reader.stats()["index_pack_bytes"]:
            assert time.monotonic() < deadline, "the index pack was not loaded"
            time.sleep(0.01)
        for batch in batches:
            seen.update(s["__id__"] for s in batch)
        stats = reader.stats()
    assert seen == Counter(range(200))
    reads = Counter(line.split(" ", 1)[1] for line in Path(log).read_text().splitlines())
    assert reads[index_pack_path(DATASET)] == 1, reads
    assert sorted(n for p, n in reads.items() if p.endswith(".tar")) == [1] * 20, reads
    own = sum(n for p, n in reads.items() if p.endswith(".index.bin"))
    assert own == stats["index_reads"] <= 3, (own, stats)  # (the first demand + 2 ahead)
    assert not any(p.endswith(".index.json") for p in reads), reads
    assert stats["index_pack_bytes"] == manifest.index_pack.size
    assert reader.feed.fetcher._pack is None  # (every index is out of it: its bytes went)


def test_an_index_pack_that_does_not_check_out_leaves_each_shards_own_index(
    local: Counting, redis_url: str, job_id: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A pack that is not the one the manifest describes is reported and read past: every
    shard's own index is read, and every sample once. A pack missing from storage is named
    when the dataset is registered."""
    import logging

    _write(local, total=30, per=10)
    pack = local.inner.read(index_pack_path(DATASET))
    local.inner.write(index_pack_path(DATASET), pack[:-1] + bytes([pack[-1] ^ 1]))
    _register(redis_url, job_id, local)
    with caplog.at_level(logging.WARNING, logger="strata_redis.shards"):
        assert _read_all(redis_url, job_id, tmp_path, local) == Counter(range(30))
    assert "its index pack was not read (ShardFormatError" in caplog.text, caplog.text
    assert {binary_index_path(DATASET, shard_name(k)) for k in range(3)} <= set(local.reads)
    local.inner.delete(index_pack_path(DATASET))
    with pytest.raises(ShardManifestError, match=r"1 objects it names are not in storage "
                       r"\(\['index\.pack'\]"):  # fmt: skip
        _register(redis_url, job_id, local)


def test_no_helper_process_when_asked_for_none(
    s3: S3Storage, redis_url: str, job_id: str, tmp_path: Path
) -> None:
    """``ShardReader(processes=0)`` (as ``ShardDataset``'s): no helper process is forked; the
    fetch threads copy the shards from S3, every sample once."""
    import psutil

    _write(s3, total=40, per=10)
    _register(redis_url, job_id, s3)
    before = {p.pid for p in psutil.Process().children()}
    with (
        _orchestrator(redis_url, job_id, tmp_path) as orch,
        ShardReader(orch, DATASET, s3, batch_size=4, processes=0) as reader,
    ):
        assert _epoch(reader) == Counter(range(40))
        stats = reader.stats()
        assert {p.pid for p in psutil.Process().children()} == before
    assert stats["helper_copies"] == 0 and stats["fetched_shards"] == 4, stats

"""strata_redis.torch.ShardDataset: a sharded dataset in storage through a DataLoader with
worker processes; and the job killed mid-epoch (3 workers, one SIGKILLed) relaunched with 2:
every sample once relative to the kept checkpoint, no done shard read again; and then
relaunched with 3 again (3 → 2 → 3), once more killed on the way.

The elastic test runs a short fixed form here (200 shards of 10 samples, local storage and
the S3 stand-in); ``STRATA_SHARDS_LONG=1`` runs a long form (2,000 shards).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest

import strata_redis
import strata_redis.torch as strata_torch
from strata_redis.data.position import POSITION_PART, Position, decode_positions
from strata_redis.data.sharding import DatasetParams
from strata_redis.shards import ShardWriter, register_shards
from strata_redis.shards.index import shard_name, shard_path
from strata_redis.storage import LocalStorage, S3Storage, Storage

from .procs import CTX, wait_for
from .shardstores import Counting, sample_bytes, sample_id

pytestmark = pytest.mark.torch

JOB = "shards-torch"
DATASET = "ds"
LONG = os.environ.get("STRATA_SHARDS_LONG") == "1"


def decode_id(sample: dict[str, Any]) -> int:
    """A sample's id, read from its bytes (in a loader worker)."""
    return sample_id(sample["bin"])


def _write(storage: Storage, total: int, per: int) -> None:
    with ShardWriter(storage, DATASET, samples_per_shard=per) as writer:
        for i in range(total):
            writer.write(sample_bytes(i))


def _register(url: str, storage: Storage) -> DatasetParams:
    manager = strata_redis.ShardManager(url, job_id=JOB)
    try:
        return register_shards(manager, storage, DATASET, seed=5)
    finally:
        manager.job.close()


def _position_samples(params: DatasetParams, position: Position) -> set[int]:
    out: set[int] = set()
    for shard in position.done():
        out |= set(params.shard(shard, position.epoch).indices().tolist())
    for shard, offset in position.partial.items():
        if shard not in position.done():
            out |= set(params.shard(shard, position.epoch).indices()[:offset].tolist())
    return out


# (a CPU-only machine: pin_memory is accepted and warns it pins nothing)
@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true:UserWarning")
def test_a_loader_with_workers_reads_each_sample_once_and_saves_what_was_consumed(
    redis_url: str, tmp_path: Path
) -> None:
    storage = LocalStorage(tmp_path / "root")
    _write(storage, total=230, per=20)
    params = _register(redis_url, storage)
    with strata_redis.TrainingOrchestrator(
        coordinator_url=redis_url, worker_id="w0", job_id=JOB, checkpoint_path=tmp_path / "ck",
        last_call=0.1, heartbeat_timeout=3.0,
    ) as orch:  # fmt: skip
        ds = strata_torch.ShardDataset(orch, DATASET, storage, batch_size=6, decode=decode_id)
        loader = strata_torch.DataLoader(ds, batch_size=None, num_workers=2, pin_memory=True,
                                         prefetch_factor=3)  # fmt: skip
        in_process = strata_torch.DataLoader(ds, num_workers=0)  # read in this process
        for epoch, epoch_loader in ((0, loader), (1, in_process)):
            ds.set_epoch(epoch)
            assert Counter(int(i) for b in epoch_loader for i in b) == Counter(range(230))
            orch.advance_epoch()
        ds.set_epoch(2)
        consumed: list[int] = []
        for n, batch in enumerate(loader, 1):
            consumed += batch.tolist()  # (default collate: a tensor of the ids)
            if n == 13:  # mid-shard (20 samples a shard: batches of 6, 6, 6, 2)
                in_flight = ds.sampler.stream.in_flight
                future = strata_torch.save(orch, step=n, epoch=2)
                break
        assert in_flight > 0, "the loader prefetched nothing: the test shows nothing"
        assert future is not None
        info = future.result(30)
        (saved,), _ = decode_positions(orch.checkpoints.load(info.step, POSITION_PART, 0))
        assert _position_samples(params, saved) == set(consumed)
        stats = ds.stats()
        ds.close()
    assert stats["max_ahead_shards"] <= 2, stats  # the stated bound
    assert stats["prefetch_hits"] > 0, stats


@pytest.mark.parametrize("same_fields", [True, False])
def test_one_fields_samples_through_loader_workers_each_once(
    redis_url: str, tmp_path: Path, same_fields: bool
) -> None:
    """``ShardDataset(field="bin")``: each sample is its field's bytes, each once, through
    loader workers. Where every sample has the same fields, an item carries that field's
    spans alone (no keys: they are never decoded); where they differ, the samples' fields
    are found one by one, the same bytes."""
    storage = LocalStorage(tmp_path / "root")
    with ShardWriter(storage, DATASET, samples_per_shard=20) as writer:
        for i in range(230):
            extra = {} if same_fields or i % 3 else {"cls": str(i).encode()}
            writer.write({"bin": sample_bytes(i), **extra})
    _register(redis_url, storage)
    with strata_redis.TrainingOrchestrator(
        coordinator_url=redis_url, worker_id="w0", job_id=JOB, checkpoint_path=tmp_path / "ck",
        last_call=0.1, heartbeat_timeout=3.0,
    ) as orch:  # fmt: skip
        ds = strata_torch.ShardDataset(orch, DATASET, storage, batch_size=7, field="bin")
        first = next(iter(ds.sampler))
        ds.sampler.close()
        if same_fields:
            assert first.keys is None and first.columns is not None, first
            assert first.columns[0] == ("bin",) and first.columns[1].shape == (7, 1, 2)
        else:
            assert first.columns is None and first.keys is not None, first
        loader = strata_torch.DataLoader(ds, num_workers=2, collate_fn=list)
        seen: Counter[int] = Counter()
        for batch in loader:
            for data in batch:
                assert data == sample_bytes(sample_id(data)), data
                seen[sample_id(data)] += 1
        ds.close()
    assert seen == Counter(range(230))


# -- the job killed mid-epoch, relaunched with fewer workers ------------------------------------
def _worker(
    url: str, worker_id: str, logdir: str, spec: dict[str, Any], cfg: dict[str, Any]
) -> None:
    try:
        _loop(url, worker_id, logdir, spec, cfg)
    except BaseException as exc:
        Path(logdir, f"error-{cfg['run']}-{worker_id}").write_text(f"{type(exc).__name__}: {exc}")
        raise


def _storage(spec: dict[str, Any]) -> Storage:
    if spec["kind"] == "local":
        return LocalStorage(spec["root"])
    return S3Storage(spec["bucket"], endpoint_url=spec["endpoint"], prefix="data")


def _loop(url: str, worker_id: str, logdir: str, spec: dict[str, Any], cfg: dict[str, Any]) -> None:
    run = cfg["run"]
    # (a LocalStorage's shards are read in place: the fetcher's offers are logged as reads)
    log = os.path.join(logdir, f"reads-{run}-{worker_id}")
    storage = Counting(_storage(spec), log=log, in_place=True)
    trained: list[int] = []  # this worker's "model": the samples it trained this epoch
    orch = strata_redis.TrainingOrchestrator(
        coordinator_url=url, worker_id=worker_id, job_id=JOB, checkpoint_path=cfg["ckpt"],
        min_workers=cfg["workers"], last_call=1.0, heartbeat_timeout=2.0, batch_size=5,
        state_provider=lambda: np.asarray(trained, dtype=np.int64).tobytes(),
        epoch_timeout=120.0, commit_timeout=60.0, replace=cfg.get("replace"),
    )  # fmt: skip
    if orch.resumed is not None:
        Path(logdir, f"resumed-{run}-{worker_id}").write_text(orch.resumed.label)
    with orch, open(os.path.join(logdir, f"{run}-{worker_id}.log"), "a") as log:
        ds = strata_torch.ShardDataset(orch, DATASET, storage, decode=decode_id)
        # (this process was spawned, which makes spawn the default start method here too:
        # fork the loader's workers, as a process started by torchrun or a shell would)
        loader = strata_torch.DataLoader(ds, num_workers=2, collate_fn=list,
                                         multiprocessing_context="fork")  # fmt: skip
        for epoch in range(orch.epoch, 1):
            ds.set_epoch(epoch)
            for step, ids in enumerate(loader):
                time.sleep(cfg["sleep"])
                trained.extend(ids)
                log.write(f"{epoch} {' '.join(map(str, ids))}\n")
                log.flush()
                if step % 10 == 0:
                    orch.save_checkpoint(step=step, epoch=epoch)
            orch.advance_epoch()
        orch.wait_for_checkpoints(60)
        ds.close()


def _trained(logdir: Path, run: str) -> Counter[int]:
    out: Counter[int] = Counter()
    for path in logdir.glob(f"{run}-*.log"):
        for line in path.read_text().splitlines():
            out.update(int(s) for s in line.split()[1:])
    return out


def _spawn(*args: Any) -> Any:
    """A worker process that may start its own (its loader's workers): not a daemon, so the
    test kills what it starts (``_stop``)."""
    proc = CTX.Process(target=_worker, args=args, daemon=False)
    proc.start()
    return proc


def _stop(procs: list[Any]) -> None:
    for proc in procs:
        if proc.pid is not None and proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)


def _errors(logdir: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in logdir.glob("error-*")}


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> Iterator[str]:
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="shards")
    client.close()
    yield "shards"


def _kill_after_a_checkpoint(
    procs: list[Any], logs: Path, ckpt: Any, world_size: int, at_least: int
) -> Any:
    """Wait for a checkpoint of epoch 0 from the running round (its world size, step at
    least ``at_least``), then SIGKILL one worker (a node dies) and the rest (the job is killed
    with it); return the checkpoint kept (the newest)."""

    def mid_epoch() -> bool:
        if _errors(logs) or all(not p.is_alive() for p in procs):
            raise AssertionError(f"the workers ended: {_errors(logs)}")
        return any(i.epoch == 0 and i.world_size == world_size and i.step >= at_least
                   for i in ckpt.list())  # fmt: skip

    wait_for(mid_epoch, 120, step=0.05, why=lambda: [i.label for i in ckpt.list()])
    assert procs[-1].pid is not None
    os.kill(procs[-1].pid, signal.SIGKILL)  # a node dies ...
    _stop(procs)  # ... and the job is killed with it, to be relaunched at another size
    return ckpt.list()[0]


def _kept(params: DatasetParams, ckpt: Any, info: Any) -> tuple[Counter[int], list[Position]]:
    """A checkpoint's model (the samples its ranks trained) and its ranks' data positions."""
    positions = [decode_positions(ckpt.load(info.step, POSITION_PART, r))[0][0]
                 for r in range(info.world_size)]  # fmt: skip
    model = Counter(
        int(i) for r in range(info.world_size)
        for i in np.frombuffer(ckpt.load(info.step, rank=r), dtype=np.int64)
    )  # fmt: skip
    return model, positions


def _reads(logs: Path, run: str, ranged: bool = False) -> Counter[str]:
    """The storage objects a run's workers read (whole, by range or in place) or, with
    ``ranged``, read only in part (by range, or in place: a LocalStorage's own file, of
    which only the samples left are read)."""
    out: Counter[str] = Counter()
    for path in logs.glob(f"reads-{run}-*"):
        for line in path.read_text().splitlines():
            if not ranged or line[:5] in ("range", "place"):
                out[line.split()[1]] += 1
    return out


def _check_resume(
    logs: Path, run: str, info: Any, done: set[int], partial: set[int], finished: bool
) -> None:
    """A relaunch resumed from the kept checkpoint ``info``, read none of the shards it had
    done, and read the ones it had part-way by ranges (only what was left): each of them
    when the relaunch ``finished`` the epoch, else those it reached."""
    assert {p.read_text() for p in logs.glob(f"resumed-{run}-*")} == {info.label}, run
    again = {shard_path(DATASET, shard_name(s)) for s in done} & set(_reads(logs, run))
    assert not again, f"{run}: {len(again)} shards done in the checkpoint were read again"
    ranged = _reads(logs, run, ranged=True)
    for s in partial:
        if finished or _reads(logs, run)[shard_path(DATASET, shard_name(s))]:
            assert ranged[shard_path(DATASET, shard_name(s))] >= 1, (run, s, partial)


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_killed_mid_epoch_relaunched_with_fewer_then_more_workers_trains_each_sample_once(
    redis_url: str, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """3 workers, each a DataLoader with 2 worker processes; one SIGKILLed mid-epoch after a
    checkpoint committed, then the rest (the job is killed); relaunched with 2, killed the
    same way after one of their checkpoints; relaunched with 3 to the epoch's end (3 → 2 →
    3): every sample of the epoch is trained exactly once relative to the kept checkpoints,
    and no shard a kept checkpoint had done is read again (the resume's cost does not grow
    with the work done; a shard done part-way is read by ranges)."""
    shards, per = (2000, 10) if LONG else (200, 10)
    if kind == "local":
        spec: dict[str, Any] = {"kind": "local", "root": str(tmp_path / "root")}
    else:
        spec = {"kind": "s3", "bucket": request.getfixturevalue("s3_bucket"),
                "endpoint": request.getfixturevalue("s3_endpoint")}  # fmt: skip
    storage = _storage(spec)
    _write(storage, total=shards * per, per=per)
    params = _register(redis_url, storage)
    logs = tmp_path / "logs"
    logs.mkdir()
    cfg = {"workers": 3, "sleep": 0.01, "run": "a", "ckpt": str(tmp_path / "ckpt")}
    procs = [_spawn(redis_url, w, str(logs), spec, cfg) for w in ("w0", "w1", "w2")]
    request.addfinalizer(lambda: _stop(procs))
    ckpt = strata_redis.CheckpointManager(tmp_path / "ckpt", job_id=JOB, redis=redis_url)
    trained = Counter[int]()  # what the kept checkpoints' models hold, run after run
    kept: tuple[Any, set[int], set[int]] | None = None  # the last kill's checkpoint, done, partial
    for run, size, ids in (("b", 2, ("w0", "w2")), ("c", 3, ("w0", "w1", "w2"))):
        info = _kill_after_a_checkpoint(procs, logs, ckpt, cfg["workers"], 20 if run == "b" else 10)
        assert len(trained + _trained(logs, cfg["run"])) < params.total_samples, (
            "the kill came after the epoch"
        )
        if kept is not None:
            _check_resume(logs, cfg["run"], *kept, finished=False)
        model, positions = _kept(params, ckpt, info)
        trained += model
        for p in positions:  # the position in the checkpoint is what the models hold
            assert _position_samples(params, p) <= set(trained), (run, info.label)
        done = set().union(*(p.done() for p in positions))
        assert done, "the checkpoint had no shard done: the read check shows nothing"
        partial = {s for p in positions for s, o in p.partial.items() if o and s not in done}
        kept = (info, done, partial)

        with strata_redis.connect(redis_url, JOB, heartbeat_timeout=2.0) as job:
            # the killed workers are declared failed (as their heartbeats stop) before the
            # relaunch: its round is then all new, and resumes from the kept checkpoint
            wait_for(lambda: not (job.reap() or job.live_workers()), 30, step=0.2)
        cfg = {**cfg, "workers": size, "run": run}
        procs[:] = [_spawn(redis_url, w, str(logs), spec, cfg) for w in ids]
    for proc in procs:
        proc.join(180)
    assert [p.exitcode for p in procs] == [0, 0, 0], _errors(logs)
    assert kept is not None
    _check_resume(logs, "c", *kept, finished=True)
    assert trained + _trained(logs, "c") == Counter(range(params.total_samples)), (
        "none skipped, none twice"
    )
    ckpt.close()


# -- errors in the loader's worker processes ----------------------------------------------------
def _corrupt_headers(storage: Storage, at: dict[int, int]) -> None:
    """Zero sample ``at[shard]``'s tar header in each of those shards (the archive's end, to a
    parser), indexed without fields or checksum (as ``index_tar_shards`` indexes in place), so
    the loader worker that parses that sample finds it; the dataset's JSON indexes are read
    (as a dataset's written before the binary index)."""
    import orjson

    from strata_redis.shards.index import index_path, manifest_path

    manifest = orjson.loads(storage.read(manifest_path(DATASET)))
    del manifest["binary_index"]
    for shard, sample in at.items():
        name = shard_name(shard)
        index = orjson.loads(storage.read(index_path(DATASET, name)))
        del index["fields"]  # (the worker then parses each sample's tar headers)
        index["checksum"] = manifest["shards"][shard]["checksum"] = ""
        storage.write(index_path(DATASET, name), orjson.dumps(index))
        tar = bytearray(storage.read(shard_path(DATASET, name)))
        offset = index["offsets"][sample]
        tar[offset : offset + 512] = bytes(512)
        storage.write(shard_path(DATASET, name), bytes(tar))
    storage.write(manifest_path(DATASET), orjson.dumps(manifest))


def test_a_corrupt_shard_read_in_a_loader_worker_reaches_the_loop_as_its_own_error(
    redis_url: str, tmp_path: Path
) -> None:
    """A sample whose tar header is corrupt is found by the loader worker that parses it: the
    loop gets the ``ShardFormatError`` naming the object, not torch's ``RuntimeError`` (which
    it gives for an error it cannot re-make from its message)."""
    from strata_redis.errors import ShardFormatError

    storage = LocalStorage(tmp_path / "root")
    _write(storage, total=40, per=10)
    _corrupt_headers(storage, {1: 3})  # sample 13
    _register(redis_url, storage)
    with strata_redis.TrainingOrchestrator(
        coordinator_url=redis_url, worker_id="w0", job_id=JOB, checkpoint_path=tmp_path / "ck",
        last_call=0.1, heartbeat_timeout=3.0,
    ) as orch:  # fmt: skip
        ds = strata_torch.ShardDataset(orch, DATASET, storage, batch_size=5, decode=decode_id)
        loader = strata_torch.DataLoader(ds, num_workers=2)
        ds.set_epoch(0)
        name = shard_name(1)
        with pytest.raises(ShardFormatError, match=rf"'{DATASET}/shards/{name}': sample 13: "):
            for _ in loader:
                pass
        ds.close()


def test_leases_go_back_at_once_when_the_first_batch_fails(redis_url: str, tmp_path: Path) -> None:
    """Every shard's first sample corrupt, found by the loader worker that parses it: the
    loader's first batch fails. The walk's leases go back as the error leaves the loop (not
    when the suspended walk is collected: maybe never while a traceback holds it, or after
    Redis is gone), and the worker processes stop then too: no shard of the epoch is held."""
    from strata_redis.errors import ShardFormatError

    storage = LocalStorage(tmp_path / "root")
    _write(storage, total=40, per=10)
    _corrupt_headers(storage, dict.fromkeys(range(4), 0))
    _register(redis_url, storage)
    with strata_redis.TrainingOrchestrator(
        coordinator_url=redis_url, worker_id="w0", job_id=JOB, checkpoint_path=tmp_path / "ck",
        last_call=0.1, heartbeat_timeout=3.0, lease_ttl=60.0,
    ) as orch, strata_redis.connect(redis_url, JOB) as job:  # fmt: skip
        holders = job.leases(DATASET, 0, "reader").keys.holders
        ds = strata_torch.ShardDataset(orch, DATASET, storage, batch_size=5, decode=decode_id)
        loader = strata_torch.DataLoader(ds, num_workers=2)
        ds.set_epoch(0)
        with pytest.raises(ShardFormatError, match=r": sample \d+: "):
            for _ in loader:
                pass
        # (pytest.raises keeps the traceback, and with it the loader's frames)
        assert job.context.client.hlen(holders) == 0, job.context.client.hgetall(holders)
        ds.close()


def test_bad_shard_dataset_arguments_are_refused_before_anything_is_leased() -> None:
    from strata_redis.torch import ShardDataset

    with pytest.raises(TypeError, match="field must be a field's name"):
        ShardDataset(None, DATASET, None, field="")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="field must be a field's name"):
        ShardDataset(None, DATASET, None, field=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="decode must be callable"):
        ShardDataset(None, DATASET, None, decode="bytes")  # type: ignore[arg-type]

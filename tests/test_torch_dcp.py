"""strata_redis.torch's DCP storage writer/reader: ``dcp.save``/``dcp.load`` of 2 gloo ranks
through strata checkpoints (local and S3), a corrupt part, and a rank SIGKILLed mid-save."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import pytest
import redis
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import strata_redis
import strata_redis.torch as strata_torch
from strata_redis.checkpoint.reader import CheckpointSkippedWarning
from strata_redis.errors import CheckpointAbortedError, StorageError
from strata_redis.server import RedisServer
from strata_redis.storage.local import LocalStorage
from strata_redis.torch.dcp import DATA_PART, METADATA_PART

from .procs import join_all, kill9, spawn, wait_for

pytestmark = pytest.mark.torch

JOB = "dcp"
STEP = 5
#: (the directory holding ckpt/ and out/, the save's result on rank 0)
Saved = tuple[Path, dict[str, Any]]


# -- the worker processes ---------------------------------------------------------------------
def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small model and an Adam optimizer with state (one step taken)."""
    torch.manual_seed(seed)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model, opt


def _state(model: torch.nn.Module, opt: torch.optim.Optimizer, rank: int) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, opt)
    # replicated items (DCP dedups them across the ranks) and one item of each rank's own
    return {"model": model_sd, "optim": optim_sd, f"own{rank}": torch.full((3,), rank + 1.0)}


class StallingStorage(LocalStorage):
    """Local storage whose upload of this rank's DCP items, once ``armed``, waits until the
    coordinator's parts are in storage, says so in ``marker`` (its pid), then hangs."""

    def __init__(self, root: str, marker: str) -> None:
        super().__init__(root)
        self.marker = marker
        self.armed = False

    def write(self, path: str, data: object) -> None:
        if self.armed and path.endswith("/" + DATA_PART):
            step_dir = path.rsplit("/rank_", 1)[0]
            coordinator = Path(self.root, step_dir, "rank_0", METADATA_PART)
            deadline = time.monotonic() + 30
            while not coordinator.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            Path(self.marker).write_text(str(os.getpid()))
            time.sleep(600)  # SIGKILLed meanwhile
        super().write(path, data)


def _dcp_worker(
    url: str, worker_id: str, storage: str, out: str, phases: list[str], cfg: dict[str, Any]
) -> None:
    """One process running ``phases`` in turn, each as a fresh start of the job: a new
    orchestrator (a new registration, so the 2-worker round is a whole-job restart that
    resumes from the newest checkpoint) and a new gloo group; "save" runs ``dcp.save``,
    "load" runs ``dcp.load`` into fresh objects. Outcomes go to out/<worker_id>.json."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    warnings.simplefilter("ignore")
    results: dict[str, Any] = {}
    try:
        for phase in phases:
            results[phase] = result = {}
            _phase(url, worker_id, storage, Path(out), phase, cfg, result)
            if "error" in result:
                break
    finally:
        Path(out, f"{worker_id}.json").write_text(json.dumps(results))


def _phase(
    url: str,
    worker_id: str,
    storage: str,
    out: Path,
    phase: str,
    cfg: dict[str, Any],
    result: dict[str, Any],
) -> None:
    checkpoint_path: Any = storage
    if cfg.get("stall"):
        checkpoint_path = StallingStorage(storage, str(out / "stalled"))
    orch = strata_redis.TrainingOrchestrator(
        coordinator_url=url, worker_id=worker_id, job_id=JOB, checkpoint_path=checkpoint_path,
        min_workers=2, max_workers=2, last_call=0.2, elastic=False,
        heartbeat_timeout=cfg.get("heartbeat_timeout", 5.0),
        commit_timeout=cfg.get("commit_timeout", 30.0),
    )  # fmt: skip
    rank = result["rank"] = orch.rank
    try:
        strata_torch.init_process_group(orch, "gloo", timeout=30)
        if isinstance(checkpoint_path, StallingStorage):
            checkpoint_path.armed = rank == 1
        if phase == "save":
            model, opt = _trained(seed=0)
            state = _state(model, opt, rank)
            writer = strata_torch.StrataStorageWriter(orch, step=STEP, epoch=0)
            try:
                dcp.save(state, storage_writer=writer)
            except BaseException as exc:  # CheckpointException is a BaseException
                result["raised_at"] = time.time()
                result["error"] = f"{type(exc).__name__}: {exc}"
                if writer.future is not None:
                    cause = writer.future.exception(timeout=30)
                    result["future_error"] = type(cause).__name__ if cause else None
                raise
            info = writer.future.result(timeout=30)  # type: ignore[union-attr]
            result.update(step=info.step, label=info.label, files=sorted(info.files))
            torch.save(state, out / f"saved_{rank}.pt")
        else:
            model, opt = _trained(seed=1)  # other values, the same structure
            state = _state(model, opt, rank)
            state[f"own{rank}"] = torch.zeros(3)
            reader = strata_torch.StrataStorageReader(orch)  # the checkpoint resumed from
            dcp.load(state, storage_reader=reader)
            set_state_dict(model, opt, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])  # fmt: skip
            assert reader.info is not None and orch.resumed is not None
            result.update(step=reader.info.step, resumed=orch.resumed.step)
            torch.save(_state(model, opt, rank) | {f"own{rank}": state[f"own{rank}"]},
                       out / f"loaded_{rank}.pt")  # fmt: skip
        dist.destroy_process_group()
    except BaseException:
        result.setdefault("error", traceback.format_exc()[-3000:])
    finally:
        orch.close()


def _run(
    url: str, storage: str, out: Path, phases: list[str], timeout: float = 55, **cfg: Any
) -> dict[str, list[dict[str, Any]]]:
    """Run ``phases`` in 2 worker processes: phase -> its results, by rank."""
    out.mkdir(parents=True, exist_ok=True)
    procs = [spawn(_dcp_worker, url, f"w{i}", storage, str(out), phases, cfg) for i in range(2)]
    codes = join_all(procs, timeout)
    results = [_read_json(out / f"w{i}.json") for i in range(2)]
    assert codes == [0, 0], (codes, results)
    for worker in results:
        for phase in phases:
            assert "error" not in worker.get(phase, {"error": "not run"}), results
    return {phase: sorted((w[phase] for w in results), key=lambda r: r["rank"])
            for phase in phases}  # fmt: skip


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {"error": f"no {path.name}"}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _save_and_load(url: str, storage: str, out: Path) -> dict[str, Any]:
    """2 ranks save with dcp.save, then (the job relaunched) load with dcp.load."""
    results = _run(url, storage, out, ["save", "load"])
    saved = results["save"]
    assert saved[0]["step"] == saved[1]["step"]
    assert saved[0]["step"] == STEP  # the loop's step, as the writer was given it
    # each rank saved its share of the (deduplicated) items; the coordinator the metadata
    assert {f"rank_{r}/{DATA_PART}" for r in (0, 1)} <= set(saved[0]["files"])
    assert f"rank_0/{METADATA_PART}" in saved[0]["files"]
    assert f"rank_1/{METADATA_PART}" not in saved[0]["files"]
    # the relaunched job resumed from that checkpoint, and loaded it
    assert [(r["step"], r["resumed"]) for r in results["load"]] == [(saved[0]["step"],) * 2] * 2
    return saved[0]


def _check_loaded(out: Path) -> None:
    for rank in (0, 1):
        expected = torch.load(out / f"saved_{rank}.pt", weights_only=True)
        got = torch.load(out / f"loaded_{rank}.pt", weights_only=True)
        assert _same(expected, got), f"rank {rank}: the loaded state differs from the saved"


# -- the tests --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_local(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Saved:
    """2 ranks saved with dcp.save into local storage, then loaded back (once for the module:
    the tests after it flush Redis, and a relaunched job finds the checkpoint in storage)."""
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
    root = tmp_path_factory.mktemp("dcp-local")
    return root, _save_and_load(redis_server.url, str(root / "ckpt"), root / "out")


def test_two_ranks_save_and_load_back_local(saved_local: Saved) -> None:
    """dcp.save on 2 gloo ranks committed one strata checkpoint; the relaunched job resumed
    from it and dcp.load filled fresh objects with equal tensors (model, Adam state, and each
    rank's own item)."""
    root, saved = saved_local
    _check_loaded(root / "out")
    doc = json.loads((root / "ckpt" / JOB / "checkpoints" / saved["label"] /
                      "metadata.json").read_bytes())  # fmt: skip
    assert doc["world_size"] == 2 and set(doc["files"]) == set(saved["files"])
    assert (doc["epoch"], doc["step"], doc["run"]) == (0, STEP, 0)  # the loop's numbers


def test_two_ranks_save_and_load_back_s3(
    redis_url: str, s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same against a real S3 endpoint (moto server): checkpoint_path=s3://bucket/prefix."""
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # (the workers inherit it)
    admin = boto3.session.Session().client("s3", endpoint_url=s3_endpoint,
                                           region_name="us-east-1")  # fmt: skip
    admin.create_bucket(Bucket="dcp-bucket")
    saved = _save_and_load(redis_url, "s3://dcp-bucket/runs", tmp_path / "out")
    _check_loaded(tmp_path / "out")
    keys = {o["Key"] for o in admin.list_objects_v2(Bucket="dcp-bucket")["Contents"]}
    step_dir = f"runs/{JOB}/checkpoints/{saved['label']}"
    assert {f"{step_dir}/metadata.json", f"{step_dir}/rank_0/{METADATA_PART}",
            f"{step_dir}/rank_1/{DATA_PART}"} <= keys  # fmt: skip
    admin.close()


@pytest.mark.filterwarnings("ignore::UserWarning")  # DCP's "assuming a single process"
def test_a_corrupt_part_fails_the_load_clearly(
    saved_local: Saved, redis_url: str, tmp_path: Path
) -> None:
    """A flipped byte in a committed part fails dcp.load, naming the part and the checksum:
    it never falls back to an older step (whose items would not match the data position the
    job resumed from). Loaded here by one process: DCP reshards the 2 ranks' items."""
    root, saved = saved_local
    shutil.copytree(root / "ckpt", tmp_path / "ckpt")
    step_dir = tmp_path / "ckpt" / JOB / "checkpoints" / saved["label"]
    with strata_redis.TrainingOrchestrator(
        redis_url, "solo", job_id=JOB, checkpoint_path=tmp_path / "ckpt", last_call=0.1
    ) as orch:
        assert orch.resumed is not None and orch.resumed.step == saved["step"]
        model, opt = _trained(seed=1)
        state = {"model": get_state_dict(model, opt)[0]}
        dcp.load(state, storage_reader=strata_torch.StrataStorageReader(orch))  # intact: loads
        expected = torch.load(root / "out" / "saved_0.pt", weights_only=True)
        assert _same(state["model"], expected["model"])

        _flip_a_byte(step_dir / "rank_1" / DATA_PART)
        with (
            pytest.warns(CheckpointSkippedWarning),
            pytest.raises(
                CheckpointException,
                match=rf"part '{DATA_PART}' of rank 1 cannot be read: checkpoint \(epoch 0, "
                rf"step {saved['step']}\) of job '{JOB}' does not verify: rank_1/{DATA_PART}: "
                "checksum crc32:",
            ),
        ):
            dcp.load(state, storage_reader=strata_torch.StrataStorageReader(orch))

        _flip_a_byte(step_dir / "rank_0" / METADATA_PART)
        with (
            pytest.warns(CheckpointSkippedWarning),
            pytest.raises(
                CheckpointException,
                match=rf"part '{METADATA_PART}' of rank 0 cannot be read: .*does not verify: "
                rf"rank_0/{METADATA_PART}: checksum",
            ),
        ):
            dcp.load(state, storage_reader=strata_torch.StrataStorageReader(orch))


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_rank_killed_mid_save_never_commits(redis_url: str, tmp_path: Path) -> None:
    """Rank 1 submits its parts and hangs in its upload; the coordinator has saved the
    metadata and waits for the commit; rank 1 is SIGKILLed: the step is aborted (the round
    broke: heartbeat_timeout), never committed, and the coordinator's dcp.save raises within
    seconds instead of hanging. (What it raises is gloo's "Connection closed by peer": DCP
    hands finish's error to the dead rank first; the strata cause is in writer.future.)"""
    out = tmp_path / "out"
    out.mkdir()
    # 4 s: two torch processes starting on a loaded machine must not be reaped before the
    # kill; the kill is seen within a timeout (two after a stall: lua/reap_workers.lua)
    cfg = {"stall": True, "heartbeat_timeout": 4.0, "commit_timeout": 40.0}
    storage = str(tmp_path / "ckpt")
    procs = [spawn(_dcp_worker, redis_url, f"w{i}", storage, str(out), ["save"], cfg)
             for i in range(2)]  # fmt: skip
    marker = out / "stalled"
    wait_for(marker.exists, 50, why=lambda: [_read_json(out / f"w{i}.json") for i in range(2)])
    (stalled,) = [p for p in procs if p.pid == int(marker.read_text())]
    killed_at = time.time()
    kill9(stalled)
    (survivor,) = [p for p in procs if p is not stalled]
    assert join_all([survivor], 40) == [0]
    results = [r["save"] for r in map(_read_json, out.glob("w*.json")) if "save" in r]
    (result,) = [r for r in results if "raised_at" in r]
    assert result["rank"] == 0, result
    # the kill is seen in 4-8 s; waiting out gloo's 30 s or the 40 s commit timeout is not
    assert result["raised_at"] - killed_at < 20, "dcp.save must not wait out its timeouts"
    assert result["future_error"] == "CheckpointAbortedError", result
    assert not list((tmp_path / "ckpt").rglob("metadata.json")), "the step must not commit"
    with strata_redis.CheckpointManager(tmp_path / "ckpt", job_id=JOB, redis=redis_url) as ckpt:
        assert ckpt.list() == []


@pytest.mark.filterwarnings("ignore::UserWarning")  # DCP's "assuming a single process"
def test_one_rank_round_trip_and_misuse(redis_url: str, tmp_path: Path) -> None:
    with strata_redis.TrainingOrchestrator(
        redis_url, "solo", job_id=JOB, checkpoint_path=tmp_path / "ckpt", last_call=0.1
    ) as orch:
        with pytest.raises(TypeError, match="orchestrator must be a TrainingOrchestrator"):
            strata_torch.StrataStorageWriter(object(), step=1, epoch=0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="step"):
            strata_torch.StrataStorageWriter(orch, step=-1, epoch=0)
        with pytest.raises(TypeError, match="epoch"):
            strata_torch.StrataStorageWriter(orch, step=1, epoch="0")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="metadata"):
            strata_torch.StrataStorageWriter(orch, step=1, epoch=0, metadata=[1])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timeout"):
            strata_torch.StrataStorageWriter(orch, step=1, epoch=0, timeout=0)
        with pytest.raises(ValueError, match="step"):
            strata_torch.StrataStorageReader(orch, step=-2)
        with pytest.raises(CheckpointException, match="did not resume from a checkpoint"):
            dcp.load({"x": torch.zeros(1)}, storage_reader=strata_torch.StrataStorageReader(orch))

        state = {"w": torch.arange(6.0).reshape(2, 3)[:, 1], "blob": {"any": ["object", 1]}}
        writer = strata_torch.StrataStorageWriter(orch, step=3, epoch=0)
        with pytest.raises(ValueError, match="checkpoint_id must be None"):
            dcp.save(state, checkpoint_id="/tmp/elsewhere", storage_writer=writer)
        dcp.save(state, storage_writer=writer)
        assert writer.future is not None and writer.future.done()  # committed on return
        info = writer.future.result()
        assert orch.checkpoints.list()[0].step == info.step
        with pytest.raises(CheckpointException, match="one writer per save"):
            dcp.save(state, storage_writer=writer)

        back: dict[str, Any] = {"w": torch.zeros(2), "blob": {"any": None}}
        reader = strata_torch.StrataStorageReader(orch, step=info.step)
        dcp.load(back, storage_reader=reader)
        assert torch.equal(back["w"], torch.tensor([1.0, 4.0])) and back["blob"] == state["blob"]
        with pytest.raises(CheckpointException, match=r"not a committed checkpoint.*committed "):
            dcp.load(back, storage_reader=strata_torch.StrataStorageReader(orch, step=7))

        # a strata checkpoint not saved through DCP is refused by name
        later = orch.save_checkpoint(step=4, epoch=0, state=b"model")
        assert later is not None
        other = later.result(30).step
        with pytest.raises(CheckpointException, match="not saved by StrataStorageWriter"):
            dcp.load(back, storage_reader=strata_torch.StrataStorageReader(orch, step=other))


class RefusingStorage(LocalStorage):
    """Local storage that refuses DCP data parts (a full disk, say)."""

    def write(self, path: str, data: object) -> None:
        if path.endswith(DATA_PART):
            raise StorageError("no space left", backend=self.describe(), path=path)
        super().write(path, data)


@pytest.mark.filterwarnings("ignore::UserWarning")  # DCP's "assuming a single process"
def test_a_failed_upload_fails_dcp_save_with_the_cause(redis_url: str, tmp_path: Path) -> None:
    with strata_redis.TrainingOrchestrator(
        redis_url, "solo", job_id=JOB, checkpoint_path=RefusingStorage(tmp_path / "ckpt"),
        last_call=0.1,
    ) as orch:  # fmt: skip
        writer = strata_torch.StrataStorageWriter(orch, step=1, epoch=0)
        with pytest.raises(
            CheckpointException,
            match=r"DistributedCheckpointError: dcp.save of \(epoch 0, step 1\) of job 'dcp' by "
            r"rank 0: not committed: CheckpointAbortedError: .*no space left",
        ) as caught:
            dcp.save({"w": torch.ones(2)}, storage_writer=writer)
        (failure, _), *_ = caught.value.failures.values()
        again = pickle.loads(pickle.dumps(failure))  # DCP pickles it to hand it to the others
        assert (type(again), str(again)) == (strata_torch.DistributedCheckpointError, str(failure))
        assert isinstance(writer.future and writer.future.exception(), CheckpointAbortedError)
        assert orch.checkpoints.list() == []
        assert not list((tmp_path / "ckpt").rglob("metadata.json"))

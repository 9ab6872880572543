"""The readers ``perf/bench_shards.py`` measures side by side, each behind one adapter: the raw
floor, strata (``strata_redis.torch.ShardDataset``), litdata, MosaicML streaming and
webdataset; and the corpus they read (one set of samples, written once per store as
webdataset ``.tar`` shards, as MDS shards and as litdata chunks).

Every adapter turns a sample into its 2,048 payload bytes in the ``DataLoader``'s worker and
collates a batch as a plain ``list`` of ``bytes`` (``collate_fn=list``): the same work after
the read for every reader, and the same bytes passed between processes. Each sample starts
with its id (8 bytes, little-endian), so a run can check it saw every sample once.

How each peer is installed on a CPU machine and how its traps are worked around (issue 37):

- MosaicML streaming (``mosaicml-streaming``) requires ``torchvision`` and ``transformers``;
  from PyPI they pull a CUDA build of torch whose ``torchvision`` fails to import against the
  CPU torch. It is installed with ``--no-deps`` and its real dependencies for reading MDS
  (``xxhash<4``, ``zstd``, ``python-snappy`` and its ``cramjam``, ``brotli``, ``catalogue``;
  the ``bench-peers`` extra). ``import streaming`` still imports ``torchvision`` and
  ``transformers`` for its vision/text dataset classes and ``StreamingDataLoader``, none of
  which this bench uses, so :func:`import_streaming` puts stand-in modules holding only
  those names in ``sys.modules``, in this process only and only when the real packages are
  absent (the row's note says so).
- litdata reads S3 through obstore, which refuses a plain-http endpoint (moto's server on
  loopback) unless the client option ``allow_http`` is set; litdata exposes no setting for
  it, so :func:`import_litdata` adds ``allow_http`` to litdata's obstore client options
  (``litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS``) in this process. Its endpoint
  is ``storage_options={"endpoint_url": ...}``. It is installed with ``--no-deps`` beside
  ``lightning-utilities``, ``obstore``, ``tifffile`` (its default deps pull the same CUDA
  torch).
- webdataset has no ``s3://`` opener: :func:`import_webdataset` registers one in its
  ``gopen_schemes`` that streams the object through boto3 (``get_object``'s body, read as a
  file; the same as ``pipe:aws s3 cp s3://... -`` without a process per shard).

A peer that cannot be imported gives a row ``not installed: <why>``, never no row.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

SAMPLE_BYTES = 2048
DATASET = "bench"
BUCKET = "strata-bench-shards"
#: each store's layout: key prefixes in the bucket, directories under the local root
TAR, MDS, LITDATA = "tar", "mds", "litdata"
#: the payload after each sample's 8-byte id: a fixed pseudo-random block, sliced per sample
_POOL = bytes((i * 2654435761 >> 13) & 0xFF for i in range(2 * SAMPLE_BYTES))


def sample(i: int) -> bytes:
    """Sample ``i``: its id (8 bytes, little-endian), then 2,040 bytes of payload."""
    start = (i * 8) % SAMPLE_BYTES
    return i.to_bytes(8, "little") + _POOL[start : start + SAMPLE_BYTES - 8]


def sample_id(payload: bytes) -> int:
    return int.from_bytes(payload[:8], "little")


def shard_name(k: int) -> str:
    return f"shard-{k:06d}.tar"


# -- the corpus ------------------------------------------------------------------------------
@dataclass
class Corpus:
    """``samples`` samples in ``shards`` shards, written under ``root`` (the local store) and,
    with ``endpoint_url``, uploaded to ``BUCKET`` on it (the S3 store)."""

    samples: int
    shards: int
    root: str
    endpoint_url: str | None = None
    formats: dict[str, str] = field(default_factory=dict)  # format -> why it is absent

    @property
    def per_shard(self) -> int:
        return -(-self.samples // self.shards)

    def tar_dir(self) -> str:
        """The webdataset shards: ``{root}/tar/{DATASET}/shards/`` (strata's layout under a
        ``LocalStorage(root/tar)``)."""
        return os.path.join(self.root, TAR, DATASET, "shards")

    def tar_paths(self) -> list[str]:
        return [os.path.join(self.tar_dir(), shard_name(k)) for k in range(self.shards)]

    def tar_keys(self) -> list[str]:
        return [f"{TAR}/{DATASET}/shards/{shard_name(k)}" for k in range(self.shards)]

    def shard_range(self, k: int) -> range:
        return range(k * self.per_shard, min(self.samples, (k + 1) * self.per_shard))


def write_corpus(corpus: Corpus) -> dict[str, float]:
    """Write the tar shards, the MDS shards and the litdata chunks under ``corpus.root``; with
    an endpoint, upload all three to the bucket. Returns seconds per step."""
    took: dict[str, float] = {}
    began = time.perf_counter()
    os.makedirs(corpus.tar_dir(), exist_ok=True)
    for k, path in enumerate(corpus.tar_paths()):
        with open(path, "wb") as out:
            out.write(tar_bytes(corpus.shard_range(k)))
    took["tar"] = time.perf_counter() - began
    for fmt, writer in ((MDS, _write_mds), (LITDATA, _write_litdata)):
        began = time.perf_counter()
        try:
            writer(corpus)
        except ImportError as exc:
            corpus.formats[fmt] = f"not installed: {exc}"
        took[fmt] = time.perf_counter() - began
    if corpus.endpoint_url:
        began = time.perf_counter()
        upload_tree(corpus.endpoint_url, corpus.root)
        took["upload"] = time.perf_counter() - began
    began = time.perf_counter()
    for store in ("local", "s3") if corpus.endpoint_url else ("local",):
        try:
            from strata_redis.shards import index_tar_shards
        except ImportError:
            break
        index_tar_shards(strata_storage(corpus, store), DATASET)  # strata's index, in place
        took[f"strata index ({store})"] = time.perf_counter() - began
    return took


def tar_bytes(ids: range) -> bytes:
    """A webdataset shard: one member ``{id:09d}.bin`` per sample (ustar, no PAX headers)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in ids:
            info = tarfile.TarInfo(f"{i:09d}.bin")
            info.size, info.mode, info.mtime = SAMPLE_BYTES, 0o644, 0
            tar.addfile(info, io.BytesIO(sample(i)))
    return buf.getvalue()


def _write_mds(corpus: Corpus) -> None:
    streaming = import_streaming()
    # a shard closes when the next sample would pass size_limit: per_shard samples each
    limit = corpus.per_shard * (SAMPLE_BYTES + 8) + 64
    out = os.path.join(corpus.root, MDS)
    with streaming.MDSWriter(out=out, columns={"data": "bytes"}, size_limit=limit) as writer:
        for i in range(corpus.samples):
            writer.write({"data": sample(i)})


def _write_litdata(corpus: Corpus) -> None:
    litdata = import_litdata()
    out = os.path.join(corpus.root, LITDATA)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        litdata.optimize(
            fn=sample, inputs=list(range(corpus.samples)), output_dir=out,
            chunk_size=corpus.per_shard, num_workers=1, mode="overwrite", verbose=False,
            start_method="fork",
        )  # fmt: skip


def s3_client(endpoint_url: str) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(max_pool_connections=16, s3={"addressing_style": "path"})
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url, config=config, region_name="us-east-1"
    )


def upload_tree(endpoint_url: str, root: str) -> None:
    """Upload every file under ``root`` to ``BUCKET``, keyed by its path under ``root``."""
    client = s3_client(endpoint_url)
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)
    files = [
        os.path.join(d, f) for d, _, names in os.walk(root) for f in names if not f.startswith(".")
    ]

    def put(path: str) -> None:
        with open(path, "rb") as body:
            client.put_object(Bucket=BUCKET, Key=os.path.relpath(path, root), Body=body.read())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, files))


# -- the peers' imports, with their traps worked around ---------------------------------------
#: what ``import streaming`` imports from torchvision and transformers at module level
_STREAMING_STUBS = {
    "transformers.feature_extraction_utils": ("BatchFeature",),
    "transformers.tokenization_utils_base": ("BatchEncoding",),
    "transformers.models.auto.tokenization_auto": ("AutoTokenizer",),
    "torchvision.datasets": ("VisionDataset", "CIFAR10"),
    "torchvision.transforms.functional": ("to_tensor",),
}
#: set when ``import_streaming`` had to stand in for torchvision or transformers
STUBBED: list[str] = []


def import_streaming() -> Any:
    """``import streaming`` (MosaicML); where torchvision or transformers is absent, first
    stand-in modules with only the names it imports at module level (classes it never uses
    on the MDS reading path this bench takes)."""
    import importlib.util

    if "streaming" not in sys.modules:
        for top in ("torchvision", "transformers"):
            try:
                present = importlib.util.find_spec(top) is not None
            except ValueError:  # a stand-in put there before has no spec
                present = False
            if present:
                continue
            STUBBED.append(top)
            for name, attrs in _STREAMING_STUBS.items():
                if not name.startswith(top + "."):
                    continue
                parts = name.split(".")
                for n in range(1, len(parts) + 1):
                    module = sys.modules.setdefault(
                        ".".join(parts[:n]), types.ModuleType(".".join(parts[:n]))
                    )
                    module.__path__ = []
                for attr in attrs:
                    setattr(module, attr, type(attr, (dict,), {}))
    import streaming

    return streaming


def import_litdata() -> Any:
    """``import litdata``, its obstore client allowed to talk to a plain-http endpoint."""
    import litdata
    from litdata.streaming import downloader

    options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if isinstance(options, dict):
        options["allow_http"] = "true"
    return litdata


def import_webdataset() -> Any:
    """``import webdataset`` with an ``s3://`` opener (boto3, streamed) in its gopen table."""
    import webdataset

    # (``webdataset.gopen`` is also the name of a function the package exports: the module)
    sys.modules["webdataset.gopen"].gopen_schemes["s3"] = _gopen_s3
    return webdataset


_CLIENTS: dict[tuple[int, str], Any] = {}


def _client_here(endpoint_url: str) -> Any:
    """One boto3 client per process (a DataLoader worker makes its own after the fork)."""
    key = (os.getpid(), endpoint_url)
    if key not in _CLIENTS:
        _CLIENTS[key] = s3_client(endpoint_url)
    return _CLIENTS[key]


def _gopen_s3(url: str, mode: str = "rb", bufsize: int = 8192, **_: Any) -> Any:
    bucket, _, key = url[len("s3://") :].partition("/")
    endpoint = os.environ["STRATA_BENCH_S3_ENDPOINT"]
    return _client_here(endpoint).get_object(Bucket=bucket, Key=key)["Body"]


# -- the readers -----------------------------------------------------------------------------
@dataclass
class Run:
    """One reader over one store at one ``num_workers``: what ``loader()`` needs."""

    corpus: Corpus
    store: str  # "local" | "s3"
    num_workers: int
    batch_size: int
    scratch: str  # a fresh directory for caches, removed after the run
    redis_url: str | None = None


class Reader:
    """A reader under test. ``loader(run)`` is an iterable of batches (lists of bytes);
    ``resume(run, samples_done, epoch, prepared)`` returns an iterable whose first batch is
    the one after that position, built from the reader's own resume state (what
    ``prepare_resume`` saved, untimed). ``missing()`` says why the
    reader cannot run, or ``None``."""

    name = ""
    note = ""

    def missing(self) -> str | None:
        return None

    def loader(self, run: Run) -> Any:
        raise NotImplementedError

    def prepare_resume(self, run: Run, samples_done: int, epoch: int) -> Any:
        """What ``resume`` starts from (untimed): the reader's saved state at the position."""
        return None

    def resume(self, run: Run, samples_done: int, epoch: int, prepared: Any) -> Any:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        """The reader's own figures after a run (strata: its prefetch's)."""
        return {}

    def close(self) -> None:
        """Release what a run left (shared memory, jobs)."""


def _loader(dataset: Any, run: Run, **kwargs: Any) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(
        dataset, batch_size=run.batch_size, num_workers=run.num_workers, collate_fn=list,
        **kwargs,
    )  # fmt: skip


def tar_samples(buf: bytes | memoryview, start: int = 0) -> Iterator[bytes]:
    """The file members of a tar held in ``buf``, from byte ``start``: ustar headers read
    directly (the floor does no more than find each member)."""
    view = memoryview(buf)
    pos, end = start, len(view)
    while pos + 512 <= end:
        header = view[pos : pos + 512]
        if header[0] == 0:
            return
        size = int(bytes(header[124:136]).rstrip(b"\0 ") or b"0", 8)
        pos += 512
        if header[156] in (0x30, 0):  # a regular file
            yield bytes(view[pos : pos + size])
        pos += (size + 511) & ~511


class _FloorDataset:
    """The raw floor: each DataLoader worker reads whole shard files (``worker_id``,
    ``worker_id + num_workers``, ...) with one read (local) or one GET (S3) and yields their
    members; from ``(shard, member)`` a resume reads from that member's offset on (members
    are fixed-size here: 512-byte header + 2,048 bytes). No coordination, no shuffle."""

    def __init__(self, run: Run, first: tuple[int, int] = (0, 0)) -> None:
        self.corpus, self.store, self.first = run.corpus, run.store, first

    def _read(self, k: int, offset: int) -> bytes:
        if self.store == "local":
            with open(self.corpus.tar_paths()[k], "rb") as f:
                f.seek(offset)
                return f.read()
        assert self.corpus.endpoint_url
        client = _client_here(self.corpus.endpoint_url)
        extra = {"Range": f"bytes={offset}-"} if offset else {}
        body = client.get_object(Bucket=BUCKET, Key=self.corpus.tar_keys()[k], **extra)["Body"]
        return bytes(body.read())

    def __iter__(self) -> Iterator[bytes]:
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        me, n = (info.id, info.num_workers) if info else (0, 1)
        shard0, member0 = self.first
        for k in range(shard0 + me, self.corpus.shards, n):
            offset = member0 * (512 + SAMPLE_BYTES) if k == shard0 else 0
            yield from tar_samples(self._read(k, offset))


class Floor(Reader):
    name = "raw floor"
    note = "whole-shard reads (one read or GET per shard), tar headers parsed, no coordination"

    def loader(self, run: Run) -> Any:
        from torch.utils.data import IterableDataset

        return _loader(type("Floor", (_FloorDataset, IterableDataset), {})(run), run)

    def resume(self, run: Run, samples_done: int, epoch: int, prepared: Any) -> Any:
        from torch.utils.data import IterableDataset

        per = run.corpus.per_shard
        first = divmod(samples_done, per)
        return _loader(type("Floor", (_FloorDataset, IterableDataset), {})(run, first), run)


class Webdataset(Reader):
    name = "webdataset"

    def missing(self) -> str | None:
        try:
            import_webdataset()
        except ImportError as exc:
            return f"not installed: {exc}"
        return None

    def _dataset(self, run: Run) -> Any:
        wds = import_webdataset()
        if run.store == "local":
            urls = run.corpus.tar_paths()
        else:
            assert run.corpus.endpoint_url
            os.environ["STRATA_BENCH_S3_ENDPOINT"] = run.corpus.endpoint_url
            urls = [f"s3://{BUCKET}/{key}" for key in run.corpus.tar_keys()]
        return wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(_wds_payload)

    def loader(self, run: Run) -> Any:
        return _loader(self._dataset(run), run)

    def resume(self, run: Run, samples_done: int, epoch: int, prepared: Any) -> Any:
        raise NotImplementedError("webdataset has no resume state: skip by iterating")


def _wds_payload(item: dict[str, Any]) -> bytes:
    return bytes(item["bin"])


class Litdata(Reader):
    name = "litdata"

    def missing(self) -> str | None:
        try:
            import_litdata()
        except ImportError as exc:
            return f"not installed: {exc}"
        return None

    def _dataset(self, run: Run) -> Any:
        litdata = import_litdata()
        cache = os.path.join(run.scratch, "litdata-cache")
        if run.store == "local":
            return litdata.StreamingDataset(
                os.path.join(run.corpus.root, LITDATA), cache_dir=cache, shuffle=False,
                transform=bytes,
            )  # fmt: skip
        # (its samples come as memoryviews, which cannot cross to the main process: bytes)
        return litdata.StreamingDataset(
            f"s3://{BUCKET}/{LITDATA}", cache_dir=cache, shuffle=False, transform=bytes,
            storage_options={"endpoint_url": run.corpus.endpoint_url},
        )  # fmt: skip

    def _streaming_loader(self, run: Run) -> Any:
        litdata = import_litdata()
        return litdata.StreamingDataLoader(
            self._dataset(run), batch_size=run.batch_size, num_workers=run.num_workers,
            collate_fn=list,
        )  # fmt: skip

    def loader(self, run: Run) -> Any:
        return self._streaming_loader(run)

    def prepare_resume(self, run: Run, samples_done: int, epoch: int) -> Any:
        # the state its StreamingDataLoader.state_dict() gives after `samples_done` samples of
        # epoch `epoch` (taken after one real batch, then moved to the position)
        loader = self._streaming_loader(run)
        for _ in loader:
            break
        state = loader.state_dict()
        state["current_epoch"] = epoch + 1
        state["num_samples_yielded"] = samples_done
        state["dataset"]["num_samples_yielded"] = samples_done
        state["dataset"]["sample_in_epoch"] = samples_done
        state["dataset"]["current_epoch"] = epoch + 1
        return json.loads(json.dumps(state))

    def resume(self, run: Run, samples_done: int, epoch: int, prepared: Any) -> Any:
        fresh = self._streaming_loader(run)
        fresh.load_state_dict(prepared)
        return fresh


class Mosaic(Reader):
    name = "MosaicML streaming"

    def missing(self) -> str | None:
        try:
            import_streaming()
        except ImportError as exc:
            return f"not installed: {exc}"
        return None

    @property
    def note(self) -> str:  # type: ignore[override]
        return f"stand-in modules for {', '.join(STUBBED)} (absent)" if STUBBED else ""

    def _dataset(self, run: Run) -> Any:
        streaming = import_streaming()
        with contextlib.suppress(Exception):
            streaming.base.util.clean_stale_shared_memory()
        local = os.path.join(run.corpus.root, MDS)
        if run.store == "local":
            return streaming.StreamingDataset(local=local, shuffle=False, batch_size=run.batch_size)
        os.environ["S3_ENDPOINT_URL"] = run.corpus.endpoint_url or ""
        return streaming.StreamingDataset(
            remote=f"s3://{BUCKET}/{MDS}", local=os.path.join(run.scratch, "mds-cache"),
            shuffle=False, batch_size=run.batch_size,
        )  # fmt: skip

    def loader(self, run: Run) -> Any:
        return _loader(_MosaicPayload(self._dataset(run)), run)

    def resume(self, run: Run, samples_done: int, epoch: int, prepared: Any) -> Any:
        dataset = self._dataset(run)
        state = dataset.state_dict(0, True)
        state.update(epoch=epoch, sample_in_epoch=samples_done)
        dataset.load_state_dict(state)
        return _loader(_MosaicPayload(dataset), run)

    def close(self) -> None:
        streaming = sys.modules.get("streaming")
        if streaming is not None:
            with contextlib.suppress(Exception):
                streaming.base.util.clean_stale_shared_memory()


class _MosaicPayload:
    """MosaicML's ``StreamingDataset`` (an ``IterableDataset``), its samples as bytes."""

    def __new__(cls, dataset: Any) -> Any:
        from torch.utils.data import IterableDataset

        class Payload(IterableDataset):  # type: ignore[misc]
            def __init__(self) -> None:
                self.dataset = dataset

            def __iter__(self) -> Iterator[bytes]:
                for item in self.dataset:
                    yield item["data"]

        return Payload()


class Strata(Reader):
    """``strata_redis.torch.ShardDataset`` over the same tar shards, in place (indexed once
    by ``index_tar_shards``), through ``strata_redis.torch.DataLoader``: a job of its own per
    row, one training worker holding the leases, the DataLoader's workers reading them."""

    name = "strata"
    note = "ShardDataset(prefetch=2, field='bin'), its shuffled order"

    def __init__(self) -> None:
        self._open: list[Any] = []
        self.fetch_stats: dict[str, Any] = {}

    def missing(self) -> str | None:
        try:
            import strata_redis.shards  # noqa: F401
            from strata_redis.torch import ShardDataset  # noqa: F401
        except ImportError:
            return "strata_redis.shards not available"
        return None

    def _orchestrator(self, run: Run, job_id: str) -> Any:
        import strata_redis

        assert run.redis_url, "strata needs a Redis"
        orch = strata_redis.TrainingOrchestrator(
            run.redis_url, "w0", job_id=job_id, max_workers=1, last_call=0.01,
            checkpoint_path=os.path.join(run.scratch, "ckpt", job_id),
        )  # fmt: skip
        self._open.append(orch)
        return orch

    def _new_job(self, run: Run) -> str:
        import uuid

        import strata_redis
        from strata_redis.shards import register_shards

        job_id = f"bench-shards-{uuid.uuid4().hex[:8]}"
        manager = strata_redis.ShardManager(run.redis_url, job_id=job_id)
        try:
            register_shards(manager, strata_storage(run.corpus, run.store), DATASET)
        finally:
            manager.job.close()
        return job_id

    def _loader(self, run: Run, orch: Any) -> Any:
        from strata_redis.torch import DataLoader, ShardDataset

        dataset = ShardDataset(
            orch, DATASET, strata_storage(run.corpus, run.store), batch_size=run.batch_size,
            prefetch=2, field="bin",
        )  # fmt: skip
        self._open.insert(0, dataset)
        dataset.set_epoch(orch.epoch)
        self._dataset = dataset
        return DataLoader(dataset, num_workers=run.num_workers, collate_fn=list)

    def loader(self, run: Run) -> Any:
        return self._loader(run, self._orchestrator(run, self._new_job(run)))

    def stats(self) -> dict[str, Any]:
        with contextlib.suppress(Exception):
            return dict(self._dataset.stats())
        return {}

    def prepare_resume(self, run: Run, samples_done: int, epoch: int) -> Any:
        # a job moved to `epoch` (advance_epoch), `samples_done` of it trained (whole batches
        # of the loader, so a few less where a batch ends at a shard's end), a checkpoint of
        # its data position saved; then closed: the resume starts from that checkpoint
        job_id = self._new_job(run)
        orch = self._orchestrator(run, job_id)
        for _ in range(epoch):
            orch.advance_epoch()
        step = 0
        if samples_done:
            trained = 0
            for batch in self._loader(run, orch):
                trained += len(batch)
                step += 1
                if trained + run.batch_size > samples_done:
                    break
        orch.save_checkpoint(step=step, epoch=epoch)
        orch.wait_for_checkpoints(60)
        self.close()
        return job_id

    def resume(self, run: Run, samples_done: int, epoch: int, prepared: Any) -> Any:
        return self._loader(run, self._orchestrator(run, prepared))

    def close(self) -> None:
        for thing in self._open:
            with contextlib.suppress(Exception):
                thing.close()
        self._open.clear()


def strata_storage(corpus: Corpus, store: str) -> Any:
    """The tar shards as a strata ``Storage``: ``LocalStorage(root/tar)`` or the bucket
    under the prefix ``tar``."""
    from strata_redis.storage import LocalStorage, S3Storage

    if store == "local":
        return LocalStorage(os.path.join(corpus.root, TAR))
    return S3Storage(BUCKET, "us-east-1", corpus.endpoint_url, prefix=TAR)


READERS: list[Callable[[], Reader]] = [Floor, Strata, Litdata, Mosaic, Webdataset]


def scratch_dir(base: str) -> str:
    return tempfile.mkdtemp(prefix="run-", dir=base)


def remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)

"""``CheckpointManager``: the checkpoint facade (non-blocking all-or-nothing saves, loads)."""

from __future__ import annotations

import builtins
import os
import socket
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import redis as redis_py

from ..context import HasContext, JobContext
from ..outage import ride_out, riding_out
from ..storage import Storage, as_byte_view, open_storage
from ..storage.base import check_path
from ..validate import check_id, check_int, check_seconds
from .commit import StepProtocol
from .ids import MAX_NUMBER, CheckpointId
from .manifest import CheckpointInfo, check_part_name
from .pipeline import Part, SaveFuture, SavePipeline
from .reader import CheckpointReader, LoadedCheckpoint
from .records import SaveRecord, save_records
from .retention import PruneReport, prune
from .snapshot import DeferredPart, is_immutable

__all__ = ["MAX_STEP", "CheckpointManager", "SaveFuture"]

#: steps, epochs and runs are ints in [0, MAX_STEP] (exact in JSON and Lua numbers)
MAX_STEP = MAX_NUMBER


class CheckpointManager:
    """Saves and loads one job's checkpoints: bytes in storage, coordination in Redis.

    ``save`` takes a snapshot of the bytes (one copy into a reused buffer; none for immutable
    ``bytes`` or with ``copy=False``) and returns at once; the upload runs in the background,
    at most ``max_in_flight`` saves at a time (a further ``save`` waits for room, so memory
    stays flat). A checkpoint commits when ``world_size`` ranks have uploaded and acked it:
    one leader then writes ``metadata.json`` last, and only then marks it committed in
    Redis. A failed upload aborts it for every rank at once; it never becomes visible.
    After each commit the ``keep_count`` newest checkpoints are kept and older ones deleted
    in the background, with the leftovers of crashed saves.

    A checkpoint is the (epoch, step) the caller passed, plus a ``run`` (default 0; the
    orchestrator passes the job's launch): checkpoints are ordered by (run, epoch, step), an
    epoch of None before epoch 0, and each save must come after the newest committed one.
    Its directory is its label: ``step_{S}`` without an epoch, ``epoch_{E}_step_{S}`` with
    one, ``run_{R}_...`` in front for run ``R > 0`` (``checkpoint/ids.py``).

    Layout (``root`` is the storage's)::

        {root}/{job_id}/checkpoints/epoch_2_step_5000/metadata.json
        {root}/{job_id}/checkpoints/epoch_2_step_5000/model.bin            world_size == 1
        {root}/{job_id}/checkpoints/epoch_2_step_5000/rank_{r}/model.bin   world_size > 1
        {root}/{job_id}/checkpoints/step_5000/...                          no epoch given

    Example::

        ckpt = CheckpointManager(path="s3://my-bucket/models", keep_count=5)
        ckpt.save(model_state_bytes, step=5000, epoch=2)    # returns at once
        ckpt.latest()                                # CheckpointInfo(step=5000, epoch=2, ...)
        ckpt.load()                                  # the newest verified model.bin
        ckpt.load(step=5000, epoch=2)                # that checkpoint's model.bin

    Args:
        path: the storage: a ``Storage``, a URL (``s3://bucket/prefix``, ``file:///dir``) or
            a path; None reads the environment (``STORAGE_BACKEND``, ``CHECKPOINT_BUCKET``,
            ``AWS_REGION``, ``LOCAL_STORAGE_PATH``, ``AWS_ENDPOINT_URL``).
        keep_count: how many of the newest committed checkpoints to keep (at least 1).
        job_id: the job; default the ``Job``'s given as ``redis``, else the process's
            default job, as ``connect``'s (``identity.job_id``). It may not contain ``/``
            (it names a storage directory).
        redis: a Redis URL, a ``redis.Redis`` or a ``Job``; default ``$STRATA_REDIS_URL``,
            else ``redis://localhost:6379/0``.
        worker_id: this worker's id; default ``<hostname>:<pid>``. A worker registered in
            the job's registry that fails before acking aborts the step for the others.
        rank: this worker's rank in ``[0, world_size)``; required when ``world_size > 1``.
        world_size: how many ranks save parts of every step (each acks it).
        max_in_flight: saves (snapshots and uploads) in flight at most.
        commit_timeout: seconds a rank waits for the other ranks' acks before aborting.
        progress_interval: a save running longer than this is logged, and again after as long.
        hash_threads: threads checking checksums on load (a large part is hashed in that many
            chunks at once); a save hashes each part on one thread beside its upload.

    Raises:
        TypeError, ValueError: a bad argument, named in the message.
    """

    def __init__(
        self,
        path: Storage | str | os.PathLike[str] | None = None,
        keep_count: int = 5,
        *,
        job_id: str | None = None,
        redis: str | redis_py.Redis | JobContext | HasContext | None = None,
        worker_id: str | None = None,
        rank: int | None = None,
        world_size: int = 1,
        max_in_flight: int = 2,
        commit_timeout: float = 600.0,
        progress_interval: float = 30.0,
        hash_threads: int = 2,
    ) -> None:
        self.keep_count = check_int("keep_count", keep_count, low=1, high=1_000_000)
        self.world_size = check_int("world_size", world_size, low=1, high=100_000)
        if rank is None:
            if self.world_size > 1:
                raise ValueError(f"rank must be given when world_size > 1 (got {world_size})")
            rank = 0
        self.rank = check_int("rank", rank, low=0, high=self.world_size - 1)
        self.max_in_flight = check_int("max_in_flight", max_in_flight, low=1, high=64)
        self.commit_timeout = check_seconds("commit_timeout", commit_timeout, high=7 * 86400)
        self.progress_interval = check_seconds("progress_interval", progress_interval, high=86400)
        hash_threads = check_int("hash_threads", hash_threads, low=1, high=64)
        if worker_id is None:
            worker_id = f"{socket.gethostname()[:100]}:{os.getpid()}"
        self.worker_id = check_id("worker_id", worker_id)
        self._owns_client = not isinstance(redis, (JobContext, HasContext, redis_py.Redis))
        self.context = JobContext(redis, job_id)
        self.job_id = self.context.job_id
        if "/" in self.job_id:
            raise ValueError(f"job_id must not contain '/' (it names a directory), got {job_id!r}")
        check_path(self.job_id, arg="job_id")
        self._owns_storage = not isinstance(path, Storage)
        self.storage = open_storage(path)

        self._hasher = ThreadPoolExecutor(hash_threads, thread_name_prefix="strata-ckpt-hash")
        self.protocol = StepProtocol(
            self.context, self.storage, worker_id=self.worker_id, rank=self.rank,
            world_size=self.world_size,
        )  # fmt: skip
        self.pipeline = SavePipeline(
            self.context, self.storage, self.protocol, keep_count=self.keep_count,
            max_in_flight=self.max_in_flight, commit_timeout=self.commit_timeout,
            progress_interval=self.progress_interval, hasher=self._hasher,
        )  # fmt: skip
        self.reader = CheckpointReader(self.storage, self.context, self._hasher, hash_threads)
        self._indexed = False
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"CheckpointManager(job_id={self.job_id!r}, storage={self.storage.describe()!r}, "
            f"keep_count={self.keep_count}, rank={self.rank}, world_size={self.world_size})"
        )

    # -- saving ------------------------------------------------------------------------------
    def save(
        self,
        data: object,
        step: int,
        epoch: int | None = None,
        name: str = "model.bin",
        *,
        copy: bool = True,
        run: int = 0,
    ) -> SaveFuture:
        """Snapshot ``data`` and save it as this rank's part of checkpoint (epoch, step) in the
        background.

        Returns once the snapshot is taken (after waiting for room when ``max_in_flight``
        saves are running). The checkpoint commits when every rank has acked it.

        Args:
            data: the bytes: any C-contiguous buffer (``bytes``, ``bytearray``,
                ``memoryview``, a numpy array), or a mapping of part name -> buffer to save
                several parts in one step. A mapping's value may also be a
                ``checkpoint.snapshot.DeferredPart``: its bytes are made on the upload
                thread (``strata_redis.torch.save`` serializes tensors that way).
            step: the training step, an int in ``[0, 2**53]``; (run, epoch, step) must come
                after every checkpoint this manager saved and the job's newest committed one.
            epoch: the epoch, an int in ``[0, 2**53]`` or None (every rank must pass the
                same); it names the checkpoint with the step (``epoch_{E}_step_{S}``).
            name: the part's name when ``data`` is one buffer (a relative path such as
                ``model.bin``; ``metadata.json`` and ``rank_<N>/...`` are reserved).
            copy: False hands the buffer over: it is saved without a copy and must not
                change until the save is done. ``bytes`` are never copied (they cannot change).
            run: the job's launch, an int in ``[0, 2**53]`` (``checkpoint/ids.py``): a
                relaunched job that counts its steps from 0 again passes the run it resumed
                from + 1, so its checkpoints come after the old ones.

        Returns:
            A future of the committed checkpoint's :class:`CheckpointInfo`.

        Raises:
            TypeError: ``data`` is not a buffer (or mapping of buffers), or a bad argument type.
            ValueError: a negative or too large number, a checkpoint not after the newest one
                (``StepNotForwardError``), empty ``data``, or a bad part name.
            RuntimeError: the manager is closed.
        """
        if self._closed:
            raise RuntimeError("this CheckpointManager is closed")
        cid = CheckpointId(step, epoch, run)  # checks each number, naming it
        if not isinstance(copy, bool):
            raise TypeError(f"copy must be a bool, got {type(copy).__name__} {copy!r}")
        views = _parts(data, name)
        what = f"checkpoint {cid} save of {self.worker_id!r}"
        newest = ride_out(self.context, what, self._newest)
        return self.pipeline.submit(cid, views, copy, newest)

    def wait(self, timeout: float | None = None) -> None:
        """Wait until every save in flight is done and retention has caught up.

        Failed saves do not raise here; their futures hold the errors.

        Raises:
            TimeoutError: ``timeout`` seconds passed first.
        """
        self.pipeline.wait(timeout)

    def abort_pending(self, reason: str) -> builtins.list[CheckpointId]:
        """Abort every checkpoint this manager has in flight and not committed, for every rank.

        For when the ranks this one waits for will never ack (the group broke up): the
        saves fail at once with ``CheckpointAbortedError`` instead of after
        ``commit_timeout``. One being committed by its leader is left alone.

        Args:
            reason: why, recorded with the abort (1 to 1000 characters).

        Returns:
            The checkpoints aborted.
        """
        if not isinstance(reason, str) or not reason:
            raise ValueError(f"reason must be a non-empty str, got {reason!r}")
        return self.pipeline.abort_pending(reason)

    def prune(self) -> PruneReport:
        """Run a retention pass now, on this thread (one also runs after every commit).

        Returns:
            What was kept and deleted.
        """
        return prune(self.storage, self.context, self.keep_count)

    # -- reading -------------------------------------------------------------------------------
    @riding_out
    def list(self) -> list[CheckpointInfo]:
        """Every committed checkpoint of the job, newest first (from the Redis index)."""
        return self.reader.list()

    @riding_out
    def latest(self) -> CheckpointInfo | None:
        """The newest committed checkpoint whose metadata.json and files are in storage, or
        None.

        Those that are not (a partial or half-deleted checkpoint) are skipped with a
        ``CheckpointSkippedWarning``.
        """
        return self.reader.latest()

    def load(
        self,
        step: int | None = None,
        name: str = "model.bin",
        rank: int | None = None,
        *,
        epoch: int | None = None,
        run: int | None = None,
    ) -> bytes:
        """The bytes of a part of the newest committed checkpoint that verifies, among those
        with the given step, epoch and run (None: any).

        Each candidate's part is checked against its metadata.json (size and CRC-32); a
        partial, uncommitted or corrupt checkpoint is skipped with a
        ``CheckpointSkippedWarning`` and the next older one is tried.

        Args:
            step: the loop's step to load; None: any.
            name: the part's name.
            rank: whose part; default this manager's rank.
            epoch: the epoch to load; None: any (``load(step=200)`` loads the newest
                checkpoint of step 200, whatever its epoch).
            run: the run to load; None: the newest that has the checkpoint.

        Returns:
            The part's bytes.

        Raises:
            CheckpointNotFoundError: no committed checkpoint (with those numbers) holds a
                valid copy.
            ValueError: no committed checkpoint has a part ``name``; a bad argument.
        """
        return self.load_checkpoint(step, name, rank, epoch=epoch, run=run).data

    @riding_out
    def load_checkpoint(
        self,
        step: int | None = None,
        name: str = "model.bin",
        rank: int | None = None,
        *,
        epoch: int | None = None,
        run: int | None = None,
    ) -> LoadedCheckpoint:
        """Like ``load``, with the checkpoint it came from (``.info.step``, ``.info.epoch``).

        Raises:
            CheckpointNotFoundError, ValueError: as ``load``.
        """
        step, epoch, run = _numbers(step, epoch, run)
        name = check_part_name(name)
        rank = self.rank if rank is None else check_int("rank", rank, low=0, high=100_000)
        return self.reader.load(step, name, rank, epoch, run)

    @riding_out
    def verify(
        self, step: int, *, epoch: int | None = None, run: int | None = None
    ) -> CheckpointInfo:
        """Read every file of the newest committed checkpoint of ``step`` (and ``epoch``,
        ``run`` when given) and check sizes and checksums.

        Raises:
            CheckpointError: there is none, or it does not verify (the message says which
                file and why).
        """
        step = check_step(step)
        _, epoch, run = _numbers(None, epoch, run)
        return self.reader.verify(step, epoch, run)

    @riding_out
    def rebuild_index(self) -> builtins.list[CheckpointId]:
        """Rebuild the Redis index from the metadata.json files in storage.

        Done automatically when Redis holds no index (a new or flushed server).

        Returns:
            The committed checkpoints in storage, newest first.
        """
        ids = self.reader.rebuild_index()
        self._indexed = True
        return ids

    @riding_out
    def records(self, count: int = 100) -> builtins.list[SaveRecord]:
        """The job's newest save records (bytes, seconds, MB/s per rank and checkpoint),
        oldest first."""
        return save_records(self.context, count)

    def _ensure_index(self) -> None:
        if not self._indexed:
            self.reader.ensure_index()
            self._indexed = True

    def _newest(self) -> CheckpointId | None:
        """The job's newest committed checkpoint (the index built first, if it is not)."""
        self._ensure_index()
        return self.reader.newest_id()

    # -- lifetime --------------------------------------------------------------------------
    def close(self, wait: bool = True) -> None:
        """Stop: wait for the saves in flight (if ``wait``), release buffers and threads.

        The storage and Redis client are closed if this manager opened them.
        """
        if self._closed:
            return
        self._closed = True
        self.pipeline.close(wait)
        self._hasher.shutdown(wait=wait)
        if self._owns_storage:
            self.storage.close()
        if self._owns_client:
            self.context.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_step(step: object, *, arg: str = "step") -> int:
    """Return ``step`` if it is an int (not a bool) in ``[0, MAX_STEP]``, else raise naming it."""
    return check_int(arg, step, low=0, high=MAX_STEP)


def _numbers(
    step: int | None, epoch: int | None, run: int | None
) -> tuple[int | None, int | None, int | None]:
    """A lookup's numbers, each checked (None: any)."""
    return (
        None if step is None else check_step(step),
        None if epoch is None else check_step(epoch, arg="epoch"),
        None if run is None else check_step(run, arg="run"),
    )


def _parts(data: object, name: str) -> dict[str, Part]:
    """The parts to save: name -> (flat byte view, whether the bytes are immutable), or a
    ``DeferredPart`` as it is."""
    if isinstance(data, Mapping):
        if not data:
            raise ValueError("data must not be an empty mapping of parts")
        items = list(data.items())
        where = "data"
    else:
        items = [(name, data)]
        where = None
    parts: dict[str, Part] = {}
    for part, buf in items:
        check_part_name(part, arg="part name" if where else "name")
        if isinstance(buf, DeferredPart):
            parts[part] = buf
            continue
        arg = f"data[{part!r}]" if where else "data"
        view = as_byte_view(buf, arg=arg)
        if not len(view):
            raise ValueError(f"{arg} must not be empty (got 0 bytes)")
        parts[part] = (view, is_immutable(buf))
    return parts

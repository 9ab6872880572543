"""CheckpointManager: non-blocking, all-or-nothing checkpoint saves to S3 or local disk."""

from __future__ import annotations

import builtins
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import redis as redis_py

from .checksum import PendingCrc, format_checksum
from .commit import StepProtocol
from .errors import CheckpointAbortedError, CheckpointError
from .job import Job
from .manifest import (
    METADATA,
    CheckpointInfo,
    FileEntry,
    check_part_name,
    part_path,
    step_dir,
)
from .reader import CheckpointReader, LoadedCheckpoint
from .records import SaveRecord, save_records
from .retention import PruneReport, prune
from .snapshot import BufferPool, Snapshot, is_immutable
from .storage import Storage, as_byte_view, open_storage
from .storage.base import check_path
from .validate import check_id, check_int, check_seconds

__all__ = ["MAX_STEP", "CheckpointManager", "SaveFuture"]

log = logging.getLogger("strata_redis.checkpoint")

#: steps are ints in [0, MAX_STEP] (Redis sorted-set scores are exact up to 2**53)
MAX_STEP = 2**53


class SaveFuture(Future[CheckpointInfo]):
    """The handle ``save`` returns: a ``concurrent.futures.Future`` of the committed step.

    ``result()`` waits for the commit and returns the step's :class:`CheckpointInfo`, or
    raises why the save failed (``CheckpointAbortedError`` when the step was aborted).

    Attributes:
        step: the step being saved.
        nbytes: the bytes this worker saves.
        phase: ``queued``, ``uploading``, ``waiting`` (for the other ranks' acks),
            ``committing``, ``committed`` or ``failed``.
        started: when ``save`` was called (``time.monotonic()``).
    """

    def __init__(
        self, step: int, nbytes: int, after: threading.Event, acked: threading.Event
    ) -> None:
        super().__init__()
        self.step = step
        self.nbytes = nbytes
        self.phase = "queued"
        self.started = time.monotonic()
        self._after = after  # the previous save's "acked"
        self._acked = acked


class CheckpointManager:
    """Saves and loads one job's checkpoints: bytes in storage, coordination in Redis.

    ``save`` takes a snapshot of the bytes (one copy into a reused buffer; none for immutable
    ``bytes`` or with ``copy=False``) and returns at once; the upload runs in the background,
    at most ``max_in_flight`` saves at a time (a further ``save`` waits for room, so memory
    stays flat). A step commits when ``world_size`` ranks have uploaded and acked it: one
    leader then writes ``metadata.json`` last, and only then marks the step committed in
    Redis. A failed upload aborts the step for every rank at once; it never becomes visible.
    After each commit the ``keep_count`` newest steps are kept and older ones deleted in the
    background, with the leftovers of crashed saves.

    Layout (``root`` is the storage's)::

        {root}/{job_id}/checkpoints/step_{N}/metadata.json
        {root}/{job_id}/checkpoints/step_{N}/model.bin            world_size == 1
        {root}/{job_id}/checkpoints/step_{N}/rank_{r}/model.bin   world_size > 1

    Example::

        ckpt = CheckpointManager(path="s3://my-bucket/models", keep_count=5)
        ckpt.save(model_state_bytes, step=5000, epoch=2)    # returns at once
        ckpt.latest()                                       # CheckpointInfo(step=5000, ...)
        ckpt.load()                                         # the newest verified model.bin

    Args:
        path: the storage: a ``Storage``, a URL (``s3://bucket/prefix``, ``file:///dir``) or
            a path; None reads the environment (``STORAGE_BACKEND``, ``CHECKPOINT_BUCKET``,
            ``AWS_REGION``, ``LOCAL_STORAGE_PATH``, ``AWS_ENDPOINT_URL``).
        keep_count: how many of the newest committed steps to keep (at least 1).
        job_id: the job; default the ``Job``'s given as ``redis``, else ``$STRATA_JOB_ID``,
            else ``"default"``. It may not contain ``/`` (it names a storage directory).
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
        redis: str | redis_py.Redis | Job | None = None,
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
        if job_id is None and isinstance(redis, Job):
            job_id = redis.job_id
        self._owns_job = not isinstance(redis, (Job, redis_py.Redis))
        self.job = Job(redis, job_id)
        if "/" in self.job.job_id:
            raise ValueError(f"job_id must not contain '/' (it names a directory), got {job_id!r}")
        check_path(self.job.job_id, arg="job_id")
        self._owns_storage = not isinstance(path, Storage)
        self.storage = open_storage(path)

        self._hasher = ThreadPoolExecutor(hash_threads, thread_name_prefix="strata-ckpt-hash")
        self._uploads = ThreadPoolExecutor(max_in_flight, thread_name_prefix="strata-ckpt-save")
        self._retention = ThreadPoolExecutor(1, thread_name_prefix="strata-ckpt-retention")
        self._pool = BufferPool(max_in_flight)
        self._room = threading.BoundedSemaphore(max_in_flight)
        self._lock = threading.Lock()
        self._in_flight: set[SaveFuture] = set()
        self._last_step: int | None = None
        # Set once the previous save acked (or failed): acks go out in step order, so a step
        # can only commit after every rank acked the earlier ones (see _save_step).
        self._previous_acked = threading.Event()
        self._previous_acked.set()
        self._retention_queued = False
        self._last_retention: Future[Any] | None = None
        self._indexed = False
        self._closed = False
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self.protocol = StepProtocol(
            self.job, self.storage, worker_id=self.worker_id, rank=self.rank,
            world_size=self.world_size,
        )  # fmt: skip
        self.reader = CheckpointReader(self.storage, self.job, self._hasher, hash_threads)

    def __repr__(self) -> str:
        return (
            f"CheckpointManager(job_id={self.job.job_id!r}, storage={self.storage.describe()!r}, "
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
    ) -> SaveFuture:
        """Snapshot ``data`` and save it as this rank's part of ``step`` in the background.

        Returns once the snapshot is taken (after waiting for room when ``max_in_flight``
        saves are running). The step commits when every rank has acked it.

        Args:
            data: the bytes: any C-contiguous buffer (``bytes``, ``bytearray``,
                ``memoryview``, a numpy array), or a mapping of part name -> buffer to save
                several parts in one step.
            step: the training step, an int in ``[0, 2**53]``, after every step this
                manager saved and after the job's newest committed step.
            epoch: the epoch, recorded in the metadata (every rank must pass the same).
            name: the part's name when ``data`` is one buffer (a relative path such as
                ``model.bin``; ``metadata.json`` and ``rank_<N>/...`` are reserved).
            copy: False hands the buffer over: it is saved without a copy and must not
                change until the save is done. ``bytes`` are never copied (they cannot change).

        Returns:
            A future of the committed step's :class:`CheckpointInfo`.

        Raises:
            TypeError: ``data`` is not a buffer (or mapping of buffers), or a bad argument type.
            ValueError: a negative, too large or backwards ``step``, empty ``data``, or a bad
                part name.
            RuntimeError: the manager is closed.
        """
        if self._closed:
            raise RuntimeError("this CheckpointManager is closed")
        step = check_step(step)
        if epoch is not None:
            epoch = check_int("epoch", epoch, low=0, high=MAX_STEP)
        if not isinstance(copy, bool):
            raise TypeError(f"copy must be a bool, got {type(copy).__name__} {copy!r}")
        views = _parts(data, name)
        self._ensure_index()
        newest = self.reader.newest_step()
        with self._lock:
            if self._last_step is not None and step <= self._last_step:
                raise ValueError(
                    f"step must go forward: got step={step}, but this manager already saved "
                    f"step {self._last_step}"
                )
            if newest is not None and step <= newest:
                raise ValueError(
                    f"step must go forward: got step={step}, but job {self.job.job_id!r} "
                    f"already committed step {newest}"
                )
            self._last_step = step
            after, acked = self._previous_acked, threading.Event()
            self._previous_acked = acked
        nbytes = sum(len(v) for v, _ in views.values())
        future = SaveFuture(step, nbytes, after, acked)
        snapshots: dict[str, Snapshot] = {}
        room = False
        try:
            self._room.acquire()  # waits while max_in_flight saves are running
            room = True
            started = time.monotonic()
            for part, (view, immutable) in views.items():
                snapshots[part] = Snapshot(view) if immutable or not copy else self._pool.copy(view)
            with self._lock:
                self._in_flight.add(future)
            self._start_monitor()
            self._uploads.submit(self._run_save, future, step, epoch, snapshots, started)
        except BaseException:
            for snap in snapshots.values():
                snap.release()
            with self._lock:
                self._in_flight.discard(future)
            acked.set()  # later saves must not wait for this one's ack
            if room:
                self._room.release()
            raise
        return future

    def _run_save(
        self,
        future: SaveFuture,
        step: int,
        epoch: int | None,
        snapshots: dict[str, Snapshot],
        started: float,
    ) -> None:
        try:
            future.phase = "uploading"
            info = self._save_step(future, step, epoch, snapshots, started)
            future.phase = "committed"
            future.set_result(info)
        except BaseException as exc:
            future.phase = "failed"
            log.warning("checkpoint step %s of job %r failed: %s", step, self.job.job_id, exc)
            future.set_exception(exc)
        finally:
            future._acked.set()
            for snap in snapshots.values():
                snap.release()
            with self._lock:
                self._in_flight.discard(future)
            self._room.release()

    def _save_step(
        self,
        future: SaveFuture,
        step: int,
        epoch: int | None,
        snapshots: dict[str, Snapshot],
        started: float,
    ) -> CheckpointInfo:
        base = step_dir(self.job.job_id, step)
        try:
            if self.storage.exists(f"{base}/{METADATA}"):
                raise CheckpointError(
                    f"step {step} of job {self.job.job_id!r} is already committed in "
                    f"{self.storage.describe()} (the Redis index was behind; it is not "
                    "overwritten)", job_id=self.job.job_id, step=step,
                )  # fmt: skip
            self.protocol.begin(step, epoch)
            files = self._upload(base, snapshots)
        except Exception as exc:
            # Whatever stops this rank stops the step, for every rank at once (the abort
            # does nothing to a step that is committed, or that a leader is committing).
            seconds = time.monotonic() - started
            reason = f"rank {self.rank} could not save its parts: {exc}"
            self.protocol.abort(step, reason, future.nbytes, seconds)
            if isinstance(exc, CheckpointError):
                raise
            raise CheckpointAbortedError(
                f"step {step} of job {self.job.job_id!r} was aborted by worker "
                f"{self.worker_id!r}: {reason}", job_id=self.job.job_id, step=step,
            ) from exc  # fmt: skip
        for snap in snapshots.values():
            snap.release()  # the bytes are stored: free the buffer before waiting on others
        seconds = time.monotonic() - started
        # Ack after the previous save acked: with saves overlapping, step N+1 could otherwise
        # commit first, and step N could never commit (steps must go forward).
        future._after.wait()
        led = self.protocol.ack(step, files, future.nbytes, seconds)
        future._acked.set()
        if led is None:
            future.phase = "waiting"
            return self.protocol.wait(step, epoch, self.commit_timeout)
        future.phase = "committing"
        acked_ms, acks = led
        info = self.protocol.commit(step, epoch, acked_ms, acks)
        total = time.monotonic() - started
        log.info(
            "checkpoint step %s of job %r committed: %d files, %.1f MB in %.2f s (%.0f MB/s)",
            step, self.job.job_id, len(info.files), info.nbytes / 1e6, total,
            info.nbytes / 1e6 / total if total > 0 else 0.0,
        )  # fmt: skip
        self._schedule_retention()
        return info

    def _upload(self, base: str, snapshots: dict[str, Snapshot]) -> dict[str, FileEntry]:
        files: dict[str, FileEntry] = {}
        for name, snap in snapshots.items():
            path = part_path(name, self.rank, self.world_size)
            # The checksum runs on one other thread while this one writes (both release the
            # GIL): on two cores, the writer and one hasher (measured: a second hasher thread
            # slows the write more than it speeds the checksum).
            crc = PendingCrc(snap.view, self._hasher, 1)
            try:
                self.storage.write(f"{base}/{path}", snap.view)
            finally:
                checksum = format_checksum(crc.result())  # before the buffer can be reused
            files[path] = FileEntry(path, name, self.rank, len(snap.view), checksum)
        return files

    # -- background work -----------------------------------------------------------------------
    def _schedule_retention(self) -> None:
        with self._lock:
            if self._retention_queued or self._closed:
                return
            self._retention_queued = True
            self._last_retention = self._retention.submit(self._retention_pass)

    def _retention_pass(self) -> None:
        with self._lock:
            self._retention_queued = False
        try:
            prune(self.storage, self.job, self.keep_count)
        except Exception as exc:  # a background pass must not die; the next one carries on
            log.warning("checkpoint retention of job %r failed: %s", self.job.job_id, exc)

    def _start_monitor(self) -> None:
        with self._lock:
            if self._monitor is not None:
                return
            self._monitor = threading.Thread(
                target=self._watch, name="strata-ckpt-progress", daemon=True
            )
        self._monitor.start()

    def _watch(self) -> None:
        """Log saves that run long, so a slow upload is visible in the training logs."""
        tick = min(self.progress_interval, 5.0)
        reported: dict[SaveFuture, float] = {}
        while not self._stop.wait(tick):
            now = time.monotonic()
            with self._lock:
                running = list(self._in_flight)
            for future in running:
                age = now - future.started
                if age >= reported.get(future, 0.0) + self.progress_interval:
                    reported[future] = age
                    log.info(
                        "checkpoint step %s of job %r still %s after %.0f s (%.1f MB)",
                        future.step, self.job.job_id, future.phase, age, future.nbytes / 1e6,
                    )  # fmt: skip
            reported = {f: t for f, t in reported.items() if f in running}

    def wait(self, timeout: float | None = None) -> None:
        """Wait until every save in flight is done and retention has caught up.

        Failed saves do not raise here; their futures hold the errors.

        Raises:
            TimeoutError: ``timeout`` seconds passed first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                running = list(self._in_flight)
                retention = self._last_retention
            pending: list[Future[Any]] = [*running, *([retention] if retention else [])]
            if all(f.done() for f in pending):
                return
            for f in pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"checkpoint saves still running after {timeout} s")
                try:
                    f.exception(left)
                except TimeoutError:
                    raise TimeoutError(
                        f"checkpoint saves still running after {timeout} s"
                    ) from None

    def prune(self) -> PruneReport:
        """Run a retention pass now, on this thread (one also runs after every commit).

        Returns:
            What was kept and deleted.
        """
        return prune(self.storage, self.job, self.keep_count)

    # -- reading -------------------------------------------------------------------------------
    def list(self) -> list[CheckpointInfo]:
        """Every committed step of the job, newest first (from the Redis index)."""
        return self.reader.list()

    def latest(self) -> CheckpointInfo | None:
        """The newest committed step whose metadata.json and files are in storage, or None.

        Steps that are not (a partial or half-deleted step) are skipped with a
        ``CheckpointSkippedWarning``.
        """
        return self.reader.latest()

    def load(
        self, step: int | None = None, name: str = "model.bin", rank: int | None = None
    ) -> bytes:
        """The bytes of a part of the newest committed step that verifies (or of ``step``).

        Each candidate's part is checked against its metadata.json (size and CRC-32); a
        partial, uncommitted or corrupt step is skipped with a ``CheckpointSkippedWarning``
        and the next older one is tried.

        Args:
            step: a step to load; None for the newest that verifies.
            name: the part's name.
            rank: whose part; default this manager's rank.

        Returns:
            The part's bytes.

        Raises:
            CheckpointNotFoundError: no committed step (or not ``step``) holds a valid copy.
            ValueError: no committed step has a part ``name``; a bad argument.
        """
        return self.load_checkpoint(step, name, rank).data

    def load_checkpoint(
        self, step: int | None = None, name: str = "model.bin", rank: int | None = None
    ) -> LoadedCheckpoint:
        """Like ``load``, with the step it came from (``.info.step``, ``.info.epoch``).

        Raises:
            CheckpointNotFoundError, ValueError: as ``load``.
        """
        if step is not None:
            step = check_step(step)
        name = check_part_name(name)
        rank = self.rank if rank is None else check_int("rank", rank, low=0, high=100_000)
        return self.reader.load(step, name, rank)

    def verify(self, step: int) -> CheckpointInfo:
        """Read every file of committed ``step`` and check sizes and checksums.

        Raises:
            CheckpointError: the step does not verify (the message says which file and why).
        """
        return self.reader.verify(check_step(step))

    def rebuild_index(self) -> builtins.list[int]:
        """Rebuild the Redis index from the metadata.json files in storage.

        Done automatically when Redis holds no index (a new or flushed server).

        Returns:
            The committed steps in storage, newest first.
        """
        steps = self.reader.rebuild_index()
        self._indexed = True
        return steps

    def records(self, count: int = 100) -> builtins.list[SaveRecord]:
        """The job's newest save records (bytes, seconds, MB/s per rank and step), oldest first."""
        return save_records(self.job, count)

    def _ensure_index(self) -> None:
        if not self._indexed:
            self.reader.ensure_index()
            self._indexed = True

    # -- lifetime --------------------------------------------------------------------------
    def close(self, wait: bool = True) -> None:
        """Stop: wait for the saves in flight (if ``wait``), release buffers and threads.

        The storage and Redis client are closed if this manager opened them.
        """
        if self._closed:
            return
        if wait:
            self.wait()
        with self._lock:
            self._closed = True
        self._stop.set()
        self._uploads.shutdown(wait=wait)
        self._retention.shutdown(wait=wait)
        self._hasher.shutdown(wait=wait)
        self._pool.clear()
        if self._owns_storage:
            self.storage.close()
        if self._owns_job:
            self.job.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_step(step: object, *, arg: str = "step") -> int:
    """Return ``step`` if it is an int (not a bool) in ``[0, MAX_STEP]``, else raise naming it."""
    return check_int(arg, step, low=0, high=MAX_STEP)


def _parts(data: object, name: str) -> dict[str, tuple[memoryview, bool]]:
    """The parts to save: name -> (flat byte view, whether the bytes are immutable)."""
    if isinstance(data, Mapping):
        if not data:
            raise ValueError("data must not be an empty mapping of parts")
        items = list(data.items())
        where = "data"
    else:
        items = [(name, data)]
        where = None
    parts = {}
    for part, buf in items:
        check_part_name(part, arg="part name" if where else "name")
        arg = f"data[{part!r}]" if where else "data"
        view = as_byte_view(buf, arg=arg)
        if not len(view):
            raise ValueError(f"{arg} must not be empty (got 0 bytes)")
        parts[part] = (view, is_immutable(buf))
    return parts

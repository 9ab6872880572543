"""The save pipeline: snapshots, background uploads in order, acks, commits, retention.

``CheckpointManager.save`` validates its arguments and hands the parts here: ``submit``
takes the snapshot (the only work on the caller's thread), and a pool of upload threads
writes the parts, acks them through the commit protocol (``commit.py``) in (run, epoch,
step) order, and, on the leader, commits the checkpoint. After a commit one retention pass
is queued. A monitor thread logs saves that run long.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..context import JobContext
from ..errors import CheckpointAbortedError, CheckpointError, StepNotForwardError
from ..storage import Storage
from .checksum import crc32_chunks, format_checksum
from .commit import StepProtocol
from .ids import CheckpointId
from .manifest import METADATA, CheckpointInfo, FileEntry, checkpoint_dir, part_path
from .retention import prune
from .snapshot import BufferPool, DeferredPart, DeferredSnapshot, Snapshot

#: a part as ``submit`` takes it: (flat byte view, whether the bytes are immutable), or a part
#: made on the upload thread
Part = tuple[memoryview, bool] | DeferredPart

__all__ = ["SaveFuture", "SavePipeline"]

log = logging.getLogger("strata_redis.checkpoint")


class SaveFuture(Future[CheckpointInfo]):
    """The handle ``save`` returns: a ``concurrent.futures.Future`` of the committed checkpoint.

    ``result()`` waits for the commit and returns the checkpoint's :class:`CheckpointInfo`,
    or raises why the save failed (``CheckpointAbortedError`` when it was aborted).

    Attributes:
        checkpoint: the checkpoint being saved (``.step``, ``.epoch``, ``.run``, ``.label``).
        step: its step (the loop's).
        nbytes: the bytes this worker saves (for a part made on the upload thread, its size
            hint until it is made).
        phase: ``queued``, ``uploading``, ``waiting`` (for the other ranks' acks),
            ``committing``, ``committed`` or ``failed``.
        started: when ``save`` was called (``time.monotonic()``).

    A save cannot be cancelled: ``cancel()`` returns False (it would not stop the upload or
    the commit, which go on whatever the future says).
    """

    def __init__(
        self, checkpoint: CheckpointId, nbytes: int, after: threading.Event, acked: threading.Event
    ) -> None:
        super().__init__()
        self.set_running_or_notify_cancel()  # (cancel() is refused from here on)
        self.checkpoint = checkpoint
        self.step = checkpoint.step
        self.nbytes = nbytes
        self.phase = "queued"
        self.started = time.monotonic()
        self._after = after  # the previous save's "acked"
        self._acked = acked


class SavePipeline:
    """One rank's saves in flight: at most ``max_in_flight`` snapshots and uploads at a time.

    Args:
        ctx: the job.
        storage: where the parts go.
        protocol: this rank's side of the commit protocol.
        keep_count: retention's ``keep_count``.
        max_in_flight: saves (snapshots and uploads) in flight at most.
        commit_timeout: seconds a rank waits for the other ranks' acks before aborting.
        progress_interval: a save running longer than this is logged, and again after as long.
        hasher: the threads that compute checksums beside the uploads.
    """

    def __init__(
        self,
        ctx: JobContext,
        storage: Storage,
        protocol: StepProtocol,
        *,
        keep_count: int,
        max_in_flight: int,
        commit_timeout: float,
        progress_interval: float,
        hasher: ThreadPoolExecutor,
    ) -> None:
        self.context = ctx
        self.job_id = ctx.job_id
        self.storage = storage
        self.protocol = protocol
        self.worker_id, self.rank = protocol.worker_id, protocol.rank
        self.world_size = protocol.world_size
        self.keep_count = keep_count
        self.commit_timeout = commit_timeout
        self.progress_interval = progress_interval
        self._hasher = hasher
        self._uploads = ThreadPoolExecutor(max_in_flight, thread_name_prefix="strata-ckpt-save")
        self._retention = ThreadPoolExecutor(1, thread_name_prefix="strata-ckpt-retention")
        self._pool = BufferPool(max_in_flight)
        self._room = threading.BoundedSemaphore(max_in_flight)
        self._lock = threading.Lock()
        self._in_flight: set[SaveFuture] = set()
        self._last: CheckpointId | None = None
        # Set once the previous save acked (or failed): acks go out in order, so a checkpoint
        # can only commit after every rank acked the earlier ones (see _save_step).
        self._previous_acked = threading.Event()
        self._previous_acked.set()
        self._retention_queued = False
        self._last_retention: Future[Any] | None = None
        self._closed = False
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None

    def submit(
        self,
        cid: CheckpointId,
        views: dict[str, Part],
        copy: bool,
        newest: CheckpointId | None,
    ) -> SaveFuture:
        """Snapshot the parts and queue their save; returns once the snapshot is taken.

        Args:
            cid: the checkpoint (validated).
            views: part name -> (flat byte view, whether the bytes are immutable), or a
                ``DeferredPart`` (held here, made on the upload thread).
            copy: False saves mutable buffers without a copy.
            newest: the job's newest committed checkpoint, which ``cid`` must be after.

        Raises:
            StepNotForwardError: ``cid`` is not after this pipeline's last one or ``newest``
                in (run, epoch, step) order.
            RuntimeError: the pipeline is closed.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("this CheckpointManager is closed")
            if self._last is not None and cid <= self._last:
                raise StepNotForwardError.after(
                    self.job_id, cid, self._last, "this manager already saved"
                )
            if newest is not None and cid <= newest:
                raise StepNotForwardError.after(
                    self.job_id, cid, newest, f"job {self.job_id!r} already committed"
                )
            last, self._last = self._last, cid
            after, acked = self._previous_acked, threading.Event()
            self._previous_acked = acked
        nbytes = sum(p.size_hint if isinstance(p, DeferredPart) else len(p[0])
                     for p in views.values())  # fmt: skip
        future = SaveFuture(cid, nbytes, after, acked)
        snapshots: dict[str, Snapshot | DeferredSnapshot] = {}
        room = False
        try:
            self._room.acquire()  # waits while max_in_flight saves are running
            room = True
            started = time.monotonic()
            for name, part in views.items():
                if isinstance(part, DeferredPart):
                    snapshots[name] = DeferredSnapshot(part)  # holds its source
                    continue
                view, immutable = part
                snapshots[name] = Snapshot(view) if immutable or not copy else self._pool.copy(view)
            with self._lock:
                self._in_flight.add(future)
            self._start_monitor()
            self._uploads.submit(self._run_save, future, cid, snapshots, started)
        except BaseException:
            for snap in snapshots.values():
                snap.release()
            with self._lock:
                self._in_flight.discard(future)
                if self._last == cid:  # nothing of it started: the step may be saved again
                    self._last = last
            acked.set()  # later saves must not wait for this one's ack
            if room:
                self._room.release()
            raise
        return future

    def _run_save(
        self,
        future: SaveFuture,
        cid: CheckpointId,
        snapshots: dict[str, Snapshot | DeferredSnapshot],
        started: float,
    ) -> None:
        info: CheckpointInfo | None = None
        error: BaseException | None = None
        try:
            future.phase = "uploading"
            info = self._save_step(future, cid, snapshots, started)
            future.phase = "committed"
        except BaseException as exc:
            future.phase = "failed"
            log.warning("checkpoint %s of job %r failed: %s", cid, self.job_id, exc)
            error = exc
        finally:
            future._acked.set()
            for snap in snapshots.values():
                snap.release()
            self._room.release()
        # resolved once its slot is free: a done-callback may save again at once (it ran
        # on this thread, and with max_in_flight=1 waited for the slot it still held)
        try:
            if error is None:
                assert info is not None
                future.set_result(info)
            else:
                future.set_exception(error)
        finally:
            with self._lock:  # (after: wait() sees it in flight until it is resolved)
                self._in_flight.discard(future)

    def _save_step(
        self,
        future: SaveFuture,
        cid: CheckpointId,
        snapshots: dict[str, Snapshot | DeferredSnapshot],
        started: float,
    ) -> CheckpointInfo:
        base = checkpoint_dir(self.job_id, cid)
        try:
            if self.storage.exists(f"{base}/{METADATA}"):
                raise CheckpointError(
                    f"checkpoint {cid} of job {self.job_id!r} is already committed in "
                    f"{self.storage.describe()} (the Redis index was behind; it is not "
                    "overwritten)", job_id=self.job_id, step=cid.step, epoch=cid.epoch,
                )  # fmt: skip
            self.protocol.begin(cid)
            files = self._upload(base, snapshots)
            future.nbytes = sum(f.size for f in files.values())  # deferred parts: now known
        except Exception as exc:
            # Whatever stops this rank stops the step, for every rank at once (the abort
            # does nothing to a step that is committed, or that a leader is committing).
            seconds = time.monotonic() - started
            reason = f"rank {self.rank} could not save its parts: {exc}"
            self.protocol.abort(cid, reason, future.nbytes, seconds)
            if isinstance(exc, CheckpointError):
                raise
            raise CheckpointAbortedError.by(self.job_id, cid, self.worker_id, reason) from exc
        for snap in snapshots.values():
            snap.release()  # the bytes are stored: free the buffer before waiting on others
        seconds = time.monotonic() - started
        # Ack after the previous save acked: with saves overlapping, the next checkpoint could
        # otherwise commit first, and this one could never commit (they must go forward).
        future._after.wait()
        led = self.protocol.ack(cid, files, future.nbytes, seconds)
        future._acked.set()
        if led is None:
            future.phase = "waiting"
            return self.protocol.wait(cid, self.commit_timeout)
        future.phase = "committing"
        acked, acks = led
        info = self.protocol.commit(cid, acked, acks)
        total = time.monotonic() - started
        log.info(
            "checkpoint %s of job %r committed: %d files, %.1f MB in %.2f s (%.0f MB/s)",
            cid, self.job_id, len(info.files), info.nbytes / 1e6, total,
            info.nbytes / 1e6 / total if total > 0 else 0.0,
        )  # fmt: skip
        self._schedule_retention()
        return info

    def _upload(
        self, base: str, snapshots: dict[str, Snapshot | DeferredSnapshot]
    ) -> dict[str, FileEntry]:
        files: dict[str, FileEntry] = {}
        for name, snap in snapshots.items():
            path = part_path(name, self.rank, self.world_size)
            chunks = snap.chunks()  # a deferred part is made here, on this upload thread
            # The checksum runs on one other thread while this one writes (both release the
            # GIL): on two cores, the writer and one hasher (measured: a second hasher thread
            # slows the write more than it speeds the checksum).
            crc = self._hasher.submit(crc32_chunks, chunks)
            try:
                if len(chunks) == 1:
                    self.storage.write(f"{base}/{path}", chunks[0])
                else:
                    self.storage.write_chunks(f"{base}/{path}", chunks)
            finally:
                checksum = format_checksum(crc.result())  # before the buffer can be reused
            size = sum(len(c) for c in chunks)
            files[path] = FileEntry(path, name, self.rank, size, checksum)
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
            prune(self.storage, self.context, self.keep_count)
        except Exception as exc:  # a background pass must not die; the next one carries on
            log.warning("checkpoint retention of job %r failed: %s", self.job_id, exc)

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
                        "checkpoint %s of job %r still %s after %.0f s (%.1f MB)",
                        future.checkpoint, self.job_id, future.phase, age, future.nbytes / 1e6,
                    )  # fmt: skip
            reported = {f: t for f, t in reported.items() if f in running}

    def abort_pending(self, reason: str) -> list[CheckpointId]:
        """Abort every checkpoint this rank has in flight and not committed; returns those
        aborted.

        For a rank that knows the others will never ack (its group of ranks broke up): the
        waiters wake at once instead of after ``commit_timeout``, and room frees for new saves.
        """
        with self._lock:
            ids = sorted(f.checkpoint for f in self._in_flight if not f.done())
        return [cid for cid in ids if self.protocol.abort(cid, reason)]

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

    def close(self, wait: bool = True) -> None:
        """Refuse new saves; stop the threads (after the saves in flight, if ``wait``)."""
        if wait:
            self.wait()
        with self._lock:
            self._closed = True
        self._stop.set()
        self._uploads.shutdown(wait=wait)
        self._retention.shutdown(wait=wait)
        self._pool.clear()

"""A shard copied from storage to a local file, in the fetcher's thread or in helper processes.

``copy_shard`` reads a shard's index (unless given) and its bytes — whole, the CRC-32
checked (read once more on a mismatch: a transfer's fault, or the object's?), or only the
spans of the samples still to train (ranged reads) — and writes them at their tar offsets
to a new local file (a whole one lands in a cache directory by a rename: a reader never
sees part of it). ``CopyProcesses`` runs it in processes forked from the training process:
a remote storage's requests cost client CPU (boto3: a few ms each), which there does not
take the training process's GIL.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import pickle
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass
from typing import TypeVar

from ..errors import ShardChecksumError, ShardFormatError
from ..storage import Storage, retry_call
from .index import ShardEntry, ShardIndex, checksum, read_index, shard_path

__all__ = ["GAP", "Copied", "CopyJob", "CopyProcesses", "copy_shard"]

T = TypeVar("T")

#: spans of a part-way shard closer than this are read as one range (gaps read through)
GAP = 64 * 1024


@dataclass(frozen=True)
class CopyJob:
    """What to copy, and where.

    Attributes:
        dataset: the dataset id.
        shard: the shard's number in the manifest.
        entry: the manifest's entry of the shard.
        binary: read its binary index (the manifest's ``binary_index``).
        index: its index, when already read (else it is read first).
        positions: the samples (positions in the shard) to copy; None: the whole shard.
        directory: where the new file is made.
        final: where a whole shard's file goes once complete (a cache directory); None:
            it stays where it was made.
        storage_wait: seconds a read retries while the storage fails.
    """

    dataset: str
    shard: int
    entry: ShardEntry
    binary: bool
    index: ShardIndex | None
    positions: list[int] | None
    directory: str
    final: str | None
    storage_wait: float


@dataclass(frozen=True)
class Copied:
    """A copy made: its index, its local file, and what it cost (bytes and reads of the
    storage; checksum re-reads; retries while the storage failed)."""

    index: ShardIndex
    path: str
    size: int
    reads: int
    rereads: int
    retries: int


def copy_shard(
    storage: Storage, job: CopyJob, give_up: Callable[[], bool] = lambda: False
) -> Copied:
    """Copy ``job``'s shard (see the module docstring).

    Raises:
        StorageNotFoundError: the index or the shard is missing.
        ShardFormatError: a cut or oversized shard, a bad index.
        ShardChecksumError: the bytes do not have the index's CRC-32, read twice.
        StorageError: the storage failed for longer than ``storage_wait``.
    """
    retries = 0

    def count() -> None:
        nonlocal retries
        retries += 1

    def retrying(fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        return retry_call(f"shards of {job.dataset!r}", job.storage_wait,
                          lambda: fn(*args, **kwargs), on_retry=count, give_up=give_up)  # fmt: skip

    index = job.index
    if index is None:
        index = retrying(read_index, storage, job.dataset, job.entry, binary=job.binary)
    path = shard_path(job.dataset, index.name)
    backend = storage.describe()
    rereads = 0
    if job.positions is None:
        data = retrying(storage.read, path)
        _check_whole(job.dataset, index, path, data, backend)
        if index.checksum and checksum(data) != index.checksum:
            rereads += 1
            data = retrying(storage.read, path)
            _check_whole(job.dataset, index, path, data, backend)
            if checksum(data) != index.checksum:
                raise ShardChecksumError(
                    f"its bytes' checksum is {checksum(data)}, its index says "
                    f"{index.checksum} (read twice): the shard is not trained",
                    dataset=job.dataset, path=path, backend=backend,
                )  # fmt: skip
        local = _write(job, [(0, data)])
        return Copied(index, local, len(data), 1, rereads, retries)
    pieces = []
    for start, length in coalesce(index, job.positions):
        piece = retrying(storage.read_range, path, start, length)
        if len(piece) != length:
            raise ShardFormatError(
                f"truncated: {start + len(piece)} bytes where its index says {index.size}",
                dataset=job.dataset, path=path, backend=backend,
            )  # fmt: skip
        pieces.append((start, piece))
    local = _write(job, pieces)
    return Copied(index, local, sum(len(p) for _, p in pieces), len(pieces), rereads, retries)


def coalesce(index: ShardIndex, positions: list[int]) -> list[tuple[int, int]]:
    """The byte ranges covering the samples at ``positions``, neighbours closer than ``GAP``
    read as one."""
    spans = sorted((index.offsets[p], index.sizes[p]) for p in set(positions))
    out: list[tuple[int, int]] = []
    for start, size in spans:
        if out and start - (out[-1][0] + out[-1][1]) < GAP:
            last_start, _ = out[-1]
            out[-1] = (last_start, max(out[-1][0] + out[-1][1], start + size) - last_start)
        else:
            out.append((start, size))
    return out


def _check_whole(dataset: str, index: ShardIndex, path: str, data: bytes, backend: str) -> None:
    if len(data) != index.size:
        raise ShardFormatError(
            f"{'truncated: ' if len(data) < index.size else ''}{len(data)} bytes where its "
            f"index says {index.size}", dataset=dataset, path=path, backend=backend,
        )  # fmt: skip


def _write(job: CopyJob, pieces: list[tuple[int, bytes]]) -> str:
    """Write the pieces at their offsets to a new file (a name of its own: a dropped fetch of
    the same shard may still be writing); a whole shard with ``final`` is renamed there."""
    final = job.final if job.positions is None else None
    prefix = ".strata-tmp-" if final is not None else job.entry.name + "."
    fd, path = tempfile.mkstemp(dir=os.path.dirname(final) if final else job.directory,
                                prefix=prefix)  # fmt: skip
    try:
        with os.fdopen(fd, "wb") as out:
            for offset, piece in pieces:
                out.seek(offset)
                out.write(piece)
        if final is not None:
            os.replace(path, final)
            return final
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return path


# -- helper processes ----------------------------------------------------------------------------
#: a helper process's own storage (a copy of the fetcher's, with its own connections)
_STORAGE: list[Storage] = []


class CopyProcesses:
    """``copy_shard`` in ``processes`` processes forked from this one (each with its own copy
    of ``storage``: its own connections). They start in the background; ``ready`` says when
    ``copy`` may be used (until then the caller copies in its own thread). A helper exits
    when this process is gone (killed included) or ``close`` is called.
    """

    def __init__(self, storage: Storage, processes: int) -> None:
        blob = pickle.dumps(storage)  # (a storage that does not pickle fails here, clearly)
        self._pool = ProcessPoolExecutor(
            processes, mp_context=multiprocessing.get_context("fork"),
            initializer=_start_helper, initargs=(blob, os.getpid()),
        )  # fmt: skip
        self._warm: list[Future[int]] = [self._pool.submit(os.getpid) for _ in range(processes)]
        atexit.register(self.close)

    @property
    def ready(self) -> bool:
        """Every helper has started."""
        return all(f.done() and f.exception() is None for f in self._warm)

    def copy(self, job: CopyJob, give_up: Callable[[], bool] = lambda: False) -> Copied:
        """``copy_shard(storage, job)`` in a helper; its error is raised here.

        Raises:
            CancelledError: ``give_up()`` said so (the fetcher closes) before it was done:
                a helper riding out a storage outage is not waited for.
        """
        future = self._pool.submit(_copy_in_helper, job)
        while True:
            try:
                return future.result(timeout=0.1)
            except FuturesTimeout:
                if give_up():
                    future.cancel()
                    raise CancelledError(f"copy of shard {job.shard} given up") from None

    def close(self) -> None:
        """Stop the helpers (a copy under way finishes first, in the background)."""
        atexit.unregister(self.close)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _start_helper(blob: bytes, parent: int) -> None:
    _STORAGE[:] = [pickle.loads(blob)]

    def watch() -> None:  # the training process killed: nothing left to copy for
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="strata-copy-watch", daemon=True).start()


def _copy_in_helper(job: CopyJob) -> Copied:
    return copy_shard(_STORAGE[0], job)

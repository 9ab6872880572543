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
import logging
import os
import pickle
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TypeVar

from ..errors import ShardChecksumError, ShardFormatError
from ..storage import Storage, retry_call
from .index import ShardEntry, ShardIndex, checksum, read_index, shard_path

__all__ = ["GAP", "Copied", "CopyJob", "CopyProcesses", "copy_shard"]

T = TypeVar("T")
log = logging.getLogger("strata_redis.shards")

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
#: the training process's ends of every helper's socket (a new helper closes its copies of
#: them: a helper sees the end of its socket when the training process is gone, not later)
_PARENT_ENDS: set[Connection] = set()
_FORK_LOCK = threading.Lock()


@dataclass
class _Helper:
    pid: int
    conn: Connection  # this process's end of the helper's socket
    started: bool = False


class CopyProcesses:
    """``copy_shard`` in ``processes`` processes forked from this one (each with its own copy
    of ``storage``: its own connections), each spoken to over a socket of its own. They
    start in the background; ``ready`` says when ``copy`` may be used (until then the
    caller copies in its own thread). A helper exits when its socket closes: ``close``, or
    this process gone (killed included); nothing waits for one at exit. A helper that
    dies is not replaced: its copy, and the next ones, are made in the calling thread.

    (Not a ``ProcessPoolExecutor``: its exit joins its processes through a queue's feeder
    thread, and under load a training process hung there at exit, its helpers never sent
    the word to stop.)
    """

    def __init__(self, storage: Storage, processes: int) -> None:
        blob = pickle.dumps(storage)  # (a storage that does not pickle fails here, clearly)
        self._storage = storage
        self._owner = os.getpid()
        self._cond = threading.Condition()
        self._idle: list[_Helper] = []
        self._all: list[_Helper] = []
        self._closed = False
        for _ in range(processes):
            helper = _fork_helper(blob, self._owner)
            self._idle.append(helper)
            self._all.append(helper)
        atexit.register(self.close)

    @property
    def ready(self) -> bool:
        """Every helper has started (and one at least is still there)."""
        with self._cond:
            for helper in list(self._idle):
                if not helper.started and _poll(helper.conn):
                    helper.started = self._started(helper)
            return bool(self._all) and all(h.started for h in self._all)

    def copy(self, job: CopyJob, give_up: Callable[[], bool] = lambda: False) -> Copied:
        """``copy_shard(storage, job)`` in an idle helper (once ``ready``); its error is
        raised here.

        Raises:
            CancelledError: ``give_up()`` said so (the fetcher closes), or ``close``, before
                it was done: a helper riding out a storage outage is not waited for.
        """
        helper = self._take(job, give_up)
        if helper is None:
            return copy_shard(self._storage, job, give_up)
        try:
            helper.conn.send_bytes(pickle.dumps(job))
            while not helper.conn.poll(0.1):
                if give_up() or self._closed:
                    raise CancelledError(f"copy of shard {job.shard} given up")
            ok, value = pickle.loads(helper.conn.recv_bytes())
        except (EOFError, OSError) as exc:
            self._lose(helper)
            if give_up() or self._closed:
                raise CancelledError(f"copy of shard {job.shard} given up") from None
            log.warning("a shard copy helper process (pid %d) is gone (%s): shard %d and the "
                        "next are copied in this process", helper.pid, exc, job.shard)  # fmt: skip
            return copy_shard(self._storage, job, give_up)
        except BaseException:  # given up (it finishes that copy, then sees its socket end)
            self._lose(helper)
            raise
        with self._cond:
            self._idle.append(helper)
            self._cond.notify()
        if ok:
            return value  # type: ignore[no-any-return]
        raise value

    def close(self) -> None:
        """Stop the helpers: each exits once its copy under way (if any) is done."""
        atexit.unregister(self.close)
        if os.getpid() != self._owner:  # (a process forked from the owner: not its helpers)
            return
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for helper in idle:
            self._lose(helper)

    # -- inside ---------------------------------------------------------------------------------
    def _take(self, job: CopyJob, give_up: Callable[[], bool]) -> _Helper | None:
        """An idle helper (waiting for one while all are busy); None: none is left."""
        with self._cond:
            while not self._idle:
                if give_up() or self._closed:
                    raise CancelledError(f"copy of shard {job.shard} given up")
                if not self._all:
                    return None
                self._cond.wait(0.1)
            return self._idle.pop(0)  # (in turn)

    def _started(self, helper: _Helper) -> bool:
        try:
            word = helper.conn.recv_bytes()
        except (EOFError, OSError):
            word = b"gone"
        if word:
            log.warning("a shard copy helper process (pid %d) did not start: %s",
                        helper.pid, word.decode(errors="replace"))  # fmt: skip
            self._idle.remove(helper)
            self._lose(helper)
            return False
        return True

    def _lose(self, helper: _Helper) -> None:
        """Close the helper's socket (it exits) and reap it in the background."""
        with self._cond:
            if helper in self._all:
                self._all.remove(helper)
            self._cond.notify_all()
        _close(helper)


def _poll(conn: Connection) -> bool:
    try:
        return conn.poll(0)
    except (EOFError, OSError):
        return True


def _close(helper: _Helper) -> None:
    with _FORK_LOCK:
        _PARENT_ENDS.discard(helper.conn)
    with contextlib.suppress(OSError):
        helper.conn.close()
    threading.Thread(target=_reap, args=(helper.pid,), name="strata-copy-reap",
                     daemon=True).start()  # fmt: skip


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _fork_helper(blob: bytes, parent: int) -> _Helper:
    ours, theirs = socket.socketpair()
    with _FORK_LOCK:
        pid = os.fork()
        if pid == 0:  # the helper
            try:
                ours.close()
                for end in _PARENT_ENDS:
                    with contextlib.suppress(OSError):
                        os.close(end.fileno())
                _helper_main(Connection(theirs.detach()), blob, parent)
            finally:
                os._exit(0)
        theirs.close()
        conn = Connection(ours.detach())
        _PARENT_ENDS.add(conn)
    return _Helper(pid, conn)


def _helper_main(conn: Connection, blob: bytes, parent: int) -> None:
    """A helper's life: start (an empty message says so, else why not), then copy each job
    it is sent and send back ``(True, Copied)`` or ``(False, the error)``, until its socket
    ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C is for the training process)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (not the training process's handler)
    try:
        storage = pickle.loads(blob)
    except Exception as exc:  # (said to the training process, which logs it)
        conn.send_bytes(f"{type(exc).__name__}: {exc}".encode())
        return
    conn.send_bytes(b"")

    def watch() -> None:  # the training process killed while a process forked from it later
        while os.getppid() == parent:  # holds this socket's other end open
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="strata-copy-watch", daemon=True).start()
    while True:
        try:
            job = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            result: tuple[bool, object] = (True, copy_shard(storage, job))
        except Exception as exc:  # (raised again in the training process)
            result = (False, exc)
        try:
            payload = pickle.dumps(result)
        except Exception as exc:  # (an error that does not pickle)
            payload = pickle.dumps((False, RuntimeError(f"{type(result[1]).__name__}: {exc}")))
        try:
            conn.send_bytes(payload)
        except OSError:
            return

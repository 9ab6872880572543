"""Reading committed checkpoints: the Redis index, newest first, every byte checked against storage.

Redis holds the index (the committed checkpoints and their metadata) for fast listing;
storage holds the truth. A load reads the checkpoint's metadata.json and the part from
storage and checks the part's size and CRC-32 against it; a checkpoint that is partial,
uncommitted or corrupt is skipped with a :class:`CheckpointSkippedWarning` and the next
older one is tried. Checkpoints are found by the loop's numbers (step, epoch; the newest run
when several runs have them). When Redis lost the index (a flushed or replaced server), it
is rebuilt from the metadata.json files.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

from ..context import JobContext
from ..errors import CheckpointError, CheckpointNotFoundError, StorageError, StorageNotFoundError
from ..storage import Storage
from .checksum import format_checksum, parallel_crc32
from .ids import CheckpointId
from .index import CheckpointIndex
from .manifest import (
    METADATA,
    CheckpointInfo,
    checkpoint_dir,
    decode_metadata,
    encode_metadata,
    located,
    scan,
)

__all__ = [
    "CheckpointReader",
    "CheckpointSkippedWarning",
    "LoadedCheckpoint",
]

log = logging.getLogger("strata_redis.checkpoint")
T = TypeVar("T")


class CheckpointSkippedWarning(RuntimeWarning):
    """A checkpoint was skipped while reading: partial, uncommitted or corrupt."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A part loaded from a committed, verified checkpoint.

    Attributes:
        info: the checkpoint it came from.
        name: the part's name.
        rank: the rank that saved it.
        data: its bytes (size and CRC-32 checked against metadata.json).
    """

    info: CheckpointInfo
    name: str
    rank: int
    data: bytes

    @property
    def step(self) -> int:
        """The loop's step of the checkpoint it came from."""
        return self.info.step

    @property
    def epoch(self) -> int | None:
        """The epoch of the checkpoint it came from."""
        return self.info.epoch


class CheckpointReader:
    """The committed checkpoints of one job: listing, verified loads, the index.

    Args:
        storage: where the checkpoints are.
        ctx: the job (its id and its Redis index).
        hasher: threads for checking CRC-32s in parallel (None: the calling thread).
        hash_parts: how many chunks of a large part are hashed at once.
    """

    def __init__(
        self,
        storage: Storage,
        ctx: JobContext,
        hasher: Executor | None = None,
        hash_parts: int = 2,
    ) -> None:
        self.storage = storage
        self.job_id = ctx.job_id
        self.index = CheckpointIndex(ctx)
        self._hasher = hasher
        self._hash_parts = hash_parts

    # -- the index ---------------------------------------------------------------------------
    def ensure_index(self) -> None:
        """Rebuild the index from storage if Redis does not hold one (a new or flushed Redis)."""
        if not self.index.is_built():
            self.rebuild_index()

    def rebuild_index(self) -> list[CheckpointId]:
        """Make the Redis index match the metadata.json files in storage.

        Checkpoints whose metadata.json is valid are added; indexed ones whose metadata.json
        is gone are removed.

        Returns:
            The committed checkpoints found in storage, newest first.

        Raises:
            StorageError: the storage failed.
        """
        found: dict[CheckpointId, bytes] = {}
        where: dict[CheckpointId, str] = {}
        for cid, files in scan(self.storage, self.job_id).items():
            if METADATA not in files:
                continue
            try:
                info = self.metadata(cid)
            except (StorageNotFoundError, ValueError) as exc:
                log.warning("checkpoint %s not indexed: %s", cid.label, exc)
                continue
            found[cid] = encode_metadata(info)
            where[cid] = located(info, self.storage).location
        indexed = set(self.index.ids())
        top = max(found, default=None)
        # One committed after our listing is newer than everything listed: keep it.
        stale = [
            c for c in indexed - set(found)
            if (top is not None and c <= top) or not self._committed_in_storage(c)
        ]  # fmt: skip
        self.index.replace(found, stale, where)
        if stale:
            log.info("checkpoint index of job %r: dropped %s", self.job_id,
                     [c.label for c in sorted(stale)])  # fmt: skip
        return sorted(found, reverse=True)

    def _committed_in_storage(self, cid: CheckpointId) -> bool:
        return self.storage.exists(f"{checkpoint_dir(self.job_id, cid)}/{METADATA}")

    def indexed_ids(self) -> list[CheckpointId]:
        """The committed checkpoints in the Redis index, newest first."""
        return self.index.ids()

    def newest_id(self) -> CheckpointId | None:
        """The newest committed checkpoint in the index, or None."""
        return self.index.newest()

    def find(
        self, step: int | None = None, epoch: int | None = None, run: int | None = None
    ) -> list[CheckpointId]:
        """The committed checkpoints with these numbers (None: any), newest first.

        Looks in the index and in storage (a checkpoint whose Redis mark was lost counts).
        """
        self.ensure_index()
        found = {c for c in self.indexed_ids() if c.matches(step, epoch, run)}
        for cid, files in scan(self.storage, self.job_id).items():
            if METADATA in files and cid.matches(step, epoch, run):
                found.add(cid)
        return sorted(found, reverse=True)

    # -- reading -----------------------------------------------------------------------------
    def list(self) -> list[CheckpointInfo]:
        """Every committed checkpoint in the index, newest first, as the index describes it."""
        self.ensure_index()
        return [located(info, self.storage) for info in self.index.infos(None)]

    def metadata(self, cid: CheckpointId) -> CheckpointInfo:
        """``cid``'s metadata.json, read from storage and checked.

        Raises:
            StorageNotFoundError: it has no metadata.json (not committed, or deleted).
            ValueError: the metadata.json is malformed or describes another checkpoint or job.
            StorageError: the storage failed.
        """
        raw = self.storage.read(f"{checkpoint_dir(self.job_id, cid)}/{METADATA}")
        return located(decode_metadata(raw, self.job_id, cid), self.storage)

    def latest(self) -> CheckpointInfo | None:
        """The newest committed checkpoint whose metadata.json reads and whose files are all
        there.

        File sizes and checksums are checked by ``load`` and ``verify``, which read the bytes.
        """
        for cid in self._candidates(None, None, None):
            info = self._try(cid, self.metadata, cid)
            if info is None:
                continue
            present = set(scan_checkpoint(self.storage, self.job_id, cid))
            missing = sorted(set(info.files) - present)
            if missing:
                _skip(cid, f"files missing from storage: {missing}")
                continue
            return info
        return None

    def load(
        self,
        step: int | None,
        name: str,
        rank: int,
        epoch: int | None = None,
        run: int | None = None,
    ) -> LoadedCheckpoint:
        """Part ``name`` of ``rank`` from the newest committed checkpoint with these numbers
        that verifies (None: any).

        Raises:
            CheckpointNotFoundError: no committed checkpoint (with those numbers) holds a
                valid copy.
            ValueError: no committed checkpoint examined has a part ``name`` of ``rank``.
        """
        seen_names: set[str] = set()
        examined = 0
        for candidate in self._candidates(step, epoch, run):
            info = self._try(candidate, self.metadata, candidate)
            if info is None:
                continue
            examined += 1
            seen_names.update(info.part_names())
            entry = info.entry(name, rank)
            if entry is None:
                continue
            data = self._try(candidate, self._read_verified, info, entry.path)
            if data is not None:
                return LoadedCheckpoint(info, name, rank, data)
        which = _which(step, epoch, run)
        if examined and name not in seen_names:
            raise ValueError(
                f"name {name!r} is not a part of {which} of job {self.job_id!r}; "
                f"parts: {sorted(seen_names)}"
            )
        raise CheckpointNotFoundError(
            f"no valid checkpoint of part {name!r} (rank {rank}) in {which} of job "
            f"{self.job_id!r} at {self.storage.describe()}",
            job_id=self.job_id, step=step, epoch=epoch,
        )  # fmt: skip

    def verify(self, step: int, epoch: int | None = None, run: int | None = None) -> CheckpointInfo:
        """Read every file of the newest committed checkpoint with these numbers and check
        each file's size and CRC-32.

        Raises:
            CheckpointError: none is committed, or it does not verify (the message says
                which file and why).
        """
        found = self.find(step, epoch, run)
        which = _which(step, epoch, run)
        if not found:
            raise CheckpointError(
                f"{which} of job {self.job_id!r} does not verify: no such checkpoint is "
                f"committed at {self.storage.describe()}", job_id=self.job_id, step=step,
                epoch=epoch,
            )  # fmt: skip
        cid = found[0]
        try:
            info = self.metadata(cid)
            for path in info.files:
                self._read_verified(info, path)
        except (StorageError, ValueError) as exc:
            raise CheckpointError(
                f"checkpoint {cid} of job {self.job_id!r} does not verify: {exc}",
                job_id=self.job_id, step=cid.step, epoch=cid.epoch,
            ) from exc  # fmt: skip
        return info

    # -- helpers -----------------------------------------------------------------------------
    def _candidates(
        self, step: int | None, epoch: int | None, run: int | None
    ) -> Iterator[CheckpointId]:
        """Checkpoints to try, newest first: the index, then storage's (when Redis lost some)."""
        if (step, epoch, run) != (None, None, None):
            yield from self.find(step, epoch, run)
            return
        self.ensure_index()
        tried = set()
        for cid in self.indexed_ids():
            tried.add(cid)
            yield cid
        extra = sorted(
            (c for c, files in scan(self.storage, self.job_id).items()
             if METADATA in files and c not in tried),
            reverse=True,
        )  # fmt: skip
        if extra:
            log.warning(
                "checkpoint index of job %r misses committed checkpoints %s: rebuilding it",
                self.job_id, [c.label for c in extra],
            )  # fmt: skip
            self.rebuild_index()
        yield from extra

    def _try(self, cid: CheckpointId, read: Callable[..., T], *args: Any) -> T | None:
        """``read(*args)``, or None (with a warning) when ``cid`` turns out partial or corrupt."""
        try:
            return read(*args)
        except StorageNotFoundError as exc:
            _skip(cid, f"{exc.path} is missing (partial, uncommitted or deleted checkpoint)")
        except ValueError as exc:
            _skip(cid, str(exc))
        return None

    def _read_verified(self, info: CheckpointInfo, path: str) -> bytes:
        entry = info.files[path]
        data = self.storage.read(f"{checkpoint_dir(info.job_id, info.id)}/{path}")
        if len(data) != entry.size:
            raise ValueError(f"{path}: {len(data)} bytes, metadata.json says {entry.size}")
        checksum = format_checksum(parallel_crc32(memoryview(data), self._hasher, self._hash_parts))
        if checksum != entry.checksum:
            raise ValueError(f"{path}: checksum {checksum}, metadata.json says {entry.checksum}")
        return data


def scan_checkpoint(storage: Storage, job_id: str, cid: CheckpointId) -> list[str]:
    """The files of one checkpoint directory (paths inside it)."""
    prefix = checkpoint_dir(job_id, cid) + "/"
    return [p[len(prefix) :] for p in storage.list(prefix)]


def _which(step: int | None, epoch: int | None, run: int | None) -> str:
    """How a person names the checkpoints a lookup asked for."""
    parts = [f"{what} {n}" for what, n in (("run", run), ("epoch", epoch), ("step", step))
             if n is not None]  # fmt: skip
    return f"checkpoint ({', '.join(parts)})" if parts else "any committed checkpoint"


def _skip(cid: CheckpointId, why: str) -> None:
    warnings.warn(f"checkpoint {cid.label} skipped: {why}", CheckpointSkippedWarning, stacklevel=4)

"""Reading committed checkpoints: the Redis index, newest first, every byte checked against storage.

Redis holds the index (the committed steps and their metadata) for fast listing; storage
holds the truth. A load reads the step's metadata.json and the part from storage and checks
the part's size and CRC-32 against it; a step that is partial, uncommitted or corrupt is
skipped with a :class:`CheckpointSkippedWarning` and the next older one is tried. When Redis
lost the index (a flushed or replaced server), it is rebuilt from the metadata.json files.
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
from .index import CheckpointIndex
from .manifest import (
    METADATA,
    CheckpointInfo,
    decode_metadata,
    encode_metadata,
    located,
    step_dir,
)
from .retention import scan

__all__ = [
    "CheckpointReader",
    "CheckpointSkippedWarning",
    "LoadedCheckpoint",
]

log = logging.getLogger("strata_redis.checkpoint")
T = TypeVar("T")


class CheckpointSkippedWarning(RuntimeWarning):
    """A checkpoint step was skipped while reading: partial, uncommitted or corrupt."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A part loaded from a committed, verified step.

    Attributes:
        info: the step it came from.
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
        """The step it came from."""
        return self.info.step


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

    def rebuild_index(self) -> list[int]:
        """Make the Redis index match the metadata.json files in storage.

        Steps whose metadata.json is valid are added; indexed steps whose metadata.json is
        gone are removed.

        Returns:
            The committed steps found in storage, newest first.

        Raises:
            StorageError: the storage failed.
        """
        found: dict[int, bytes] = {}
        for step, files in scan(self.storage, self.job_id).items():
            if METADATA not in files:
                continue
            try:
                info = self.metadata(step)
            except (StorageNotFoundError, ValueError) as exc:
                log.warning("step %s not indexed: %s", step, exc)
                continue
            found[step] = encode_metadata(info)
        indexed = set(self.index.steps())
        top = max(found, default=-1)
        # A step committed after our listing is newer than everything listed: keep it.
        stale = [s for s in indexed - set(found) if s <= top or not self._committed_in_storage(s)]
        self.index.replace(found, stale)
        if stale:
            log.info("checkpoint index of job %r: dropped steps %s", self.job_id, sorted(stale))
        return sorted(found, reverse=True)

    def _committed_in_storage(self, step: int) -> bool:
        return self.storage.exists(f"{step_dir(self.job_id, step)}/{METADATA}")

    def indexed_steps(self) -> list[int]:
        """The committed steps in the Redis index, newest first."""
        return self.index.steps()

    def newest_step(self) -> int | None:
        """The newest committed step in the index, or None."""
        return self.index.newest()

    # -- reading -----------------------------------------------------------------------------
    def list(self) -> list[CheckpointInfo]:
        """Every committed step in the index, newest first, as the index describes it."""
        self.ensure_index()
        return [located(info, self.storage) for info in self.index.infos(None)]

    def metadata(self, step: int) -> CheckpointInfo:
        """``step``'s metadata.json, read from storage and checked.

        Raises:
            StorageNotFoundError: the step has no metadata.json (not committed, or deleted).
            ValueError: the metadata.json is malformed or describes another step or job.
            StorageError: the storage failed.
        """
        raw = self.storage.read(f"{step_dir(self.job_id, step)}/{METADATA}")
        return located(decode_metadata(raw, self.job_id, step), self.storage)

    def latest(self) -> CheckpointInfo | None:
        """The newest committed step whose metadata.json reads and whose files are all there.

        File sizes and checksums are checked by ``load`` and ``verify``, which read the bytes.
        """
        for step in self._candidates(None):
            info = self._try(step, self.metadata, step)
            if info is None:
                continue
            present = set(scan_step(self.storage, self.job_id, step))
            missing = sorted(set(info.files) - present)
            if missing:
                _skip(step, f"files missing from storage: {missing}")
                continue
            return info
        return None

    def load(self, step: int | None, name: str, rank: int) -> LoadedCheckpoint:
        """Part ``name`` of ``rank`` from ``step`` (None: the newest step that verifies).

        Raises:
            CheckpointNotFoundError: no committed step (or not ``step``) holds a valid copy.
            ValueError: no committed step examined has a part ``name`` of ``rank``.
        """
        seen_names: set[str] = set()
        examined = 0
        for candidate in self._candidates(step):
            info = self._try(candidate, self.metadata, candidate)
            if info is None:
                continue
            examined += 1
            seen_names.update(info.part_names())
            entry = info.entry(name, rank)
            if entry is None:
                if step is not None:
                    break
                continue
            data = self._try(candidate, self._read_verified, info, entry.path)
            if data is not None:
                return LoadedCheckpoint(info, name, rank, data)
        which = "any committed step" if step is None else f"step {step}"
        if examined and name not in seen_names:
            raise ValueError(
                f"name {name!r} is not a part of {which} of job {self.job_id!r}; "
                f"parts: {sorted(seen_names)}"
            )
        raise CheckpointNotFoundError(
            f"no valid checkpoint of part {name!r} (rank {rank}) in {which} of job "
            f"{self.job_id!r} at {self.storage.describe()}",
            job_id=self.job_id, step=step,
        )  # fmt: skip

    def verify(self, step: int) -> CheckpointInfo:
        """Read every file of committed ``step`` and check its size and CRC-32.

        Raises:
            CheckpointError: a file is missing, short, long or corrupt, or no metadata.json.
        """
        try:
            info = self.metadata(step)
            for path in info.files:
                self._read_verified(info, path)
        except (StorageError, ValueError) as exc:
            raise CheckpointError(
                f"step {step} of job {self.job_id!r} does not verify: {exc}",
                job_id=self.job_id, step=step,
            ) from exc  # fmt: skip
        return info

    # -- helpers -----------------------------------------------------------------------------
    def _candidates(self, step: int | None) -> Iterator[int]:
        """Steps to try, newest first: the index, then storage's (when Redis lost some)."""
        if step is not None:
            yield step
            return
        self.ensure_index()
        tried = set()
        for s in self.indexed_steps():
            tried.add(s)
            yield s
        extra = sorted(
            (s for s, files in scan(self.storage, self.job_id).items()
             if METADATA in files and s not in tried),
            reverse=True,
        )  # fmt: skip
        if extra:
            log.warning(
                "checkpoint index of job %r misses committed steps %s: rebuilding it",
                self.job_id, extra,
            )  # fmt: skip
            self.rebuild_index()
        yield from extra

    def _try(self, step: int, read: Callable[..., T], *args: Any) -> T | None:
        """``read(*args)``, or None (with a warning) when the step turns out partial or corrupt."""
        try:
            return read(*args)
        except StorageNotFoundError as exc:
            _skip(step, f"{exc.path} is missing (partial, uncommitted or deleted step)")
        except ValueError as exc:
            _skip(step, str(exc))
        return None

    def _read_verified(self, info: CheckpointInfo, path: str) -> bytes:
        entry = info.files[path]
        data = self.storage.read(f"{step_dir(info.job_id, info.step)}/{path}")
        if len(data) != entry.size:
            raise ValueError(f"{path}: {len(data)} bytes, metadata.json says {entry.size}")
        checksum = format_checksum(parallel_crc32(memoryview(data), self._hasher, self._hash_parts))
        if checksum != entry.checksum:
            raise ValueError(f"{path}: checksum {checksum}, metadata.json says {entry.checksum}")
        return data


def scan_step(storage: Storage, job_id: str, step: int) -> list[str]:
    """The files of one step directory (paths inside it)."""
    prefix = step_dir(job_id, step) + "/"
    return [p[len(prefix) :] for p in storage.list(prefix)]


def _skip(step: int, why: str) -> None:
    warnings.warn(f"checkpoint step {step} skipped: {why}", CheckpointSkippedWarning, stacklevel=4)

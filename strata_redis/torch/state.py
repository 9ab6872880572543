"""Torch state (model, optimizer, scheduler, anything with ``state_dict``) in strata
checkpoints, beside the data position the orchestrator records by itself."""

from __future__ import annotations

import concurrent.futures
import io
import threading
import weakref
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import torch

from ..checkpoint.manifest import CheckpointInfo
from ..errors import CheckpointError
from ..orchestrator import TrainingOrchestrator
from .staging import StagedPart, StagingArea

__all__ = ["SavedFuture", "close", "load", "save", "staging_area", "wait"]

#: the checkpoint part a named object's state goes in
PART_SUFFIX = ".pt"


def _target(obj: Any) -> Any:
    # DistributedDataParallel (and DataParallel) hold the model as .module; save that, so a
    # checkpoint loads into a plain model too
    return obj.module if isinstance(obj, torch.nn.parallel.DistributedDataParallel) else obj


def _objects(
    model: Any, optimizer: Any, scheduler: Any, extra: Mapping[str, Any] | None
) -> dict[str, Any]:
    objects = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    for name, obj in (extra or {}).items():
        if name in objects or not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"extra: bad or reserved name {name!r}")
        objects[name] = obj
    out = {name: obj for name, obj in objects.items() if obj is not None}
    for name, obj in out.items():
        if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
            raise TypeError(f"{name}: {type(obj).__name__} has no state_dict/load_state_dict")
    return out


def save(
    orchestrator: TrainingOrchestrator,
    *,
    step: int,
    epoch: int,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    extra: Mapping[str, Any] | None = None,
    replicated: bool = True,
    metadata: Mapping[str, Any] | None = None,
) -> SavedFuture | None:
    """Save torch state as checkpoint (epoch, step) of the orchestrator's job, in the background.

    Each object's ``state_dict()`` is written in ``torch.save``'s format into a part named
    ``<name>.pt`` (``model.pt``, ``optimizer.pt``, ``scheduler.pt``, and ``extra``'s names).
    With ``replicated`` (data parallel: every rank holds the same state), only rank 0 writes
    it; every rank writes its data position. The checkpoint commits when every rank of the
    round saved it (``orchestrator.save_checkpoint``).

    The loop waits only for the copy of the state's tensor bytes into a reused staging
    buffer (``staging_area(orchestrator)``; one state's size by default) and a deep copy of
    its small values: once this returns, the loop may change the tensors. ``torch.save`` of
    the staged copy and the write run on the save's upload thread. A save that finds the
    staging busy (the previous save still writing, with one buffer) waits for it first.

    A failure of an earlier save (serializing, writing, committing) that was not seen through
    its future (``result()``/``exception()``) is raised here, by ``wait`` or by ``close``,
    once: never lost.

    Args:
        orchestrator: this worker's orchestrator.
        step: as ``orchestrator.save_checkpoint``.
        epoch: as ``orchestrator.save_checkpoint``.
        model: an object with ``state_dict()`` (a DDP model is saved as its ``.module``),
            or None.
        optimizer: an object with ``state_dict()``, or None.
        scheduler: an object with ``state_dict()``, or None.
        extra: more named objects with ``state_dict()``.
        replicated: the state is the same on every rank (False: each rank saves its own).
        metadata: JSON-able values recorded with the position.

    Returns:
        The save's future (``result()`` waits for the commit), or None if not saved (see
        ``orchestrator.save_checkpoint``).

    Raises:
        TypeError, ValueError: a bad argument.
        CheckpointError: an earlier save failed and nobody looked (its error is the cause).
    """
    objects = _objects(model, optimizer, scheduler, extra)
    saves = _saves(orchestrator)
    saves.raise_unseen()
    staged: dict[str, StagedPart] = {}
    if not replicated or orchestrator.rank == 0:
        states = {name + PART_SUFFIX: _target(obj).state_dict() for name, obj in objects.items()}
        staged = saves.staging.stage(states)
    try:
        future = orchestrator.save_checkpoint(
            step=step, epoch=epoch, state=dict(staged), metadata=metadata
        )
    finally:
        for part in staged.values():
            part.drop()  # the save took it (a no-op then), or it was not saved
    return None if future is None else saves.track(future)


class SavedFuture(Future[CheckpointInfo]):
    """The future ``save`` returns: the commit's, and it remembers whether anyone looked.

    ``result()`` or ``exception()`` marks a failure as seen; one nobody saw is raised by the
    next ``save``, ``wait`` or ``close``.

    Attributes:
        inner: the save's own future (``orchestrator.save_checkpoint``'s).
        checkpoint: the checkpoint being saved (``.step``, ``.epoch``, ``.label``).
        seen: whether ``result()`` or ``exception()`` returned since it was done.
    """

    def __init__(self, inner: Future[CheckpointInfo]) -> None:
        super().__init__()
        self.inner = inner
        self.checkpoint = getattr(inner, "checkpoint", None)
        self.seen = False
        inner.add_done_callback(self._copy)

    def _copy(self, inner: Future[CheckpointInfo]) -> None:
        exc = inner.exception()
        if exc is None:
            self.set_result(inner.result())
        else:
            self.set_exception(exc)

    def result(self, timeout: float | None = None) -> CheckpointInfo:
        """As ``Future.result``; a failure raised here counts as seen."""
        try:
            return super().result(timeout)
        finally:
            if self.done():
                self.seen = True

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """As ``Future.exception``; a failure returned here counts as seen."""
        try:
            return super().exception(timeout)
        finally:
            if self.done():
                self.seen = True


class _Saves:
    """One orchestrator's torch saves: the staging area, and the saves not yet settled."""

    def __init__(self, orchestrator: TrainingOrchestrator) -> None:
        self.staging = StagingArea(1, name=orchestrator.job_id)
        self._lock = threading.Lock()
        self._futures: list[SavedFuture] = []

    def track(self, inner: Future[CheckpointInfo]) -> SavedFuture:
        future = SavedFuture(inner)
        with self._lock:
            self._futures = [f for f in self._futures if _unsettled(f)]
            self._futures.append(future)
        return future

    def raise_unseen(self, wait: bool = False, timeout: float | None = None) -> None:
        """Raise the first failure nobody saw (marking it seen), after waiting if ``wait``."""
        with self._lock:
            futures = list(self._futures)
        if wait and futures:
            _, pending = concurrent.futures.wait(futures, timeout)
            if pending:
                raise TimeoutError(f"{len(pending)} torch saves still running after {timeout} s")
        failed = None
        for f in futures:
            if f.done() and not f.seen and Future.exception(f) is not None:
                failed = f
                break
        if failed is None:
            return
        exc = failed.exception()  # (marks it seen)
        assert exc is not None
        cid = failed.checkpoint
        raise CheckpointError(
            f"an earlier strata_redis.torch.save (checkpoint {getattr(cid, 'label', '?')}) "
            f"failed: {exc}", job_id=str(getattr(exc, "job_id", "")),
            step=getattr(cid, "step", None), epoch=getattr(cid, "epoch", None),
        ) from exc  # fmt: skip


def _unsettled(future: SavedFuture) -> bool:
    """Still running, or failed without anyone seeing it (kept until reported)."""
    return not future.done() or (not future.seen and Future.exception(future) is not None)


_SAVES: weakref.WeakKeyDictionary[TrainingOrchestrator, _Saves] = weakref.WeakKeyDictionary()
_SAVES_LOCK = threading.Lock()


def _saves(orchestrator: TrainingOrchestrator) -> _Saves:
    if not isinstance(orchestrator, TrainingOrchestrator):
        raise TypeError(
            f"orchestrator must be a TrainingOrchestrator, got {type(orchestrator).__name__}"
        )
    with _SAVES_LOCK:
        saves = _SAVES.get(orchestrator)
        if saves is None:
            saves = _SAVES[orchestrator] = _Saves(orchestrator)
        return saves


def staging_area(orchestrator: TrainingOrchestrator, buffers: int | None = None) -> StagingArea:
    """The staging area ``save`` copies the orchestrator's state into (``.nbytes``: its size).

    Args:
        orchestrator: this worker's orchestrator.
        buffers: how many states may be staged at once (default 1: a save waits for the
            previous one's write; 2: the next save copies while the previous one writes, at
            twice the memory). None leaves it as it is.

    Returns:
        The area (created on first use).

    Raises:
        TypeError, ValueError: a bad argument.
    """
    saves = _saves(orchestrator)
    if buffers is not None and buffers != saves.staging.buffers:
        area = StagingArea(buffers, name=orchestrator.job_id)
        saves.staging.clear()  # (buffers still writing are freed when their saves end)
        saves.staging = area
    return saves.staging


def wait(orchestrator: TrainingOrchestrator, timeout: float | None = None) -> None:
    """Wait until every torch save of the orchestrator is settled (committed or failed).

    Raises:
        CheckpointError: a save failed and nobody saw it through its future (raised once).
        TimeoutError: ``timeout`` seconds passed first.
    """
    _saves(orchestrator).raise_unseen(wait=True, timeout=timeout)


def close(orchestrator: TrainingOrchestrator, timeout: float | None = None) -> None:
    """``wait``, then free the staging area's memory (a later ``save`` allocates it again).

    Raises:
        CheckpointError, TimeoutError: as ``wait``.
    """
    saves = _saves(orchestrator)
    try:
        saves.raise_unseen(wait=True, timeout=timeout)
    finally:
        saves.staging.clear()


def load(
    orchestrator: TrainingOrchestrator,
    *,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    extra: Mapping[str, Any] | None = None,
    replicated: bool = True,
    map_location: Any = "cpu",
) -> CheckpointInfo | None:
    """Load the state saved by ``save`` from the checkpoint the job resumed from.

    Args:
        orchestrator: this worker's orchestrator (``orchestrator.resumed`` is the checkpoint).
        model: the model to load into (``load_state_dict``), or None.
        optimizer: the optimizer to load into, or None.
        scheduler: the scheduler to load into, or None.
        extra: more named objects to load into.
        replicated: read rank 0's part (as ``save`` wrote it); False reads this rank's.
        map_location: as ``torch.load`` (e.g. ``"cpu"``, ``"cuda:0"``).

    Returns:
        The checkpoint loaded, or None when the job did not resume from one (nothing loaded).

    Raises:
        CheckpointError: the checkpoint has no part for one of the objects, or it does not
            verify.
    """
    objects = _objects(model, optimizer, scheduler, extra)
    info = orchestrator.resumed
    if info is None:
        return None
    rank = 0 if replicated else None
    for name, obj in objects.items():
        try:
            raw = orchestrator.load_state(name + PART_SUFFIX, rank=rank)
        except ValueError as exc:
            raise CheckpointError(
                f"checkpoint {info.id} of job {orchestrator.job_id!r} has no part "
                f"{name + PART_SUFFIX!r} (saved without {name}?)",
                job_id=orchestrator.job_id, step=info.step, epoch=info.epoch,
            ) from exc  # fmt: skip
        assert raw is not None
        state = torch.load(io.BytesIO(raw), map_location=map_location, weights_only=True)
        _target(obj).load_state_dict(state)
    return info

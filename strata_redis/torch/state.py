"""Torch state (model, optimizer, scheduler, anything with ``state_dict``) in strata
checkpoints, beside the data position the orchestrator records by itself."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import torch

from ..checkpoint.manifest import CheckpointInfo
from ..errors import CheckpointError
from ..orchestrator import TrainingOrchestrator

__all__ = ["load", "save"]

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
) -> Future[CheckpointInfo] | None:
    """Save torch state as checkpoint (epoch, step) of the orchestrator's job, in the background.

    Each object's ``state_dict()`` is written with ``torch.save`` into a part named
    ``<name>.pt`` (``model.pt``, ``optimizer.pt``, ``scheduler.pt``, and ``extra``'s names).
    With ``replicated`` (data parallel: every rank holds the same state), only rank 0 writes
    it; every rank writes its data position. The checkpoint commits when every rank of the
    round saved it (``orchestrator.save_checkpoint``); the loop stalls only for the
    serialization.

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
    """
    objects = _objects(model, optimizer, scheduler, extra)
    parts: dict[str, Any] = {}
    if not replicated or orchestrator.rank == 0:
        with _without_zip_crc():
            for name, obj in objects.items():
                buffer = io.BytesIO()
                torch.save(_target(obj).state_dict(), buffer)
                # getvalue() hands over BytesIO's own bytes (no copy while nothing views it)
                parts[name + PART_SUFFIX] = buffer.getvalue()
    return orchestrator.save_checkpoint(step=step, epoch=epoch, state=parts, metadata=metadata)


def _without_zip_crc() -> contextlib.AbstractContextManager[Any]:
    """torch.save without its per-record CRC-32 (a third of its time for big tensors): strata
    checksums every part it stores and verifies it on load."""
    try:
        from torch.utils.serialization import config
    except ImportError:  # torch before the serialization config: nothing to turn off
        return contextlib.nullcontext()
    return config.patch({"save.compute_crc32": False})  # type: ignore[no-any-return]


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

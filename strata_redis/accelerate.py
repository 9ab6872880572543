"""Accelerate on strata (extra ``accelerate``): lease-driven batches ``prepare()`` leaves
alone, and ``save_state``/``load_state`` committed through strata (local or S3), resuming at
any number of processes without re-reading trained data.

A script launched by ``torchrun --rdzv-backend strata --nnodes MIN:MAX`` changes these lines::

    world = int(os.environ["WORLD_SIZE"])
    orch = strata_redis.TrainingOrchestrator(url, job_id=..., checkpoint_path="s3://bucket/ckpt",
                                             min_workers=world, max_workers=world, elastic=False)
    strata_redis.accelerate.init_process_group(orch)            # before Accelerator()
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(model, optimizer)      # not the loader
    loader = strata_redis.accelerate.DataLoader(dataset, orch, "my-dataset", batch_size=32,
                                                device=accelerator.device)
    resumed = strata_redis.accelerate.load_state(accelerator, orch)  # instead of load_state(dir)
    step = resumed.step if resumed else 0
    for epoch in orch.epochs(3):
        loader.set_epoch(epoch)
        for batch in loader:
            ...; step += 1
            if orch.should_stop(step):  # preempted (SIGTERM): the round's agreed step
                strata_redis.accelerate.preempt_exit(accelerator, orch, step=step, epoch=epoch)
            if step % 100 == 0:
                strata_redis.accelerate.save_state(accelerator, orch, step=step, epoch=epoch)

Why the loader is not prepared: ``prepare()`` wraps a loader's batch sampler in
``BatchSamplerShard`` (each process keeps every n-th batch, or a slice of each with
``split_batches``) or dispatches from process 0 (``dispatch_batches``): the leases already
give each process its own batches, so a second split would drop most of them. This loader is
not a ``torch.utils.data.DataLoader`` (it holds one), so ``prepare()`` hands it back as it is;
it moves batches to ``device`` itself. Every process gets the same number of batches
(``lockstep``), as DDP needs, so ``even_batches`` has nothing to pad. And where
``accelerator.skip_first_batches`` walks past the batches it skips to resume (a streaming
dataset reads each one again) and counts them per process (at another process count the
split differs), the leases resume at the job's data position: nothing trained is read again.

Preempted (SIGTERM: torchrun forwards it to every process; Accelerate installs no handler of
its own), ``orch.should_stop(step)`` turns True at the step the round agrees on, and
``preempt_exit`` saves it, waits for the commit within the orchestrator's ``preempt_budget``,
releases the leases, leaves and raises ``Preempted``: the process exits 0, and the relaunch
(the same job, a new ``--rdzv-id``) loses at most one step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

try:
    import accelerate
    from accelerate.utils import send_to_device
except ImportError as exc:  # pragma: no cover - exercised only without accelerate
    raise ImportError(
        "strata_redis.accelerate needs Accelerate: pip install 'strata-redis[accelerate]'"
    ) from exc

from . import torch as strata_torch
from .checkpoint.manifest import CheckpointInfo
from .orchestrator import TrainingOrchestrator

__all__ = ["DataLoader", "init_process_group", "load_state", "preempt_exit", "save_state"]


def init_process_group(
    orchestrator: TrainingOrchestrator, backend: str = "gloo", timeout: float = 60.0
) -> None:
    """Start ``torch.distributed`` from strata's round, before ``Accelerator()`` (which then
    takes its ranks: ``process_index`` is the orchestrator's rank, and checkpoints are
    written by the rank strata reads them from).

    Args:
        orchestrator: this worker's orchestrator.
        backend: ``"gloo"`` (CPU) or ``"nccl"``.
        timeout: seconds a collective waits.
    """
    strata_torch.init_process_group(orchestrator, backend, timeout=timeout)


class DataLoader:
    """Batches from this process's fenced leases (``strata_redis.torch.LeaseBatchSampler``,
    ``lockstep``), moved to ``device``; ``accelerator.prepare()`` passes it through (see the
    module doc).

    Each batch is reported consumed as the loop takes it, so a checkpoint's data position is
    what the model trained on.

    Args:
        dataset: the map-style dataset the indices are of.
        orchestrator: this worker's orchestrator.
        name: the registered dataset's name.
        batch_size: samples per batch (default: the orchestrator's).
        device: where batches go (``accelerator.device``); None leaves them on the CPU.
        lockstep: see ``LeaseBatchSampler`` (default True: DDP).
        **kwargs: ``torch.utils.data.DataLoader``'s (``num_workers``, ``collate_fn``, ...).
    """

    def __init__(
        self,
        dataset: Any,
        orchestrator: TrainingOrchestrator,
        name: str,
        batch_size: int | None = None,
        *,
        device: Any = None,
        lockstep: bool = True,
        **kwargs: Any,
    ) -> None:
        self.sampler = strata_torch.LeaseBatchSampler(
            orchestrator, name, batch_size, lockstep=lockstep
        )
        self.loader = strata_torch.DataLoader(dataset, batch_sampler=self.sampler, **kwargs)
        self.device = device

    def __repr__(self) -> str:
        return f"strata_redis.accelerate.DataLoader({self.sampler!r}, device={self.device})"

    def set_epoch(self, epoch: int) -> None:
        """As ``LeaseBatchSampler.set_epoch``: the loop's epoch must be the job's."""
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            yield batch if self.device is None else send_to_device(batch, self.device)


def _objects(accelerator: accelerate.Accelerator) -> dict[str, Any]:
    """What ``accelerator.save_state`` saves but its RNG states: the prepared models
    (unwrapped), optimizers, schedulers and objects registered for checkpointing, by name."""
    out: dict[str, Any] = {}
    groups = (
        ("model", [accelerator.unwrap_model(m) for m in accelerator._models]),
        ("optimizer", [getattr(o, "optimizer", o) for o in accelerator._optimizers]),
        ("scheduler", [getattr(s, "scheduler", s) for s in accelerator._schedulers]),
        ("custom", list(accelerator._custom_objects)),
    )
    for kind, objects in groups:
        for i, obj in enumerate(objects):
            out[kind if i == 0 and kind != "custom" else f"{kind}_{i}"] = obj
    return out


def save_state(
    accelerator: accelerate.Accelerator, orchestrator: TrainingOrchestrator, *, step: int,
    epoch: int,
) -> strata_torch.SavedFuture | None:  # fmt: skip
    """``accelerator.save_state`` through strata: every prepared model, optimizer, scheduler
    and registered object, as checkpoint (epoch, step) of the job, committed once every
    process saved it (all-or-nothing, local or S3).

    Call it on every process at the same step. The loop waits only for the copy of the
    tensors into a staging buffer (``strata_redis.torch.save``); the write runs behind.

    Returns:
        The save's future, or None if not saved (``orchestrator.save_checkpoint``).
    """
    objects = _objects(accelerator)
    named = {k: objects.pop(k, None) for k in ("model", "optimizer", "scheduler")}
    return strata_torch.save(orchestrator, step=step, epoch=epoch, extra=objects, **named)


def load_state(
    accelerator: accelerate.Accelerator, orchestrator: TrainingOrchestrator
) -> CheckpointInfo | None:
    """``accelerator.load_state`` from the checkpoint the job resumed from (call it after
    ``prepare``). The data position comes back with the orchestrator.

    Returns:
        The checkpoint loaded (``.step``, ``.epoch``), or None on a fresh start.
    """
    objects = _objects(accelerator)
    named = {k: objects.pop(k, None) for k in ("model", "optimizer", "scheduler")}
    return strata_torch.load(orchestrator, extra=objects, **named)


def preempt_exit(
    accelerator: accelerate.Accelerator, orchestrator: TrainingOrchestrator, *, step: int,
    epoch: int,
) -> None:  # fmt: skip
    """Preempted (``orchestrator.should_stop(step)`` said True): save checkpoint (epoch,
    step) as ``save_state`` does, wait for its commit within the orchestrator's
    ``preempt_budget``, release the leases, leave the round and raise ``Preempted`` (a
    ``SystemExit``: code 0, or 75 when the checkpoint did not commit in time).

    Call it on every process at the step ``should_stop`` said True to (the same on each),
    instead of a periodic ``save_state`` of that step: one that was just saved is not saved
    again, its commit is waited for.

    Raises:
        Preempted: always.
    """
    orchestrator.preempt_exit(
        step, epoch, save=lambda: save_state(accelerator, orchestrator, step=step, epoch=epoch)
    )

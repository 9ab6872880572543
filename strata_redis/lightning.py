"""Lightning on strata (extra ``lightning``): a stock ``Trainer`` trains from fenced leases,
checkpoints through strata without stalling the step, and resumes mid-epoch at any world size.

A script launched by ``torchrun --rdzv-backend strata --nnodes MIN:MAX`` changes these lines::

    world = int(os.environ["WORLD_SIZE"])
    orch = strata_redis.TrainingOrchestrator(url, job_id=..., checkpoint_path="s3://bucket/ckpt",
                                             min_workers=world, max_workers=world, elastic=False)
    loader = strata_redis.lightning.DataLoader(dataset, orch, "my-dataset", batch_size=32)
    trainer = lightning.Trainer(max_epochs=3, **strata_redis.lightning.trainer_kwargs(orch))
    trainer.fit(model, loader, ckpt_path=strata_redis.lightning.resume_path(orch))

``trainer_kwargs`` gives the ``StrataDDPStrategy`` (its ``StrataEnvironment`` takes rank and
world size from strata's round, not from a fixed ``num_nodes``; its ``StrataCheckpointIO``
commits checkpoints through strata), the ``StrataCallback`` (checkpoints every
``every_n_steps``, the data position counted at the step's end, the job's epoch advanced at
each epoch's end), ``use_distributed_sampler=False`` (the leases are the split) and
``devices``/``num_nodes`` from torchrun's environment. Under torchrun, a lost node makes the
survivors' agents restart their trainers: each relaunched trainer's orchestrator resumes the
job from its newest committed checkpoint, and ``resume_path`` hands that checkpoint to
Lightning (model, optimizers, loops: ``global_step``, ``current_epoch``), while the data
position comes back with the orchestrator: nothing trained is re-read, nothing is skipped.

Preempted (SIGTERM: torchrun forwards it to every rank), the ``StrataCallback`` saves the
round's agreed stop step, releases the leases, leaves and raises ``Preempted`` out of
``trainer.fit``: the process exits 0, and the relaunch (the same job, a new ``--rdzv-id``)
loses at most one step.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

try:
    import lightning.pytorch as pl
    from lightning.fabric.plugins.environments import ClusterEnvironment
    from lightning.fabric.utilities.seed import reset_seed
    from lightning.pytorch.plugins.io import CheckpointIO
    from lightning.pytorch.strategies import DDPStrategy
except ImportError as exc:  # pragma: no cover - exercised only without lightning
    raise ImportError(
        "strata_redis.lightning needs Lightning: pip install 'strata-redis[lightning]'"
    ) from exc

import torch
import torch.utils.data

from . import preemption
from . import torch as strata_torch
from .orchestrator import TrainingOrchestrator

__all__ = [
    "PATH_PREFIX",
    "DataLoader",
    "StrataCallback",
    "StrataCheckpointIO",
    "StrataDDPStrategy",
    "StrataEnvironment",
    "resume_path",
    "trainer_kwargs",
]

log = logging.getLogger(__name__)

#: the ``ckpt_path``/``filepath`` form naming a strata checkpoint (``strata://<label>``)
PATH_PREFIX = "strata://"
#: the name the Lightning checkpoint goes under (the part ``lightning.pt``)
PART_NAME = "lightning"


class _Checkpoint:
    """A Lightning checkpoint dict as ``strata_redis.torch.save`` takes objects."""

    def __init__(self, checkpoint: dict[str, Any] | None) -> None:
        self.checkpoint = checkpoint

    def state_dict(self) -> dict[str, Any]:
        assert self.checkpoint is not None  # (only the rank that stages it asks)
        return self.checkpoint

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.checkpoint = state


def resume_path(orchestrator: TrainingOrchestrator) -> str | None:
    """``trainer.fit(..., ckpt_path=resume_path(orch))``: the checkpoint the job resumed from
    (``strata://<label>``), or None for a fresh start."""
    info = orchestrator.resumed
    return None if info is None else f"{PATH_PREFIX}{info.label}"


class StrataCheckpointIO(CheckpointIO):  # type: ignore[misc]
    """Lightning checkpoints committed through strata (local or S3, all-or-nothing).

    ``save_checkpoint`` is called on every rank (``StrataDDPStrategy``): rank 0 stages the
    checkpoint's tensors into a reused buffer and returns (``strata_redis.torch.save``: the
    serialization and the write run on the save's upload thread), every rank records its data
    position, and the checkpoint commits once every rank of the round saved it. The path
    Lightning passes is ignored: strata names checkpoints (epoch, step) itself.
    ``load_checkpoint`` reads the checkpoint the job resumed from; ``remove_checkpoint`` does
    nothing (strata keeps ``keep_count``).

    Args:
        orchestrator: this worker's orchestrator.
    """

    def __init__(self, orchestrator: TrainingOrchestrator) -> None:
        self.orchestrator = orchestrator
        #: the last save's future (None: not saved), for a caller that waits for its commit
        self.last_save: strata_torch.SavedFuture | None = None

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        step, epoch = int(checkpoint["global_step"]), int(checkpoint["epoch"])
        self.last_save = None
        self.last_save = strata_torch.save(
            self.orchestrator, step=step, epoch=epoch, extra={PART_NAME: _Checkpoint(checkpoint)}
        )

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        orch = self.orchestrator
        info = orch.resumed
        if info is None or str(path) != f"{PATH_PREFIX}{info.label}":
            raise ValueError(
                f"ckpt_path {path!r}: the job resumed from "
                f"{'nothing' if info is None else PATH_PREFIX + info.label}; pass "
                "strata_redis.lightning.resume_path(orchestrator)"
            )
        raw = orch.load_state(PART_NAME + strata_torch.state.PART_SUFFIX, rank=0)
        assert raw is not None
        # the checkpoint holds Lightning's own objects (loops, hyperparameters), written by
        # this job's rank 0 and verified by strata's checksum on read
        loaded: dict[str, Any] = torch.load(
            io.BytesIO(raw), map_location=map_location or "cpu", weights_only=False
        )
        return loaded

    def remove_checkpoint(self, path: Any) -> None:
        pass

    def teardown(self) -> None:
        strata_torch.wait(self.orchestrator)


class StrataEnvironment(ClusterEnvironment):  # type: ignore[misc]
    """Rank and world size from strata's round (the process group's, ``StrataDDPStrategy``).

    Under ``torchrun --nnodes MIN:MAX`` the world size changes from one launch to the next,
    so the ``devices * num_nodes == WORLD_SIZE`` check of Lightning's torchelastic
    environment is not made: the round is the world.
    """

    def __init__(self, orchestrator: TrainingOrchestrator) -> None:
        super().__init__()
        self.orchestrator = orchestrator

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")  # (unused: the store is in Redis)

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "0"))

    @staticmethod
    def detect() -> bool:
        return False  # never picked by itself: StrataDDPStrategy brings it

    def world_size(self) -> int:
        return self.orchestrator.world_size

    def set_world_size(self, size: int) -> None:
        pass  # the round's

    def global_rank(self) -> int:
        return self.orchestrator.rank

    def set_global_rank(self, rank: int) -> None:
        pass  # the round's

    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    def node_rank(self) -> int:
        return int(os.environ.get("GROUP_RANK", "0"))

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        pass  # an elastic world: see the class doc


class StrataDDPStrategy(DDPStrategy):  # type: ignore[misc]
    """``DDPStrategy`` whose process group is strata's round (``strata_redis.torch.
    init_process_group``: ranks as the orchestrator's, the store in Redis) and whose
    checkpoints every rank commits through strata (``StrataCheckpointIO``).

    Args:
        orchestrator: this worker's orchestrator.
        **kwargs: ``DDPStrategy``'s (``process_group_backend``, ``timeout``, ...).
    """

    def __init__(self, orchestrator: TrainingOrchestrator, **kwargs: Any) -> None:
        kwargs.setdefault("process_group_backend", "gloo")
        kwargs.setdefault("timeout", timedelta(seconds=60))
        super().__init__(
            cluster_environment=StrataEnvironment(orchestrator),
            checkpoint_io=StrataCheckpointIO(orchestrator),
            **kwargs,
        )
        self.orchestrator = orchestrator

    def setup_distributed(self) -> None:
        reset_seed()
        self.set_world_ranks()
        self._process_group_backend = self._get_process_group_backend()
        if not torch.distributed.is_initialized():
            timeout = self._timeout.total_seconds() if self._timeout else 60.0
            strata_torch.init_process_group(
                self.orchestrator, self._process_group_backend, timeout=timeout
            )

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        # every rank: each saves its data position, and the commit waits for all of them
        self.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)


class DataLoader(strata_torch.DataLoader):
    """``strata_redis.torch.DataLoader`` for Lightning: a ``LeaseBatchSampler`` (``lockstep``:
    every rank the same batch count, as DDP needs) made from the arguments, and the batches
    reported consumed by ``StrataCallback`` at the end of each training step (Lightning
    fetches one batch ahead: counted as it is fetched, a checkpoint would skip it).

    Args:
        dataset: the map-style dataset the indices are of.
        orchestrator: this worker's orchestrator.
        name: the registered dataset's name.
        batch_size: samples per batch (default: the orchestrator's).
        lockstep: see ``LeaseBatchSampler`` (default True: DDP).
        **kwargs: ``DataLoader``'s (``num_workers``, ``collate_fn``, ...).
    """

    def __init__(
        self,
        dataset: Any,
        orchestrator: TrainingOrchestrator,
        name: str,
        batch_size: int | None = None,
        *,
        lockstep: bool = True,
        **kwargs: Any,
    ) -> None:
        sampler = strata_torch.LeaseBatchSampler(orchestrator, name, batch_size, lockstep=lockstep)
        super().__init__(dataset, batch_sampler=sampler, **kwargs)
        #: the last iteration ran to the epoch's end (not stopped early: ``max_steps``, a stop)
        self.exhausted = False

    def __iter__(self) -> Iterator[Any]:
        sampler = self.lease_sampler
        walk = None
        self.exhausted = False
        try:
            for batch in torch.utils.data.DataLoader.__iter__(self):
                walk = walk or sampler._walk
                yield batch
            self.exhausted = True
        finally:
            if walk is not None:
                sampler.close(walk)


class StrataCallback(pl.Callback):  # type: ignore[misc]
    """Counts each trained batch into the data position, checkpoints every ``every_n_steps``
    optimizer steps through strata, advances the job's epoch at each epoch's end, and on
    preemption saves the round's agreed stop step and leaves (``preempt_exit``).

    Preemption (SIGTERM, which torchrun forwards to every rank): at each step's end the
    callback asks ``orchestrator.should_stop(global_step)``; at the round's agreed step it
    saves that step through ``StrataCheckpointIO`` (unless the step was just saved), waits
    for the commit within the orchestrator's ``preempt_budget``, releases the leases, leaves
    the round and raises ``Preempted``, a ``SystemExit`` that ``Trainer.fit`` re-raises
    after its teardown: the process exits 0 (75 past the budget). Lightning's own SIGTERM
    handling (a broadcast from inside its signal handler, then ``SIGTERMException``, exit 0
    with no checkpoint, at the end of the step the signal came in) is taken off the signals
    strata handles at ``on_train_start``; ``Trainer.fit`` puts the handlers back at its end.

    Args:
        orchestrator: this worker's orchestrator.
        every_n_steps: optimizer steps between checkpoints (0: none).
    """

    def __init__(self, orchestrator: TrainingOrchestrator, every_n_steps: int = 50) -> None:
        if not isinstance(every_n_steps, int) or every_n_steps < 0:
            raise ValueError(f"every_n_steps must be an int >= 0, got {every_n_steps!r}")
        self.orchestrator = orchestrator
        self.every_n_steps = every_n_steps
        self._saved_step = -1

    @staticmethod
    def _loaders(trainer: pl.Trainer) -> list[DataLoader]:
        loaders = trainer.train_dataloader
        if isinstance(loaders, dict):
            loaders = list(loaders.values())
        elif not isinstance(loaders, (list, tuple)):
            loaders = [loaders]
        return [dl for dl in loaders if isinstance(dl, DataLoader)]

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._loaders(trainer):
            raise TypeError(
                "StrataCallback: the training loader is not a strata_redis.lightning.DataLoader"
            )
        self._saved_step = trainer.global_step  # (resumed there: saved already)
        _unwrap_signal_handlers()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        for loader in self._loaders(trainer):
            loader.lease_sampler.consumed()  # (a shard dataset's sampler tells its feed too)
        step = trainer.global_step
        # a step's end, where a checkpoint is consistent: preempted (a flag read until then),
        # the round's agreed stop step is saved and the run ends here
        if self.orchestrator.should_stop(step):
            self.preempt_exit(trainer)
        if self.every_n_steps and step % self.every_n_steps == 0 and step != self._saved_step:
            self._save(trainer)

    def _save(self, trainer: pl.Trainer) -> strata_torch.SavedFuture | None:
        """Checkpoint (``current_epoch``, ``global_step``) through ``StrataCheckpointIO``;
        its future (None: not saved)."""
        self._saved_step = trainer.global_step
        io_plugin = trainer.strategy.checkpoint_io
        if isinstance(io_plugin, StrataCheckpointIO):
            io_plugin.last_save = None
        trainer.save_checkpoint(
            f"{PATH_PREFIX}{trainer.current_epoch}/{trainer.global_step}", weights_only=False
        )
        return io_plugin.last_save if isinstance(io_plugin, StrataCheckpointIO) else None

    def preempt_exit(self, trainer: pl.Trainer) -> None:
        """Save this step (unless it was just saved) and leave: ``orchestrator.preempt_exit``,
        which raises ``Preempted`` (every rank at the same step: ``save_checkpoint`` ends in
        a barrier)."""
        step = trainer.global_step

        def save() -> strata_torch.SavedFuture | None:
            # None: this step was saved already; preempt_exit waits for its commit
            return None if step == self._saved_step else self._save(trainer)

        self.orchestrator.preempt_exit(step, trainer.current_epoch, save=save)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning ends an epoch stopped early (max_steps, should_stop) with this hook too:
        # the job's epoch advances only when the loader ran through
        if all(loader.exhausted for loader in self._loaders(trainer)):
            self.orchestrator.advance_epoch()

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        strata_torch.wait(self.orchestrator)


def _unwrap_signal_handlers() -> None:
    """Put strata's preemption handler back alone on the signals Lightning wrapped it in
    its own handler for (``_SignalConnector``: SIGTERM): Lightning's broadcasts from inside
    the handler and ends the run at the step's end with no checkpoint, where strata agrees on
    a stop step and saves it. Signals strata does not handle keep Lightning's handling."""
    if threading.current_thread() is not threading.main_thread():
        return  # (signal.signal works only there, as Lightning's own registration)
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        current = signal.getsignal(sig)
        for handler in getattr(current, "signal_handlers", None) or ():
            if preemption.is_handler(handler):
                signal.signal(sig, handler)
                log.debug("Lightning's %s handler set aside: strata's preemption handles it",
                          sig.name)  # fmt: skip
                break


def trainer_kwargs(
    orchestrator: TrainingOrchestrator, *, every_n_steps: int = 50, **strategy_kwargs: Any
) -> dict[str, Any]:
    """``lightning.Trainer`` arguments that put the run on strata (see the module doc).

    Args:
        orchestrator: this worker's orchestrator.
        every_n_steps: optimizer steps between checkpoints.
        **strategy_kwargs: ``StrataDDPStrategy``'s (``process_group_backend``, ``timeout``).

    Returns:
        ``strategy``, ``callbacks``, ``use_distributed_sampler``, ``devices``, ``num_nodes``.
    """
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return {
        "strategy": StrataDDPStrategy(orchestrator, **strategy_kwargs),
        "callbacks": [StrataCallback(orchestrator, every_n_steps)],
        "use_distributed_sampler": False,
        "devices": local,
        "num_nodes": max(1, orchestrator.world_size // local),
    }

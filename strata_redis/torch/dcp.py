"""``torch.distributed.checkpoint`` (DCP) over strata checkpoints: all-or-nothing ``dcp.save``.

::

    writer = strata_redis.torch.StrataStorageWriter(orchestrator, step=step, epoch=epoch)
    dcp.save(state_dict, storage_writer=writer)        # every rank of the round
    ...
    reader = strata_redis.torch.StrataStorageReader(orchestrator)  # the resumed checkpoint
    dcp.load(state_dict, storage_reader=reader)
    reader = strata_redis.torch.StrataStorageReader(orchestrator, step=step, epoch=epoch)

The checkpoint is the loop's (epoch, step) as the writer was given them (its directory
``epoch_{E}_step_{S}``; after a whole-job relaunch ``run_{R}_...``): a reader finds it by
the same numbers, the newest run's when several runs saved it.

A DCP save is one strata checkpoint (``orchestrator.save_checkpoint``): every rank saves the
items DCP's plan gives it as one part, ``dcp/data.distcp`` (each item ``torch.save``-d, or its
bytes as they are, back to back; DCP's metadata records each item's rank, offset and
length), and the coordinator rank also saves the pickled DCP ``Metadata`` as ``dcp/.metadata``.
Strata commits the step only when every rank of the round saved its parts (sizes and CRC-32s
in ``metadata.json``, written last); the coordinator's ``finish`` waits for that commit, so
``dcp.save`` returning on any rank means the checkpoint is committed. A failed or aborted
commit raises ``DistributedCheckpointError`` (inside DCP's ``CheckpointException``) on every
rank. A rank that dies mid-save leaves the step uncommitted (never visible to loads or
resumes): the survivors' ``dcp.save`` raises, from DCP's next collective with the dead rank
(gloo: "Connection closed by peer") or once strata aborts the step (the round broke after
``heartbeat_timeout``, or ``commit_timeout``); the strata cause is logged and is
``writer.future.exception()``.

A load reads every part through strata's verified reader: a part that does not match its size
or checksum fails the load (it never falls back to another step, whose items would not match
the data position the job resumed from). ``dcp/.metadata`` is unpickled, as torch's
``FileSystemReader`` does: load only checkpoints of storage you trust.

Each rank's data position is saved beside the DCP parts as with any strata checkpoint, so a
relaunched job resumes from the same step it loads the DCP state from.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import uuid
from collections.abc import Mapping
from concurrent.futures import Future as ConcurrentFuture
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any, Final

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from ..checkpoint.ids import MAX_NUMBER
from ..checkpoint.manifest import CheckpointInfo
from ..errors import CheckpointError, StrataError
from ..orchestrator import TrainingOrchestrator
from ..validate import check_int, check_seconds

__all__ = [
    "DATA_PART",
    "METADATA_PART",
    "DistributedCheckpointError",
    "StrataStorageReader",
    "StrataStorageWriter",
]

log = logging.getLogger("strata_redis.torch.dcp")

#: the part holding a rank's DCP items, back to back
DATA_PART: Final = "dcp/data.distcp"
#: the coordinator rank's part holding the pickled DCP ``Metadata``
METADATA_PART: Final = "dcp/.metadata"

#: where an item lives: (strata rank of the part, offset in it, length), DCP's storage_data
_Location = tuple[int, int, int]


class DistributedCheckpointError(CheckpointError):
    """A DCP save or load through strata failed (the message says which step and why).

    Unlike strata's other errors it survives pickling, which DCP does to hand one rank's
    failure to the others.

    Attributes:
        job_id: the job.
        step: the loop's step of the checkpoint, when known.
    """

    def __init__(self, message: str, job_id: str, step: int | None = None) -> None:
        super().__init__(message, job_id=job_id, step=step)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.job_id, self.step))


def _check_orchestrator(orchestrator: object) -> TrainingOrchestrator:
    if not isinstance(orchestrator, TrainingOrchestrator):
        raise TypeError(
            f"orchestrator must be a TrainingOrchestrator, got {type(orchestrator).__name__}"
        )
    return orchestrator


def _no_checkpoint_id(checkpoint_id: str | os.PathLike[str] | None) -> None:
    if checkpoint_id is not None:
        raise ValueError(
            f"checkpoint_id must be None with strata storage (got {checkpoint_id!r}): the "
            "checkpoint is named by the writer's step= and epoch= (the reader's step=, epoch=)"
        )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class StrataStorageWriter(StorageWriter):  # type: ignore[misc]
    """A DCP ``StorageWriter`` saving one strata checkpoint, committed all-or-nothing.

    Each rank of the orchestrator's round passes its own writer to ``dcp.save`` (one writer per
    save). Every rank's items go into its part ``dcp/data.distcp``; the coordinator also saves
    DCP's metadata as ``dcp/.metadata``. Non-coordinator ranks submit their parts as soon as
    they are written; the coordinator submits its parts in ``finish`` and waits there for the
    commit, which happens only once every rank of the round saved (see the module's doc).

    Example::

        writer = StrataStorageWriter(orchestrator, step=step, epoch=epoch)
        dcp.save({"model": model.state_dict()}, storage_writer=writer)
        writer.future.result().label       # epoch_{E}_step_{S}: StrataStorageReader(step=, epoch=)

    Args:
        orchestrator: this worker's orchestrator (its round is DCP's process group).
        step: as ``orchestrator.save_checkpoint``: the loop's step.
        epoch: as ``orchestrator.save_checkpoint``: the loop's epoch.
        metadata: JSON-able values recorded with this rank's data position.
        timeout: seconds the coordinator's ``finish`` waits for the commit; None waits until
            strata settles it (its ``commit_timeout`` bounds the wait for the other ranks).

    Attributes:
        future: this rank's save future once submitted (``result()`` is the committed
            ``CheckpointInfo``, or raises why the step was aborted), else None.

    Raises:
        TypeError, ValueError: a bad argument, named in the message.
    """

    def __init__(
        self,
        orchestrator: TrainingOrchestrator,
        *,
        step: int,
        epoch: int,
        metadata: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__()
        self.orchestrator = _check_orchestrator(orchestrator)
        self.step = check_int("step", step, low=0, high=MAX_NUMBER)
        self.epoch = check_int("epoch", epoch, low=0, high=MAX_NUMBER)
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a mapping or None, got {type(metadata).__name__}")
        self.metadata = dict(metadata or {})
        self.timeout = (
            None if timeout is None else check_seconds("timeout", timeout, high=7 * 86400)
        )
        self.future: ConcurrentFuture[CheckpointInfo] | None = None
        self.is_coordinator = False
        self.save_id = uuid.uuid4().hex
        self._parts: dict[str, bytes] | None = None  # the coordinator's, until finish
        self._round = -1
        self._rank = -1
        self._started = False

    def __repr__(self) -> str:
        return (
            f"StrataStorageWriter(job={self.orchestrator.job_id!r}, step={self.step}, "
            f"epoch={self.epoch})"
        )

    @property
    def checkpoint_id(self) -> str:
        """A name for DCP's logs: ``strata:<job>/epoch_<e>_step_<s>``."""
        return f"strata:{self.orchestrator.job_id}/epoch_{self.epoch}_step_{self.step}"

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """False: a strata writer is passed as ``storage_writer``, never picked from an id."""
        return False

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """DCP's hook for a checkpoint_id; strata names the checkpoint by step and epoch.

        Raises:
            ValueError: a checkpoint_id was given.
        """
        _no_checkpoint_id(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Take the rank's role (DCP calls it on every rank first).

        Raises:
            RuntimeError: the writer was used for a save already (one writer per save).
            ValueError: ``use_collectives=False`` with more than one rank (DCP's metadata
                would then describe one rank's items only).
        """
        if self._started:
            raise RuntimeError(
                f"{self!r} was used for a dcp.save already: create one writer per save"
            )
        if not kwargs.get("use_collectives", True) and self.orchestrator.world_size > 1:
            raise ValueError(
                "use_collectives=False is not supported with StrataStorageWriter: the "
                "coordinator must see every rank's items to write one metadata"
            )
        self._started = True
        self.is_coordinator = bool(is_coordinator)
        self._round = self.orchestrator.round.number
        self._rank = self.orchestrator.rank

    def storage_meta(self) -> StorageMeta | None:
        """DCP's storage metadata: this save's name and id."""
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """DCP's local plan, unchanged."""
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """DCP's global plan, unchanged, once the group is checked to be the round.

        Raises:
            ValueError: the process group is not the orchestrator's round (strata would wait
                for ranks that never save).
        """
        if len(plans) != self.orchestrator.world_size:
            raise ValueError(
                f"dcp.save runs on {len(plans)} ranks but the strata round has "
                f"{self.orchestrator.world_size}: the process group must be the round's "
                "(strata_redis.torch.init_process_group)"
            )
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Serialize this rank's items into its ``dcp/data.distcp`` part.

        A non-coordinator submits its parts to strata here; the coordinator keeps them for
        ``finish``.

        Returns:
            A completed future of the items' ``WriteResult``s.

        Raises:
            DistributedCheckpointError: strata refused the save.
        """
        buffer = io.BytesIO()
        results: list[WriteResult] = []
        for item in plan.items:
            offset = buffer.tell()
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                buffer.write(data.getbuffer())
            else:
                tensor = data.detach().cpu()
                if tensor.untyped_storage().size() != tensor.nbytes:
                    tensor = tensor.clone()  # a view: save only what it shows
                torch.save(tensor, buffer)
            length = buffer.tell() - offset
            location: _Location = (self._rank, offset, length)
            results.append(WriteResult(index=item.index, size_in_bytes=length,
                                       storage_data=location))  # fmt: skip
        parts = {DATA_PART: buffer.getvalue()} if buffer.tell() else {}
        if self.is_coordinator:
            self._parts = parts
        else:
            self._submit(parts)
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Coordinator: save DCP's metadata with this rank's items, and wait for the commit.

        Raises:
            DistributedCheckpointError: the save was refused, or the step was aborted or did
                not commit within ``timeout`` (the checkpoint is then not visible).
        """
        if not self.is_coordinator:  # DCP calls finish on the coordinator only
            return
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = {wr.index: wr.storage_data for rs in results for wr in rs}
        metadata.storage_meta = self.storage_meta()
        parts = dict(self._parts or {})
        parts[METADATA_PART] = pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)
        self._parts = None
        future = self._submit(parts)
        try:
            info = future.result(self.timeout)
        except FutureTimeoutError:
            raise self._error(
                f"not committed within {self.timeout}s (the other ranks' parts may still be "
                "uploading)"
            ) from None
        except Exception as exc:
            log.error("%r: not committed: %s", self, _describe(exc))
            raise self._error(f"not committed: {_describe(exc)}") from exc
        log.info("%r: committed as strata checkpoint %s at %s", self, info.label, info.location)

    # -- plumbing -------------------------------------------------------------------------
    def _error(self, why: str) -> DistributedCheckpointError:
        return DistributedCheckpointError(
            f"dcp.save of (epoch {self.epoch}, step {self.step}) of job "
            f"{self.orchestrator.job_id!r} by rank {self._rank}: {why}",
            self.orchestrator.job_id,
        )

    def _submit(self, parts: dict[str, bytes]) -> ConcurrentFuture[CheckpointInfo]:
        orch = self.orchestrator
        try:
            future = orch.save_checkpoint(
                step=self.step, epoch=self.epoch, state=parts, metadata=self.metadata
            )
        except StrataError as exc:  # (strata's own errors do not survive DCP's pickling)
            raise self._error(f"strata refused the save: {_describe(exc)}") from exc
        if future is None:
            raise self._error(
                "strata did not save it: (epoch, step) is not after this worker's previous "
                "checkpoint in this run (checkpoints must go forward)"
            )
        self.future = future
        if orch.round.number != self._round:
            raise self._error(
                f"the rendezvous round changed during the save (round {self._round} -> "
                f"{orch.round.number}); restart torch.distributed for the new round"
            )
        return future


class StrataStorageReader(StorageReader):  # type: ignore[misc]
    """A DCP ``StorageReader`` loading a committed strata checkpoint saved by
    ``StrataStorageWriter``, every part verified (size and CRC-32) as it is read.

    Example::

        reader = StrataStorageReader(orchestrator)        # the checkpoint the job resumed from
        dcp.load(state_dict, storage_reader=reader)

    Args:
        orchestrator: this worker's orchestrator.
        step: the loop's step of the checkpoint to load (as the writer's ``step=``); None
            (and no ``epoch``) loads the checkpoint the job resumed from
            (``orchestrator.resumed``), which holds the data position the job restarted at.
        epoch: its epoch (as the writer's ``epoch=``); None: any.
        run: its run (``CheckpointInfo.run``); None: the newest run that has it.

    Attributes:
        info: the checkpoint being loaded, once ``read_metadata`` ran.

    Raises:
        TypeError, ValueError: a bad argument, named in the message.
    """

    def __init__(
        self,
        orchestrator: TrainingOrchestrator,
        *,
        step: int | None = None,
        epoch: int | None = None,
        run: int | None = None,
    ) -> None:
        super().__init__()
        self.orchestrator = _check_orchestrator(orchestrator)
        self.step = None if step is None else check_int("step", step, low=0, high=MAX_NUMBER)
        self.epoch = None if epoch is None else check_int("epoch", epoch, low=0, high=MAX_NUMBER)
        self.run = None if run is None else check_int("run", run, low=0, high=MAX_NUMBER)
        self.info: CheckpointInfo | None = None
        self.load_id = uuid.uuid4().hex
        self.storage_data: dict[Any, _Location] = {}

    def _resumed(self) -> bool:
        return (self.step, self.epoch, self.run) == (None, None, None)

    def __repr__(self) -> str:
        if self._resumed():
            return f"StrataStorageReader(job={self.orchestrator.job_id!r}, resumed)"
        return (
            f"StrataStorageReader(job={self.orchestrator.job_id!r}, step={self.step}, "
            f"epoch={self.epoch}, run={self.run})"
        )

    @property
    def checkpoint_id(self) -> str:
        """A name for DCP's logs: ``strata:<job>/<label>`` (or ``.../resumed``)."""
        if self.info is not None:
            which = self.info.label
        elif self._resumed():
            which = "resumed"
        else:  # not yet found: the numbers asked for
            which = "_".join(f"{what}_{n}" for what, n in
                             (("run", self.run), ("epoch", self.epoch), ("step", self.step))
                             if n is not None)  # fmt: skip
        return f"strata:{self.orchestrator.job_id}/{which}"

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """False: a strata reader is passed as ``storage_reader``, never picked from an id."""
        return False

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """DCP's hook for a checkpoint_id; strata names the checkpoint by ``step``/``epoch``.

        Raises:
            ValueError: a checkpoint_id was given.
        """
        _no_checkpoint_id(checkpoint_id)
        self.info = None
        self.storage_data = {}
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """DCP's metadata, from the checkpoint's ``dcp/.metadata`` part (verified).

        Raises:
            DistributedCheckpointError: no such checkpoint, it was not saved by
                ``StrataStorageWriter``, or its metadata part does not verify.
        """
        if kwargs.get("rank") is not None:  # DCP's fallback after a failed read
            raise self._error("strata checkpoints have no rank-local DCP metadata")
        info = self._checkpoint()
        holders = [e.rank for e in info.files.values() if e.name == METADATA_PART]
        if not holders:
            raise self._error(
                f"not saved by StrataStorageWriter: it has no part {METADATA_PART!r} "
                f"(parts: {info.part_names()})", info,
            )  # fmt: skip
        raw = self._read(info, METADATA_PART, holders[0])
        try:
            metadata = pickle.loads(raw)
        except Exception as exc:
            raise self._error(f"{METADATA_PART}: not a DCP metadata ({_describe(exc)})",
                              info) from exc  # fmt: skip
        if not isinstance(metadata, Metadata):
            raise self._error(f"{METADATA_PART}: a {type(metadata).__name__}, not a DCP "
                              "Metadata", info)  # fmt: skip
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        self.info = info
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        """Take the items' locations from the metadata.

        Raises:
            DistributedCheckpointError: the metadata has no storage data.
        """
        if metadata.storage_data is None:
            raise self._error("its DCP metadata has no storage data")
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """DCP's local plan, unchanged."""
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """DCP's global plan, unchanged."""
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read the plan's items (each rank's part once, verified) and hand them to the planner.

        Returns:
            A completed future.

        Raises:
            DistributedCheckpointError: a part is missing or does not verify, or an item is
                not where the metadata says.
        """
        info = self.info
        if info is None:
            raise RuntimeError(f"{self!r}: read_data before read_metadata")
        per_rank: dict[int, list[Any]] = {}
        for req in plan.items:
            per_rank.setdefault(self._location(req.storage_index, info)[0], []).append(req)
        for rank, reqs in sorted(per_rank.items()):
            part = memoryview(self._read(info, DATA_PART, rank))
            for req in reqs:
                _, offset, length = self._location(req.storage_index, info)
                if offset + length > len(part):
                    raise self._error(
                        f"item {req.storage_index.fqn!r} at {offset}+{length} is past the end "
                        f"of rank {rank}'s {DATA_PART!r} ({len(part)} bytes)", info,
                    )  # fmt: skip
                raw = io.BytesIO(part[offset : offset + length])
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, raw)
                    continue
                tensor = torch.load(raw, map_location="cpu", weights_only=True)
                tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
                target = planner.resolve_tensor(req).detach()
                if target.size() != tensor.size():
                    raise self._error(
                        f"item {req.storage_index.fqn!r}: saved size {tuple(tensor.size())}, "
                        f"loading into {tuple(target.size())}", info,
                    )  # fmt: skip
                target.copy_(tensor)
                planner.commit_tensor(req, target)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    # -- plumbing -------------------------------------------------------------------------
    def _error(self, why: str, info: CheckpointInfo | None = None) -> DistributedCheckpointError:
        job = self.orchestrator.job_id
        if info is not None:
            where, step = f"checkpoint {info.id} ({info.label})", info.step
        elif self._resumed():
            where, step = "the checkpoint the job resumed from", None
        else:
            parts = [f"{what} {n}" for what, n in
                     (("run", self.run), ("epoch", self.epoch), ("step", self.step))
                     if n is not None]  # fmt: skip
            where, step = f"checkpoint ({', '.join(parts)})", self.step
        return DistributedCheckpointError(f"dcp.load of {where} of job {job!r}: {why}", job, step)

    def _checkpoint(self) -> CheckpointInfo:
        orch = self.orchestrator
        if self._resumed():
            if orch.resumed is None:
                raise self._error(
                    "the job did not resume from a checkpoint (pass step= and epoch= to load one)"
                )
            return orch.resumed
        reader = orch.checkpoints.reader
        try:
            found = reader.find(self.step, self.epoch, self.run)
            if found:
                return reader.metadata(found[0])
            why = "no such committed checkpoint"
        except (StrataError, ValueError) as exc:
            why = _describe(exc)
        committed = [i.label for i in orch.checkpoints.list()]
        raise self._error(f"not a committed checkpoint ({why}); committed: {committed}")

    def _read(self, info: CheckpointInfo, name: str, rank: int) -> bytes:
        ckpt = self.orchestrator.checkpoints
        try:
            return ckpt.load(info.step, name=name, rank=rank, epoch=info.epoch, run=info.run)
        except (StrataError, ValueError) as exc:
            why = _describe(exc)
            try:  # the reason a part was skipped (a checksum, a size) is only in a warning
                ckpt.verify(info.step, epoch=info.epoch, run=info.run)
            except CheckpointError as bad:
                why = str(bad)
            except Exception:  # (the load's own error is the one to report)
                pass
            raise self._error(f"part {name!r} of rank {rank} cannot be read: {why}",
                              info) from exc  # fmt: skip

    def _location(self, index: Any, info: CheckpointInfo) -> _Location:
        try:
            rank, offset, length = self.storage_data[index]
            return int(rank), int(offset), int(length)
        except (KeyError, TypeError, ValueError) as exc:
            raise self._error(
                f"its DCP metadata has no strata location for item {index}", info
            ) from exc

"""Staging for non-blocking torch saves: the state's tensor bytes copied into reused buffers on
the loop's thread, serialized (``torch.save``'s format) from there on the save's upload thread.

What the loop waits for is the copy alone: one memcpy of each tensor storage into a staging
buffer (kept warm for the next save: a fresh allocation costs a page fault per 4 KiB), plus a
deep copy of the state's small Python values (ints, floats, param groups). ``torch.save`` of
the staged copies runs later, on the upload thread; its writes of tensor bytes are not copied
again: they are kept as views of the staging buffer and written from there with gathered
writes, and only its small records (pickle, zip headers) are copied.

Memory is bounded: ``buffers`` staging buffers (default 1), each the size of the largest
state staged in it. A save that finds every buffer busy (an earlier save still writing from
it) waits for one to be released, so the loop stalls then rather than memory growing; the
log says when a buffer is allocated or grown and how big the area is.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..checkpoint.snapshot import DeferredPart
from ..errors import CheckpointError
from ..validate import check_int

__all__ = ["ALIGN", "StagedPart", "StagingArea"]

log = logging.getLogger("strata_redis.torch")

#: each staged storage starts at a multiple of this many bytes (as torch aligns them on disk)
ALIGN = 64


class _Buffer:
    """One staging buffer: its memory, who uses it, and which staging it holds."""

    __slots__ = ("arena", "base", "generation", "users")

    def __init__(self) -> None:
        self.arena = np.empty(0, dtype=np.uint8)
        self.base = 0
        self.users = 0  # parts holding it (and reservations of parts not yet taken)
        self.generation = 0  # bumped each time it is staged into


class StagingArea:
    """Reused buffers that ``strata_redis.torch.save`` stages a state's tensors into.

    Thread-safe. A buffer is in use from ``stage`` until every part staged in it was saved
    (its bytes written) or dropped; ``stage`` waits for a free one.

    Args:
        buffers: how many states may be staged at once, at least 1: with 1 (the default), a
            save waits for the previous save's write to finish before it copies; with 2, it
            copies into the other buffer (twice the memory).
        name: what the log calls this area (e.g. the job).

    Raises:
        TypeError, ValueError: ``buffers`` is not an int in [1, 64].
    """

    def __init__(self, buffers: int = 1, *, name: str = "") -> None:
        self.buffers = check_int("buffers", buffers, low=1, high=64)
        self.name = name
        self._cond = threading.Condition()
        self._pool: list[_Buffer] = []
        #: seconds the last ``stage`` waited for a free buffer
        self.last_wait = 0.0

    def __repr__(self) -> str:
        return f"StagingArea(buffers={self.buffers}, nbytes={self.nbytes}, name={self.name!r})"

    @property
    def nbytes(self) -> int:
        """Bytes of staging memory allocated now (every buffer)."""
        with self._cond:
            return sum(len(b.arena) for b in self._pool)

    @property
    def in_use(self) -> int:
        """Buffers held by saves in flight now."""
        with self._cond:
            return sum(1 for b in self._pool if b.users)

    def stage(
        self, states: Mapping[str, Any], timeout: float | None = None
    ) -> dict[str, StagedPart]:
        """Copy the tensors of ``states`` into a free buffer; return one part per state.

        Each part is reserved for the save that takes it (``DeferredPart.hold``); a part no
        save took must be ``drop``-ped, or its buffer stays in use.

        Args:
            states: part name -> a state (``state_dict()``: nested dicts, lists, tuples of
                tensors and plain values).
            timeout: seconds to wait for a free buffer (None: as long as it takes).

        Returns:
            Part name -> its staged part.

        Raises:
            TimeoutError: no buffer came free within ``timeout``.
            Exception: deep-copying a value of the state failed (the buffer is freed).
        """
        plans = {part: _plan(state) for part, state in states.items()}
        total = 0
        for plan in plans.values():
            for key, storage in plan.storages.items():
                plan.offsets[key] = total
                total += -(-storage.nbytes() // ALIGN) * ALIGN
        started = time.monotonic()
        buffer = self._take(total, len(plans), timeout)
        self.last_wait = time.monotonic() - started
        try:
            parts = {}
            for part, plan in plans.items():
                staged = _copy_into(buffer.arena, plan)
                parts[part] = StagedPart(self, buffer, buffer.generation, part, staged,
                                         plan.nbytes)  # fmt: skip
        except BaseException:
            with self._cond:
                buffer.users = 0
                self._cond.notify_all()
            raise
        return parts

    def clear(self) -> None:
        """Free every buffer not in use (the next ``stage`` allocates again)."""
        with self._cond:
            self._pool = [b for b in self._pool if b.users]

    # -- plumbing ----------------------------------------------------------------------------
    def _take(self, nbytes: int, users: int, timeout: float | None) -> _Buffer:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                free = [b for b in self._pool if not b.users]
                if free or len(self._pool) < self.buffers:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(
                        f"no staging buffer came free within {timeout} s ({self.buffers} "
                        "in use by saves still writing)"
                    )
                self._cond.wait(left)
            if free:
                # the one that fits best, else the largest (it grows the least)
                fits = [b for b in free if len(b.arena) >= nbytes]
                buffer = min(fits, key=lambda b: len(b.arena)) if fits else max(
                    free, key=lambda b: len(b.arena))  # fmt: skip
            else:
                buffer = _Buffer()
                self._pool.append(buffer)
            buffer.users = users
            buffer.generation += 1
            grow = len(buffer.arena) < nbytes
        if grow:  # outside the lock: allocating is slow, and the buffer is ours now
            try:
                buffer.arena = np.empty(0, dtype=np.uint8)  # the old one goes first
                buffer.arena = np.empty(nbytes, dtype=np.uint8)
            except BaseException:  # (MemoryError) the buffer is free again, not held forever
                with self._cond:
                    buffer.users = 0
                    self._cond.notify_all()
                raise
            buffer.base = int(buffer.arena.ctypes.data)
            log.info(
                "strata_redis.torch: staging buffer %s to %.1f MiB; the staging area%s holds "
                "%.1f MiB in %d buffer(s) (at most %d)",
                "grown" if buffer.generation > 1 else "allocated", nbytes / 2**20,
                f" of {self.name}" if self.name else "", self.nbytes / 2**20,
                len(self._pool), self.buffers,
            )  # fmt: skip
        return buffer

    def _hold(self, part: StagedPart) -> None:
        with self._cond:
            if part._buffer.generation != part._generation:
                raise CheckpointError(
                    f"the staged state of part {part.name!r} is gone: its staging buffer "
                    "was reused by a later save", job_id=self.name,
                )  # fmt: skip
            part._buffer.users += 1

    def _release(self, buffer: _Buffer) -> None:
        with self._cond:
            buffer.users -= 1
            if buffer.users <= 0:
                buffer.users = 0
                self._cond.notify_all()


class StagedPart(DeferredPart):
    """One object's state staged in a buffer, serialized with ``torch.save`` when saved.

    Attributes:
        name: the part's name (``model.pt``).
        nbytes: bytes of tensor storage staged for it.
    """

    def __init__(
        self, area: StagingArea, buffer: _Buffer, generation: int, name: str, state: Any,
        nbytes: int,
    ) -> None:  # fmt: skip
        self.name = name
        self.nbytes = nbytes
        self._area = area
        self._buffer = buffer
        self._generation = generation
        self._state = state
        self._reserved = True
        self._reserve_lock = threading.Lock()  # the reservation (never held for long)
        self._lock = threading.Lock()  # the serialization, on the upload thread
        self._chunks: list[memoryview] | None = None

    def __repr__(self) -> str:
        return f"StagedPart({self.name!r}, {self.nbytes} bytes of tensors)"

    @property
    def size_hint(self) -> int:
        """The staged tensor bytes (the serialized part adds its records' few KiB)."""
        return self.nbytes

    def hold(self) -> None:
        """A save takes the part (the first takes the reservation ``stage`` made).

        Raises:
            CheckpointError: the buffer was staged into again since (a later save).
        """
        with self._reserve_lock:
            if self._reserved:
                self._reserved = False
                return
        self._area._hold(self)

    def drop(self) -> None:
        """Give up the reservation if no save took the part (else nothing)."""
        with self._reserve_lock:
            reserved, self._reserved = self._reserved, False
        if reserved:
            self._area._release(self._buffer)

    def release(self) -> None:
        """A save is done with the part."""
        self._area._release(self._buffer)

    def chunks(self) -> list[memoryview]:
        """Serialize the staged state (``torch.save``, no per-record CRC: strata checksums
        the part): small records copied, tensor bytes as views of the staging buffer."""
        with self._lock:
            if self._chunks is None:
                sink = _Sink(self._buffer.arena, self._buffer.base)
                with _without_zip_crc():
                    torch.save(self._state, sink)
                self._chunks = sink.finish()
            return self._chunks


# -- staging a state --------------------------------------------------------------------------
class _Plan:
    """What staging one state takes: its distinct tensor storages, where each goes."""

    __slots__ = ("nbytes", "offsets", "state", "storages", "tensors")

    def __init__(self, state: Any) -> None:
        self.state = state
        self.tensors: list[torch.Tensor] = []  # every stageable tensor, once
        self.storages: dict[int, torch.UntypedStorage] = {}  # key -> storage
        self.offsets: dict[int, int] = {}  # key -> offset in the buffer
        self.nbytes = 0


def _stageable(t: torch.Tensor) -> bool:
    """A dense tensor whose storage bytes are its values (else it is deep-copied instead)."""
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.layout == torch.strided
        and not t.is_quantized
        and not t.is_conj()
        and not t.is_neg()
        and t.device.type != "meta"
    )


def _plan(state: Any) -> _Plan:
    plan = _Plan(state)
    seen: set[int] = set()

    def walk(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            if id(obj) in seen or not _stageable(obj):
                return
            seen.add(id(obj))
            plan.tensors.append(obj)
            storage = obj.untyped_storage()
            key = storage._cdata  # tensors sharing a storage (tied weights) share its copy
            if key not in plan.storages:
                plan.storages[key] = storage
                plan.nbytes += storage.nbytes()
        elif isinstance(obj, Mapping):
            for value in obj.values():
                walk(value)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for value in obj:
                walk(value)

    walk(state)
    return plan


def _copy_into(arena: np.ndarray, plan: _Plan) -> Any:
    """Copy the plan's storages into ``arena``; return the state with staged tensors."""
    staged_storages: dict[int, torch.UntypedStorage] = {}
    for key, storage in plan.storages.items():
        start, size = plan.offsets[key], storage.nbytes()
        target = arena[start : start + size]
        if size:
            if storage.device.type == "cpu":
                source = torch.empty(0, dtype=torch.uint8).set_(storage)
                np.copyto(target, source.numpy())  # one memcpy (numpy's beats torch's here)
            else:
                source = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
                torch.from_numpy(target).copy_(source)  # device to host, synchronous
        staged_storages[key] = torch.from_numpy(target).untyped_storage()
    memo: dict[int, Any] = {}
    for t in plan.tensors:
        storage = staged_storages[t.untyped_storage()._cdata]
        staged = torch.empty(0, dtype=t.dtype).set_(
            storage, t.storage_offset(), t.size(), t.stride()
        )
        if isinstance(t, torch.nn.Parameter):  # (as torch.save would record it)
            staged = torch.nn.Parameter(staged, requires_grad=t.requires_grad)
        elif t.requires_grad:
            staged.requires_grad_(True)
        memo[id(t)] = staged
    memo[id(memo)] = [plan.tensors]  # deepcopy's keep-alive list: the originals stay put
    # the rest (plain values, containers, tensors not staged) is deep-copied: the loop may
    # change any of it once save returns
    return copy.deepcopy(plan.state, memo)


# -- serializing from the buffer --------------------------------------------------------------
class _Sink:
    """The file ``torch.save`` writes to: tensor bytes it hands over from the staging buffer are
    kept as views of the buffer (no copy); anything else is copied (its memory is torch's)."""

    def __init__(self, arena: np.ndarray, base: int) -> None:
        self._arena = arena
        self._view = arena.data.cast("B") if len(arena) else memoryview(b"")
        self._base = base
        self._end = base + len(arena)
        self._chunks: list[memoryview] = []
        self._small = bytearray()
        self._pos = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        if size >= 4096:
            address = int(np.frombuffer(view, dtype=np.uint8).ctypes.data)
            if self._base <= address and address + size <= self._end:
                if self._small:
                    self._chunks.append(memoryview(bytes(self._small)))
                    self._small.clear()
                offset = address - self._base
                self._chunks.append(self._view[offset : offset + size])
                self._pos += size
                return size
        self._small += view
        self._pos += size
        return size

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        pass

    def finish(self) -> list[memoryview]:
        if self._small:
            self._chunks.append(memoryview(bytes(self._small)))
            self._small.clear()
        return self._chunks


def _without_zip_crc() -> Any:
    """torch.save without its per-record CRC-32 (a third of its time for big tensors): strata
    checksums every part it stores and verifies it on load.

    It runs on upload threads, so only where torch keeps the setting per thread (its config
    entries are context variables, as in torch 2.13); where the setting is the process'
    (older torch), two saves or the loop's own ``torch.save`` would see each other's, and
    the CRC stays on."""
    import contextlib
    from contextvars import ContextVar

    try:
        from torch.utils.serialization import config
    except ImportError:  # torch before the serialization config: nothing to turn off
        return contextlib.nullcontext()
    entry = getattr(config, "_config", {}).get("save.compute_crc32")
    if not isinstance(getattr(entry, "user_override", None), ContextVar):
        return contextlib.nullcontext()
    return config.patch({"save.compute_crc32": False})

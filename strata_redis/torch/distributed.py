"""``torch.distributed`` started from strata's rendezvous: rank and world size from the round,
the process group's store in one Redis hash of the job (no extra server, no master port)."""

from __future__ import annotations

import base64
import os
import time
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import redis as redis_py
import torch.distributed as dist
from torch.distributed import DistStoreError

from ..connection import another_client
from ..context import HasContext, JobContext, as_context
from ..orchestrator import TrainingOrchestrator
from ..validate import check_seconds
from .peers import PeerWatch

__all__ = ["RedisStore", "init_process_group", "store_of"]

#: how long a round's store hash is kept after its last write
STORE_TTL_S = 86_400
#: the longest pause between two looks at a key a ``get`` or ``wait`` waits for
MAX_POLL_S = 0.05


def _encode(value: Any) -> str:
    return "b:" + base64.b64encode(_raw(value)).decode()


def _raw(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _decode(stored: str) -> bytes:
    # set() stores "b:" + base64; add() stores a bare counter, read back as its digits
    return base64.b64decode(stored[2:]) if stored.startswith("b:") else stored.encode()


class RedisStore(dist.Store):  # type: ignore[misc]
    """A ``torch.distributed`` store kept in one hash of the job (``keys.torch_store``).

    Every key of a round lives in ``strata:{job}:torch_store:<round>``, in the job's hash
    slot, so it works on Redis Cluster and under the worker ACL rule. ``get`` and ``wait``
    poll (at most every 50 ms) until the key appears or the timeout passes, then raise
    ``torch.distributed.DistStoreError`` (a ``RuntimeError``), as torch's own stores do.
    The timeout is the C++ store's (``store.timeout``), so ``set_timeout`` and torch's
    ``store_timeout()`` context change it. The extended API (``append``, ``multi_get``,
    ``multi_set``) is supported; queues (``queue_push``/``queue_pop``) are not
    (``NotImplementedError``, torch's default).

    Args:
        context: the job (a ``JobContext`` or what holds one, e.g. the orchestrator's).
        round_: the rendezvous round whose store this is.
        timeout: seconds ``get``/``wait`` wait for a key.
    """

    def __init__(self, context: JobContext | HasContext, round_: int, timeout: float = 300.0):
        super().__init__()
        self._ctx = as_context(context)
        self._round = round_
        self._key = self._ctx.keys.torch_store(round_)
        self._client: Any = self._ctx.client
        self._clones: list[RedisStore] = []
        seconds = check_seconds("timeout", timeout, high=7 * 86400)
        super().set_timeout(timedelta(seconds=seconds))

    def __repr__(self) -> str:
        return f"RedisStore({self._key!r})"

    # -- the Store interface ----------------------------------------------------------------
    def set(self, key: str, value: Any) -> None:
        with self._client.pipeline(transaction=False) as pipe:
            pipe.hset(self._key, key, _encode(value))
            pipe.expire(self._key, STORE_TTL_S)
            pipe.execute()

    def get(self, key: str) -> bytes:
        return _decode(self._wait_for(key, self._seconds()))

    def add(self, key: str, amount: int) -> int:
        with self._client.pipeline(transaction=False) as pipe:
            pipe.hincrby(self._key, key, int(amount))
            pipe.expire(self._key, STORE_TTL_S)
            value, _ = pipe.execute()
        return int(value)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        want = _raw(expected)

        def update(current: bytes | None) -> bytes | None:
            if (current is None and want) or (current is not None and current != want):
                return None
            return _raw(desired)

        stored, current = self._update(key, update)
        if stored is not None:
            return stored
        return want if current is None else current

    def append(self, key: str, value: Any) -> None:
        self._update(key, lambda current: (current or b"") + _raw(value))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        if not keys:
            return []
        stored = self._client.hmget(self._key, keys)  # one round trip when all are there
        if None in stored:
            self.wait([key for key, value in zip(keys, stored, strict=True) if value is None])
            stored = self._client.hmget(self._key, keys)
            if None in stored:
                gone = [key for key, value in zip(keys, stored, strict=True) if value is None]
                raise DistStoreError(f"{self!r}: keys {gone!r} were deleted during multi_get")
        return [_decode(str(value)) for value in stored]

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"multi_set: {len(keys)} keys but {len(values)} values")
        if not keys:
            return
        with self._client.pipeline(transaction=False) as pipe:
            pipe.hset(self._key, mapping={k: _encode(v) for k, v in zip(keys, values, strict=True)})
            pipe.expire(self._key, STORE_TTL_S)
            pipe.execute()

    def has_extended_api(self) -> bool:
        return True

    def check(self, keys: list[str]) -> bool:
        if not keys:
            return True
        with self._client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hexists(self._key, key)
            return all(pipe.execute())

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        seconds = self._seconds() if timeout is None else timeout.total_seconds()
        deadline = time.monotonic() + seconds
        for key in keys:
            self._wait_for(key, max(0.0, deadline - time.monotonic()))

    def delete_key(self, key: str) -> bool:
        return bool(self._client.hdel(self._key, key))

    def num_keys(self) -> int:
        return int(self._client.hlen(self._key))

    def clone(self) -> RedisStore:
        """A store of the same hash and timeout on a client (connection pool) of its own.

        torch takes a clone into C++ and keeps only its C++ half, so this store holds each
        clone it made (freed with it, their clients closed then): a clone freed while torch
        still used it would fail every call with "Not implemented".
        """
        other = RedisStore(self._ctx, self._round, timeout=self._seconds())
        other._client = another_client(self._client, max_connections=4, name="torch store")
        if other._client is not self._client:
            weakref.finalize(other, other._client.close)
        self._clones.append(other)
        return other

    # -- plumbing -----------------------------------------------------------------------------
    def _seconds(self) -> float:
        return float(self.timeout.total_seconds())

    def _update(
        self, key: str, change: Callable[[bytes | None], bytes | None]
    ) -> tuple[bytes | None, bytes | None]:
        """Set ``key`` to ``change(current)`` atomically (WATCH); None leaves it. Returns
        (what was stored or None, the value it was computed from)."""
        with self._client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(self._key)
                    stored = pipe.hget(self._key, key)
                    current = None if stored is None else _decode(stored)
                    new = change(current)
                    if new is None:
                        pipe.unwatch()
                        return None, current
                    pipe.multi()
                    pipe.hset(self._key, key, _encode(new))
                    pipe.expire(self._key, STORE_TTL_S)
                    pipe.execute()
                    return new, current
                except redis_py.WatchError:
                    continue

    def _wait_for(self, key: str, seconds: float) -> str:
        deadline = time.monotonic() + seconds
        pause = 0.001
        while True:
            stored = self._client.hget(self._key, key)
            if stored is not None:
                return str(stored)
            left = deadline - time.monotonic()
            if left <= 0:
                raise DistStoreError(
                    f"{self!r}: timeout: key {key!r} did not appear within {seconds:.1f}s "
                    "(a rank of the round never started its process group?)"
                )
            time.sleep(min(pause, left))
            pause = min(MAX_POLL_S, pause * 2)


#: the store of each process group ``init_process_group`` started: a ``RedisStore`` is a
#: Python object behind torch's C++ store, and the group holds only the C++ half; freed,
#: every later call through it (``new_group``, a device mesh) fails "Not implemented".
#: Weak on the group: holding the group itself would keep its backend (gloo's threads)
#: alive past ``destroy_process_group()`` into interpreter exit, where a gloo thread that
#: frees a tensor takes the GIL of a finalizing interpreter and aborts the process
#: ("terminate called without an active exception", exit -6, after the script's last line)
_LIVE_STORES: weakref.WeakKeyDictionary[Any, RedisStore] = weakref.WeakKeyDictionary()
#: the peer watch of the running default group (``peers.py``)
_WATCHES: list[PeerWatch] = []


def store_of(group: Any = None) -> RedisStore | None:
    """The ``RedisStore`` that ``init_process_group`` gave ``group`` (default: the default
    group), or None when it did not start it."""
    if group is None:
        group = dist.group.WORLD
    return _LIVE_STORES.get(group)


def init_process_group(
    orchestrator: TrainingOrchestrator,
    backend: str = "gloo",
    *,
    timeout: float = 300.0,
    peer_watch: bool | None = None,
    **kwargs: Any,
) -> RedisStore:
    """Start ``torch.distributed`` for the orchestrator's current round.

    Rank and world size are the round's; the store is a ``RedisStore`` of the round, so
    there is no master address or port to agree on. After a round breaks (``on_round``),
    call ``torch.distributed.destroy_process_group()`` and this again.

    The caller need not keep the returned store: this module holds it (``store_of(group)``)
    for as long as the process group lives, since torch keeps only the C++ half of a Python
    store; it goes with the group (``destroy_process_group()`` frees both), and it holds no
    connection of its own (it uses the orchestrator's client).

    Args:
        orchestrator: this worker's orchestrator.
        backend: ``"gloo"`` (CPU), ``"nccl"`` (GPU), ...
        timeout: seconds for the group's collectives and for the store's waits.
        peer_watch: when a member of the round is declared failed, abort the group and exit
            this process with 76 (``peers.PeerWatch``), so no rank waits for ``timeout`` in a
            collective: torchrun restarts it without the dead member (give torchrun
            ``--max-restarts`` of 1 or more). None: on under torchrun (``TORCHELASTIC_RUN_ID``
            set), where the alternative is the same restart after the backend's timeout.
        kwargs: passed to ``torch.distributed.init_process_group``.

    Returns:
        The store (also reachable through the process group and ``store_of()``).

    Raises:
        TypeError: ``orchestrator`` is not a ``TrainingOrchestrator``.
        RuntimeError: a default process group is already running.
    """
    if not isinstance(orchestrator, TrainingOrchestrator):
        raise TypeError(
            f"orchestrator must be a TrainingOrchestrator, got {type(orchestrator).__name__}"
        )
    timeout = check_seconds("timeout", timeout, high=7 * 86400)
    if dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is already initialized: call "
            "torch.distributed.destroy_process_group() first (e.g. in on_round)"
        )
    for watch in _WATCHES:
        watch.stop()
    _WATCHES.clear()
    round_ = orchestrator.round
    store = RedisStore(orchestrator.context, round_.number, timeout=timeout)
    dist.init_process_group(
        backend, store=store, rank=round_.rank, world_size=round_.world_size,
        timeout=timedelta(seconds=timeout), **kwargs,
    )  # fmt: skip
    _LIVE_STORES[dist.group.WORLD] = store
    if peer_watch is None:
        peer_watch = "TORCHELASTIC_RUN_ID" in os.environ
    if peer_watch:
        _WATCHES.append(PeerWatch(orchestrator))
    return store

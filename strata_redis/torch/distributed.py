"""``torch.distributed`` started from strata's rendezvous: rank and world size from the round,
the process group's store in one Redis hash of the job (no extra server, no master port)."""

from __future__ import annotations

import base64
import time
from datetime import timedelta
from typing import Any

import redis as redis_py
import torch.distributed as dist

from ..context import HasContext, JobContext, as_context
from ..orchestrator import TrainingOrchestrator
from ..validate import check_seconds

__all__ = ["RedisStore", "init_process_group"]

#: how long a round's store hash is kept after its last write
STORE_TTL_S = 86_400
#: the longest pause between two looks at a key a ``get`` or ``wait`` waits for
MAX_POLL_S = 0.05


def _encode(value: Any) -> str:
    raw = value.encode() if isinstance(value, str) else bytes(value)
    return "b:" + base64.b64encode(raw).decode()


def _decode(stored: str) -> bytes:
    # set() stores "b:" + base64; add() stores a bare counter, read back as its digits
    return base64.b64decode(stored[2:]) if stored.startswith("b:") else stored.encode()


class RedisStore(dist.Store):  # type: ignore[misc]
    """A ``torch.distributed`` store kept in one hash of the job (``keys.torch_store``).

    Every key of a round lives in ``strata:{job}:torch_store:<round>``, in the job's hash
    slot, so it works on Redis Cluster and under the worker ACL rule. ``get`` and ``wait``
    poll (at most every 50 ms) until the key appears or the timeout passes.

    Args:
        context: the job (a ``JobContext`` or what holds one, e.g. the orchestrator's).
        round_: the rendezvous round whose store this is.
        timeout: seconds ``get``/``wait`` wait for a key.
    """

    def __init__(self, context: JobContext | HasContext, round_: int, timeout: float = 300.0):
        super().__init__()
        self._ctx = as_context(context)
        self._key = self._ctx.keys.torch_store(round_)
        self._timeout = check_seconds("timeout", timeout, high=7 * 86400)

    def __repr__(self) -> str:
        return f"RedisStore({self._key!r})"

    # -- the Store interface ----------------------------------------------------------------
    def set(self, key: str, value: Any) -> None:
        with self._ctx.client.pipeline(transaction=False) as pipe:
            pipe.hset(self._key, key, _encode(value))
            pipe.expire(self._key, STORE_TTL_S)
            pipe.execute()

    def get(self, key: str) -> bytes:
        return _decode(self._wait_for(key, self._timeout))

    def add(self, key: str, amount: int) -> int:
        with self._ctx.client.pipeline(transaction=False) as pipe:
            pipe.hincrby(self._key, key, int(amount))
            pipe.expire(self._key, STORE_TTL_S)
            value, _ = pipe.execute()
        return int(value)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        want = bytes(expected.encode() if isinstance(expected, str) else expected)
        client = self._ctx.client
        with client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(self._key)
                    stored = pipe.hget(self._key, key)
                    current = None if stored is None else _decode(stored)
                    if (current is None and want) or (current is not None and current != want):
                        pipe.unwatch()
                        return want if current is None else current
                    pipe.multi()
                    pipe.hset(self._key, key, _encode(desired))
                    pipe.expire(self._key, STORE_TTL_S)
                    pipe.execute()
                    return bytes(desired.encode() if isinstance(desired, str) else desired)
                except redis_py.WatchError:
                    continue

    def check(self, keys: list[str]) -> bool:
        if not keys:
            return True
        with self._ctx.client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hexists(self._key, key)
            return all(pipe.execute())

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        seconds = self._timeout if timeout is None else timeout.total_seconds()
        deadline = time.monotonic() + seconds
        for key in keys:
            self._wait_for(key, max(0.0, deadline - time.monotonic()))

    def delete_key(self, key: str) -> bool:
        return bool(self._ctx.client.hdel(self._key, key))

    def num_keys(self) -> int:
        return int(self._ctx.client.hlen(self._key))

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout.total_seconds()

    # -- plumbing -----------------------------------------------------------------------------
    def _wait_for(self, key: str, seconds: float) -> str:
        deadline = time.monotonic() + seconds
        pause = 0.001
        while True:
            stored = self._ctx.client.hget(self._key, key)
            if stored is not None:
                return str(stored)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"{self!r}: key {key!r} did not appear within {seconds:.1f}s "
                    "(a rank of the round never started its process group?)"
                )
            time.sleep(min(pause, left))
            pause = min(MAX_POLL_S, pause * 2)


def init_process_group(
    orchestrator: TrainingOrchestrator,
    backend: str = "gloo",
    *,
    timeout: float = 300.0,
    **kwargs: Any,
) -> RedisStore:
    """Start ``torch.distributed`` for the orchestrator's current round.

    Rank and world size are the round's; the store is a ``RedisStore`` of the round, so
    there is no master address or port to agree on. After a round breaks (``on_round``),
    call ``torch.distributed.destroy_process_group()`` and this again.

    Args:
        orchestrator: this worker's orchestrator.
        backend: ``"gloo"`` (CPU), ``"nccl"`` (GPU), ...
        timeout: seconds for the group's collectives and for the store's waits.
        kwargs: passed to ``torch.distributed.init_process_group``.

    Returns:
        The store (also reachable through the process group).

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
    round_ = orchestrator.round
    store = RedisStore(orchestrator.context, round_.number, timeout=timeout)
    dist.init_process_group(
        backend, store=store, rank=round_.rank, world_size=round_.world_size,
        timeout=timedelta(seconds=timeout), **kwargs,
    )  # fmt: skip
    return store

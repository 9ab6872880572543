"""Shared blocking pops: one connection per job and process serves every barrier waiter
that waits for a release token, instead of one blocked connection each.

A barrier waiter (all but a generation's first ``WATCHERS`` arrivals, which read the wake
stream) waits for one release token on its generation's release list. Every such waiter of
a job in this process registers its list with the job's ``ReleasePops``; one daemon thread
BLPOPs all the registered lists at once (Redis' multi-key BLPOP; the keys share the job's
hash tag, so one slot under Redis Cluster) and hands each token to a waiter of its list,
taking the tokens of the list's other waiters here with one LPOP. A waiter that registers a
list the thread is not blocked on rings this process's doorbell (a list of its own) so the
BLPOP returns and takes the new list in. A token nobody here waits for any more (its waiter
timed out meanwhile) goes back to its list. The thread ends when nobody waits. Waiters still
bound their waits in slices and read the barrier's record between them, as before.
"""

from __future__ import annotations

import logging
import secrets
import threading
from typing import Final

import redis

from ..context import JobContext

__all__ = ["ReleasePops", "release_pops"]

log = logging.getLogger("strata_redis.waiters")

#: how long a doorbell outlives its last ring (ms)
DOORBELL_TTL_MS: Final = 60_000


class _Slot:
    """One waiter's place in line for a token of ``key``."""

    __slots__ = ("event", "key", "token")

    def __init__(self, key: str) -> None:
        self.key = key
        self.event = threading.Event()
        self.token: str | None = None


class ReleasePops:
    """This process's shared blocking pop over one job's release lists.

    Args:
        context: the job.
    """

    def __init__(self, context: JobContext) -> None:
        self.context = context
        self.doorbell = context.keys.waiters_doorbell(secrets.token_hex(6))
        self._lock = threading.Lock()
        self._slots: dict[str, list[_Slot]] = {}
        self._listening: frozenset[str] = frozenset()
        self._thread: threading.Thread | None = None

    @property
    def waiting(self) -> int:
        """How many waiters wait now."""
        with self._lock:
            return sum(len(slots) for slots in self._slots.values())

    def pop(self, key: str, timeout: float) -> str | None:
        """A token of list ``key``, or None after ``timeout`` seconds without one."""
        slot = _Slot(key)
        ring = False
        with self._lock:
            self._slots.setdefault(key, []).append(slot)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"strata-release-pops-{self.context.job_id}",
                    daemon=True,
                )  # fmt: skip
                self._thread.start()
            elif key not in self._listening:
                ring = True
        if ring:
            with self.context.client.pipeline(transaction=False) as pipe:
                pipe.rpush(self.doorbell, "1")
                pipe.pexpire(self.doorbell, DOORBELL_TTL_MS)
                pipe.execute()
        slot.event.wait(timeout)
        with self._lock:
            if slot.token is None:  # not served in time: leave the line
                slots = self._slots.get(key)
                if slots is not None and slot in slots:
                    slots.remove(slot)
                    if not slots:
                        del self._slots[key]
            return slot.token

    def _run(self) -> None:
        client = self.context.client
        block = max(0.05, self.context.max_block)
        failing = False  # logged once per outage, not once per attempt
        while True:
            with self._lock:
                keys = list(self._slots)
                if not keys:
                    self._thread, self._listening = None, frozenset()
                    return
                self._listening = frozenset(keys)
            try:
                popped = client.blpop([*keys, self.doorbell], timeout=block)
                if failing:
                    failing = False
                    log.info("job %r: shared release pop works again", self.context.job_id)
                if popped is None:
                    continue
                key, token = popped
                if key == self.doorbell:
                    client.delete(self.doorbell)
                    continue
                self._deliver(key, [token])
                with self._lock:
                    more = len(self._slots.get(key, ()))
                if more:
                    self._deliver(key, client.lpop(key, more) or [])
            except redis.RedisError as exc:
                # the waiters' slices end and they read the barrier's record themselves (and
                # ride out an outage: outage.py)
                if not failing:
                    log.warning("job %r: shared release pop failed: %s", self.context.job_id, exc)
                failing = True
                threading.Event().wait(min(block, 0.5))

    def _deliver(self, key: str, tokens: list[str]) -> None:
        back = []
        with self._lock:
            slots = self._slots.get(key, [])
            for token in tokens:
                if slots:
                    slot = slots.pop(0)
                    slot.token = token
                    slot.event.set()
                else:
                    back.append(token)
            if not slots:
                self._slots.pop(key, None)
        if back:  # their waiters left: the tokens are someone else's
            self.context.client.lpush(key, *reversed(back))


def release_pops(context: JobContext) -> ReleasePops:
    """The job's shared pop in this process (made on first use)."""
    return context.memo("release_pops", lambda: ReleasePops(context))

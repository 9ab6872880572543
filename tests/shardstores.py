"""Storages for the shard tests: one that counts the reads of each object, one that fails
while an outage lasts (both wrap a real backend and pass everything else through)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from strata_redis.errors import StorageError
from strata_redis.storage import Storage


class Counting(Storage):
    """``inner``, counting the reads (whole and ranged) of each path; with ``log``, each read
    is also appended to that file (one path a line), for reads in other processes. With
    ``in_place``, an inner storage's own files are offered to be read in place
    (``local_file``), each offer logged as ``place <path>`` (and counted in ``placed``)."""

    def __init__(self, inner: Storage, log: str | None = None, in_place: bool = False) -> None:
        self.inner = inner
        self.remote = inner.remote  # (a remote one's shards are copied in helper processes)
        self.log = log
        self.in_place = in_place
        self.reads: Counter[str] = Counter()
        self.ranged: Counter[str] = Counter()
        self.placed: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _note(self, path: str, kind: str) -> None:
        with self._lock:
            {"read": self.reads, "range": self.ranged, "place": self.placed}[kind][path] += 1
            if self.log is not None:
                with open(self.log, "a") as out:
                    out.write(f"{kind} {path}\n")

    def local_file(self, path: str) -> str | None:
        file = self.inner.local_file(path) if self.in_place else None
        if file is not None:
            self._note(path, "place")
        return file

    def read(self, path: str) -> bytes:
        self._note(path, "read")
        return self.inner.read(path)

    def read_range(self, path: str, start: int, length: int) -> bytes:
        self._note(path, "range")
        return self.inner.read_range(path, start, length)

    def write(self, path: str, data: object) -> None:
        self.inner.write(path, data)

    def write_if_absent(self, path: str, data: object) -> None:
        self.inner.write_if_absent(path, data)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def delete(self, path: str) -> None:
        self.inner.delete(path)

    def list(self, prefix: str = "") -> list[str]:
        return self.inner.list(prefix)

    def describe(self) -> str:
        return self.inner.describe()

    def __getstate__(self) -> dict[str, Any]:
        return {"inner": self.inner, "log": self.log, "in_place": self.in_place}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["inner"], state["log"], state["in_place"])  # type: ignore[misc]


class Outage(Counting):
    """``inner`` whose reads of shard bytes fail with ``StorageError`` (as an unreachable S3
    does) after ``after`` of them succeeded, until ``fail`` more reads failed (``None``:
    for good)."""

    def __init__(self, inner: Storage, after: int, fail: int | None) -> None:
        super().__init__(inner)
        self.after, self.fail = after, fail
        self.failed = 0

    def _maybe_fail(self, path: str) -> None:
        if not path.endswith(".tar"):
            return
        with self._lock:
            if self.after > 0:
                self.after -= 1
                return
            if self.fail is not None and self.failed >= self.fail:
                return
            self.failed += 1
        raise StorageError(
            f"{self.describe()}: cannot read {path!r}: Connection refused (an outage)",
            backend=self.describe(), path=path,
        )  # fmt: skip

    def read(self, path: str) -> bytes:
        self._maybe_fail(path)
        return super().read(path)

    def read_range(self, path: str, start: int, length: int) -> bytes:
        self._maybe_fail(path)
        return super().read_range(path, start, length)


def sample_bytes(i: int) -> bytes:
    """Sample ``i``'s bytes: its id, then some padding that depends on it."""
    return f"sample-{i:07d}|".encode() + bytes([i % 251]) * (i % 37)


def sample_id(data: bytes) -> int:
    return int(data[7:14])


__all__ = ["Counting", "Outage", "sample_bytes", "sample_id"]

"""CRC-32 of checkpoint bytes: zlib's, split over threads and combined, off the caller's thread.

The checksum is the standard CRC-32 (``zlib.crc32``, the one S3 calls ``CRC32``), written as
``"crc32:<8 hex digits>"``. ``zlib.crc32`` releases the GIL, so large buffers are cut into
chunks hashed in parallel and the chunk CRCs are combined (zlib's ``crc32_combine``, which
Python does not expose, is reimplemented here: a few hundred integer operations per chunk).
"""

from __future__ import annotations

import zlib
from concurrent.futures import Executor, Future

__all__ = [
    "ALGORITHM",
    "CHUNK",
    "PendingCrc",
    "crc32_chunks",
    "crc32_combine",
    "format_checksum",
    "parallel_crc32",
]

ALGORITHM = "crc32"
#: buffers are hashed in chunks of at least this many bytes, one per thread
CHUNK = 16 * 1024 * 1024
_POLY = 0xEDB88320  # CRC-32's polynomial, bit-reflected


def _multmodp(a: int, b: int) -> int:
    """a(x) * b(x) modulo the CRC polynomial, both bit-reflected (zlib's multmodp)."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> list[int]:
    table = [1 << 30]  # x^1
    for _ in range(31):
        table.append(_multmodp(table[-1], table[-1]))
    return table


_X2N = _x2n_table()  # x^(2^n) modulo the polynomial


def _x8nmodp(length: int) -> int:
    """x^(8 * length) modulo the polynomial: the shift of appending ``length`` bytes."""
    p = 1 << 31  # x^0
    k = 3
    while length:
        if length & 1:
            p = _multmodp(_X2N[k & 31], p)
        length >>= 1
        k += 1
    return p


def crc32_combine(crc1: int, crc2: int, length2: int) -> int:
    """Return the CRC-32 of ``A + B`` from ``crc32(A)``, ``crc32(B)`` and ``len(B)``."""
    return _multmodp(_x8nmodp(length2), crc1) ^ crc2


class PendingCrc:
    """A CRC-32 being computed on an executor: chunks hashed in parallel, combined at the end."""

    def __init__(self, data: memoryview, executor: Executor | None, parts: int) -> None:
        size = len(data)
        count = max(1, min(parts, size // CHUNK))
        step = -(-size // count) if size else 1
        self._lengths = [min(step, size - start) for start in range(0, size, step)] or [0]
        if executor is None:
            self._futures: list[Future[int]] | None = None
            self._crc = zlib.crc32(data)
            return
        chunks = [data[start : start + step] for start in range(0, size, step)] or [data]
        self._futures = [executor.submit(zlib.crc32, chunk) for chunk in chunks]

    def result(self) -> int:
        """Wait for every chunk; return the CRC-32 of the whole buffer.

        Raises:
            Exception: whatever hashing a chunk raised.
        """
        if self._futures is None:
            return self._crc
        crc = self._futures[0].result()
        for future, length in zip(self._futures[1:], self._lengths[1:], strict=True):
            crc = crc32_combine(crc, future.result(), length)
        return crc


def parallel_crc32(data: memoryview, executor: Executor | None, parts: int = 2) -> int:
    """Return the CRC-32 of ``data``, hashed in up to ``parts`` chunks at once on ``executor``.

    Args:
        data: a flat byte view.
        executor: where the chunks run; None hashes on the calling thread.
        parts: how many chunks at most (a buffer under ``2 * CHUNK`` bytes is one chunk).

    Returns:
        The CRC-32, an unsigned 32-bit int.
    """
    return PendingCrc(data, executor, parts).result()


def crc32_chunks(chunks: list[memoryview]) -> int:
    """Return the CRC-32 of the chunks one after the other, on the calling thread."""
    crc = 0
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)
    return crc


def format_checksum(crc: int) -> str:
    """``"crc32:<8 lowercase hex digits>"``: how metadata.json and Redis write a checksum."""
    return f"{ALGORITHM}:{crc:08x}"

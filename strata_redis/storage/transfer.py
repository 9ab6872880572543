"""S3 transfer mechanics: S3's size limits, part sizing, zero-copy readers over buffers."""

from __future__ import annotations

import bisect
import io
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = [
    "MAX_OBJECT_SIZE",
    "MAX_PARTS",
    "MAX_PART_SIZE",
    "MAX_PUT_SIZE",
    "MIN_PART_SIZE",
    "ByteReader",
    "ChunksReader",
    "KnownObject",
    "MiB",
    "part_size_for",
]

MiB = 1024 * 1024
# S3's multipart limits: at most 10,000 parts of 5 MiB to 5 GiB (the last may be smaller),
# objects up to 5 TiB; a single PutObject carries at most 5 GiB.
MIN_PART_SIZE = 5 * MiB
MAX_PART_SIZE = 5 * 1024 * MiB
MAX_PARTS = 10_000
MAX_OBJECT_SIZE = 5 * 1024 * 1024 * MiB
MAX_PUT_SIZE = MAX_PART_SIZE


def part_size_for(size: int, part_size: int) -> int:
    """Return the multipart part size for an object of ``size`` bytes.

    ``part_size`` grown (in whole MiB) so the object needs at most 10,000 parts.

    Raises:
        ValueError: ``size`` is beyond S3's 5 TiB object limit.
    """
    if size > MAX_OBJECT_SIZE:
        raise ValueError(f"an S3 object holds at most {MAX_OBJECT_SIZE} bytes, got {size}")
    needed = -(-size // MAX_PARTS)
    if needed <= part_size:
        return part_size
    return min(-(-needed // MiB) * MiB, MAX_PART_SIZE)


class KnownObject:
    """A transfer subscriber handing over the size and ETag we already know (no extra HEAD)."""

    def __init__(self, size: int, etag: str) -> None:
        self.size = size
        self.etag = etag

    def on_queued(self, future: Any, **kwargs: Any) -> None:
        future.meta.provide_transfer_size(self.size)
        future.meta.provide_object_etag(self.etag)


class ChunksReader(io.RawIOBase):
    """A seekable file over views read one after the other (a part made of pieces): reads
    copy only the slice asked for, never the whole."""

    def __init__(self, views: Sequence[memoryview]) -> None:
        super().__init__()
        self._views = [v for v in views if len(v)]
        self._starts = list(itertools.accumulate((len(v) for v in self._views), initial=0))
        self._size = self._starts[-1]
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}.get(whence)
        if base is None or base + offset < 0:
            raise ValueError(f"invalid seek: offset={offset} whence={whence}")
        self._pos = base + offset
        return self._pos

    def _pieces(self, start: int, end: int) -> Iterator[memoryview]:
        i = bisect.bisect_right(self._starts, start) - 1
        while start < end:
            view = self._views[i]
            offset = start - self._starts[i]
            n = min(len(view) - offset, end - start)
            yield view[offset : offset + n]
            start += n
            i += 1

    def read(self, size: int | None = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        data = b"".join(self._pieces(self._pos, end)) if end > self._pos else b""
        self._pos = max(self._pos, end)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        end = min(self._size, self._pos + len(out))
        written = 0
        for piece in self._pieces(self._pos, end) if end > self._pos else ():
            out[written : written + len(piece)] = piece
            written += len(piece)
        self._pos += written
        return written


class ByteReader(ChunksReader):
    """A seekable file over a byte view: reads copy only the slice asked for."""

    def __init__(self, view: memoryview) -> None:
        super().__init__([view])

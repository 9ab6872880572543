"""Tar as webdataset uses it: members written and parsed, grouped into samples by key.

A sample is the run of consecutive members whose names share a key: the name up to the
first ``.`` of its last path component (``images/0001.jpg`` and ``images/0001.cls`` are the
fields ``jpg`` and ``cls`` of the sample ``images/0001``), as ``webdataset`` reads them.
Writing uses POSIX ustar headers (``tarfile``'s own), so ``tar``, ``tarfile`` and
``webdataset`` read the shards; parsing also follows pax (``x``/``g``) and GNU long-name
(``L``) headers, as tars other tools wrote may hold.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BLOCK",
    "END",
    "Member",
    "TarError",
    "encode_member",
    "parse_members",
    "sample_fields",
    "split_key",
]

BLOCK = 512
#: the end-of-archive marker: two zero blocks
END = bytes(2 * BLOCK)
_KEY = re.compile(r"^((?:.*/|)[^./][^.]*)\.([^/]*)$")
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)


class TarError(ValueError):
    """The bytes are not the tar members expected (the callers say which object)."""


@dataclass(frozen=True)
class Member:
    """One regular file of a tar: where its header starts, its data, where it ends."""

    name: str
    header: int  # offset of its first header block (a pax or long-name header included)
    data: int  # offset of its data
    size: int  # bytes of data

    @property
    def end(self) -> int:
        """One past its last (padded) data block."""
        return self.data + _padded(self.size)


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def split_key(name: str) -> tuple[str, str] | None:
    """``(key, field)`` of a member name, or None for a name without one (skipped)."""
    match = _KEY.match(name)
    return (match.group(1), match.group(2)) if match else None


def encode_member(name: str, data: bytes | memoryview) -> bytes:
    """One tar member: a ustar header, ``data``, padding to a block.

    Raises:
        ValueError: ``name`` does not fit a ustar header (over 255 bytes, or a last component
            over 100).
    """
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0
    header = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")
    pad = _padded(len(data)) - len(data)
    return b"".join((header, data, bytes(pad)))


def parse_members(
    read: Callable[[int, int], bytes], start: int, stop: int | None
) -> Iterator[Member]:
    """The regular-file members of a tar from ``start`` on, reading headers only.

    Args:
        read: ``read(offset, length)``: bytes of the tar (fewer at its end).
        start: where a member header starts.
        stop: stop before this offset (None: at the end-of-archive marker or the end).

    Raises:
        TarError: a header does not parse, or a member's data runs past the bytes there are.
    """
    offset = header_start = start
    long_name: str | None = None
    while stop is None or offset < stop:
        block = read(offset, BLOCK)
        if not block:
            return  # the end of the bytes (a tar without its end marker)
        if len(block) < BLOCK:
            raise TarError(f"a truncated header at byte {offset}")
        if block == bytes(BLOCK):
            return  # the end-of-archive marker
        fast = _fast_header(block)
        if fast is None:
            try:
                info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError as exc:
                raise TarError(f"no tar header at byte {offset}: {exc}") from None
            fast = (info.name, info.size, info.type)
        name, size, kind = fast
        data = offset + BLOCK
        header = offset if long_name is None else header_start
        if kind in (tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME):
            raw = read(data, size)
            if len(raw) < size:
                raise TarError(f"the tar ends inside the extended header at byte {offset}")
            if long_name is None:
                header_start = offset
            long_name = _long_name(kind, raw) or long_name or ""
        elif kind in _REGULAR:
            yield Member(long_name or name, header, data, size)
            long_name = None
        else:  # a directory, a link, a global pax header: no sample's field
            long_name = None
        offset = data + _padded(size)


def _fast_header(block: bytes) -> tuple[str, int, bytes] | None:
    """(name, size, type) of a plain ustar or GNU header with a valid checksum and an octal
    size, read directly (``tarfile``'s parse costs ~10x more a member); None for anything
    else, which ``tarfile`` then parses (or refuses)."""
    if block[257:262] != b"ustar" or block[124] & 0x80:
        return None
    try:
        size = int(block[124:136].strip(b"\0 ") or b"0", 8)
        stored = int(block[148:156].strip(b"\0 ") or b"0", 8)
    except ValueError:
        return None
    if stored != sum(block[:148]) + 256 + sum(block[156:]):  # (the field counts as spaces)
        return None
    name = block[:100].split(b"\0", 1)[0]
    if block[257:263] == b"ustar\0":  # POSIX: a prefix (GNU keeps other fields there)
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape"), size, block[156:157]


def _long_name(kind: bytes, raw: bytes) -> str | None:
    if kind == tarfile.GNUTYPE_LONGNAME:
        return raw.rstrip(b"\0").decode("utf-8", "surrogateescape")
    for record in raw.split(b"\n"):  # pax records: "<len> key=value"
        _, _, kv = record.partition(b" ")
        key, eq, value = kv.partition(b"=")
        if eq and key == b"path":
            return value.decode("utf-8", "surrogateescape")
    return None


def sample_fields(fragment: bytes | memoryview, base: int = 0) -> dict[str, Any]:
    """The fields of the one sample whose members ``fragment`` holds whole (a sample's span
    of its shard, from ``base``): ``{"__key__": key (str), field: bytes, ...}``.

    Raises:
        TarError: the fragment is not whole members of one key.
    """
    view = memoryview(fragment)

    def read(offset: int, length: int) -> bytes:
        return bytes(view[offset - base : offset - base + length])

    sample: dict[str, Any] = {}
    key: str | None = None
    for member in parse_members(read, base, base + len(view)):
        split = split_key(member.name)
        if split is None:
            continue
        if key is not None and split[0] != key:
            raise TarError(f"members of two samples ({key!r}, {split[0]!r}) in one span")
        key = split[0]
        body = view[member.data - base : member.data - base + member.size]
        if len(body) < member.size:
            raise TarError(f"the span ends inside member {member.name!r}")
        sample[split[1]] = bytes(body)
    if key is None:
        raise TarError("the span holds no sample")
    return {"__key__": key, **sample}

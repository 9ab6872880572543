"""Storage paths and buffers (``storage/base.py``) and the checkpoint layout in storage
(``checkpoint/manifest.py``, ``checkpoint/checksum.py``), on the in-memory storage."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from strata_redis.checkpoint.checksum import crc32_chunks, crc32_combine, format_checksum
from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.checkpoint.manifest import (
    CheckpointInfo,
    FileEntry,
    decode_metadata,
    encode_metadata,
    id_of,
    part_path,
    scan,
)
from strata_redis.storage import as_byte_view, check_path

from .fakes import JOB, MemoryStorage


@pytest.mark.parametrize(
    ("path", "match"),
    [("", "empty"), ("/a", "absolute"), ("a\\b", "backslashes"), ("a\x00b", "control"),
     ("a//b", "empty, '.' and '..'"), ("a/../b", "empty, '.' and '..'"),
     ("a/.strata-tmp-x", "reserved"), ("x" * 256, "longer than 255"),
     ("a/" * 600, "more than 1024"), ("\ud800", "surrogate")],
)  # fmt: skip
def test_bad_paths(path: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_path(path)


def test_good_paths() -> None:
    assert check_path("job/checkpoints/step_1/rank_0/model.bin") == (
        "job/checkpoints/step_1/rank_0/model.bin"
    )
    assert check_path("ü ñ/x") == "ü ñ/x"


def test_byte_views() -> None:
    assert (
        bytes(as_byte_view(np.arange(3, dtype=np.int16))) == np.arange(3, dtype=np.int16).tobytes()
    )
    assert as_byte_view(bytearray(b"ab")).readonly
    with pytest.raises(ValueError, match="C-contiguous"):
        as_byte_view(np.arange(10)[::2])
    with pytest.raises(TypeError, match="got str"):
        as_byte_view("x")
    with pytest.raises(TypeError, match="plain data"):
        as_byte_view(np.array([None]))
    assert bytes(as_byte_view(np.array([1], dtype=">i4"))) == b"\x00\x00\x00\x01"


def test_the_default_write_chunks_joins_them() -> None:
    s = MemoryStorage()
    s.write_chunks("a", [memoryview(b"ab"), memoryview(b"cd")])
    assert s.read("a") == b"abcd" and s.remove_abandoned("x/") == 0


@given(st.binary(max_size=200), st.binary(max_size=200))
def test_crc32_combine(a: bytes, b: bytes) -> None:
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
    assert crc32_chunks([memoryview(a), memoryview(b)]) == zlib.crc32(a + b)


def test_checksum_format() -> None:
    assert format_checksum(0xAB) == "crc32:000000ab"


def info(cid: CheckpointId) -> CheckpointInfo:
    files = {"rank_0/m": FileEntry("rank_0/m", "m", 0, 3, "crc32:00000001"),
             "rank_1/m": FileEntry("rank_1/m", "m", 1, 4, "crc32:00000002")}  # fmt: skip
    return CheckpointInfo(JOB, cid.step, cid.epoch, 2, {0: "a", 1: "b"}, files, 99, run=cid.run,
                          era="e1", clock=5)  # fmt: skip


def test_metadata_round_trips_and_is_stable() -> None:
    cid = CheckpointId(7, 1, 2)
    raw = encode_metadata(info(cid))
    assert decode_metadata(raw, JOB, cid) == info(cid)
    assert encode_metadata(decode_metadata(raw, JOB, cid)) == raw  # every leader: same bytes
    assert info(cid).nbytes == 7 and info(cid).part_names() == ["m"]
    assert info(cid).entry("m", 1) == info(cid).files["rank_1/m"]


@pytest.mark.parametrize(
    ("raw", "match"),
    [(b"not json", "malformed metadata"), (b"[]", "not a strata-checkpoint/1"),
     (b'{"format": "strata-checkpoint/1"}', "malformed metadata \\(KeyError")],
)  # fmt: skip
def test_bad_metadata(raw: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decode_metadata(raw, JOB, CheckpointId(1))


def test_metadata_of_another_checkpoint_is_refused() -> None:
    raw = encode_metadata(info(CheckpointId(7, 1)))
    with pytest.raises(
        ValueError, match="describes job 'unit-job' checkpoint \\(epoch 1, step 7\\)"
    ):
        decode_metadata(raw, JOB, CheckpointId(8, 1))


def test_layout_paths_and_scan() -> None:
    assert part_path("m", 0, 1) == "m" and part_path("m", 3, 4) == "rank_3/m"
    assert id_of("epoch_1_step_2/rank_0/m") == (CheckpointId(2, 1), "rank_0/m")
    assert id_of("epoch_1_step_2") is None and id_of("junk/x") is None
    s = MemoryStorage()
    for path in ("step_1/m", "step_1/metadata.json", "run_1_step_0/m", "junk/m"):
        s.write(f"{JOB}/checkpoints/{path}", b"x")
    s.write("other/checkpoints/step_9/m", b"x")
    assert scan(s, JOB) == {CheckpointId(1): ["m", "metadata.json"],
                            CheckpointId(0, None, 1): ["m"]}  # fmt: skip

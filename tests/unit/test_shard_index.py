"""A shard's JSON index is checked as arrays: an index of no samples is one, and spans past
the tar are refused however large the numbers (no int64 wrap-around lets one through)."""

from __future__ import annotations

import orjson
import pytest

from strata_redis.errors import ShardFormatError
from strata_redis.shards import index as shard_index
from strata_redis.shards.index import ShardIndex


def _raw(offsets: list[int], sizes: list[int], size: int = 1024) -> bytes:
    keys = [f"{i:09d}" for i in range(len(offsets))]
    return orjson.dumps({
        "version": shard_index._VERSION, "name": "shard-000000.tar", "size": size,
        "checksum": "", "keys": keys, "offsets": offsets, "sizes": sizes,
    })  # fmt: skip


def _parse(raw: bytes) -> ShardIndex:
    return ShardIndex.from_json(raw, dataset="ds", path="ds/shards/x", backend="file:///r")


def test_an_index_of_no_samples_is_an_index() -> None:
    assert _parse(_raw([], [])).count == 0


def test_spans_inside_the_tar_are_accepted() -> None:
    assert _parse(_raw([0, 512], [512, 512])).count == 2


@pytest.mark.parametrize(
    ("offsets", "sizes"),
    [([2**62 + 2**61], [2**62]), ([0], [1025]), ([-1], [10]), ([0], [0])],
    ids=["wraps-int64", "past-the-end", "negative", "empty-sample"],
)
def test_spans_outside_the_tar_are_refused(offsets: list[int], sizes: list[int]) -> None:
    with pytest.raises(ShardFormatError, match="do not fit"):
        _parse(_raw(offsets, sizes))

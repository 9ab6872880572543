"""A shard's JSON index is checked as arrays: an index of no samples is one, and spans past
the tar are refused however large the numbers (no int64 wrap-around lets one through). A
dataset's index pack gives back each shard's index, is refused when it is not the one its
manifest describes, and is not written past its size limit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from strata_redis.errors import ShardFormatError
from strata_redis.shards import index as shard_index
from strata_redis.shards.index import ShardIndex
from strata_redis.storage import LocalStorage


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


def _binary(offsets: list[int], sizes: list[int], fields: Any = None, size: int = 1024) -> Any:
    keys = [f"{i:09d}" for i in range(len(offsets))]
    fields = fields if fields is not None else [[("bin", 0, n)] for n in sizes]
    raw = ShardIndex("shard-000000.tar", size, "", keys, offsets, sizes, fields).to_binary()
    return ShardIndex.from_binary(raw, dataset="ds", path="ds/shards/x", backend="file:///r")


def test_the_binary_form_of_no_samples_and_of_good_spans_is_read() -> None:
    assert _binary([], [], []).count == 0
    index = _binary([0, 512], [512, 512], [[("bin", 0, 512)], [("txt", 12, 500)]])
    assert (index.offsets, index.sizes, index.fields[1]) == ([0, 512], [512, 512],
                                                             [("txt", 12, 500)])  # fmt: skip


@pytest.mark.parametrize(
    ("offsets", "sizes", "fields"),
    [([2**62 + 2**61], [2**62], None), ([0], [1025], None), ([-1], [10], None),
     ([0], [0], None), ([0], [512], [[("bin", 500, 13)]]), ([0], [512], [[("bin", -1, 8)]]),
     ([0], [512], [[("bin", 2**62 + 2**61, 2**62)]])],
    ids=["wraps-int64", "past-the-end", "negative", "empty-sample", "field-past-its-sample",
         "field-negative", "field-wraps-int64"],
)  # fmt: skip
def test_binary_spans_outside_the_tar_or_their_sample_are_refused(
    offsets: list[int], sizes: list[int], fields: Any
) -> None:
    with pytest.raises(ShardFormatError, match="do not fit"):
        _binary(offsets, sizes, fields)


@pytest.mark.parametrize(
    "size", [-(2**62), -1, 2**63, 2**64 - 1], ids=["wraps", "negative", "2^63", "u64-max"]
)
def test_a_tar_size_outside_int64_is_refused_in_either_form(size: int) -> None:
    # a negative size with a huge span wrapped past the span checks (size - length in int64);
    # a size past int64 was an OverflowError, not the index's error
    with pytest.raises(ShardFormatError, match="a tar size of"):
        _parse(_raw([0], [2**63 - 1], size=size))
    with pytest.raises(ShardFormatError, match="a tar size of"):
        _binary([0], [2**63 - 1], size=size)


# -- the index pack ----------------------------------------------------------------------------
def _indexes(n: int) -> list[ShardIndex]:
    out = []
    for k in range(n):
        keys = [f"{k:03d}-{i:03d}" for i in range(k + 1)]  # (indexes of unequal lengths)
        offsets = [1024 * i for i in range(k + 1)]
        fields = [[("bin", 512, 100 + i)] for i in range(k + 1)]
        out.append(ShardIndex(shard_index.shard_name(k), 1024 * (k + 2), f"crc32:{k:08x}",
                              keys, offsets, [1024] * (k + 1), fields))  # fmt: skip
    return out


def _manifest(indexes: list[ShardIndex], pack: bytes) -> shard_index.Manifest:
    entries = [shard_index.ShardEntry(i.name, i.count, i.size, i.checksum) for i in indexes]
    entry = shard_index.PackEntry(len(pack), shard_index.checksum(pack))
    return shard_index.Manifest("ds", entries, binary_index=True, index_pack=entry)


def test_an_index_pack_gives_back_each_shards_binary_index() -> None:
    indexes = _indexes(4)
    pack = shard_index.pack_indexes([i.to_binary() for i in indexes])
    manifest = _manifest(indexes, pack)
    again = shard_index.Manifest.from_json(manifest.to_json(), dataset="ds", backend="b")
    assert again.index_pack == manifest.index_pack
    unpacked = shard_index.IndexPack(pack, again, backend="b")
    assert unpacked.size == len(pack)
    for k, index in enumerate(indexes):
        got = unpacked.index(k)
        assert (got.name, got.size, got.checksum, list(got.keys)) == (
            index.name, index.size, index.checksum, list(index.keys))  # fmt: skip
        assert (got.offsets, got.sizes) == (index.offsets, index.sizes)
        assert [list(f) for f in got.fields or []] == [list(f) for f in index.fields or []]


def test_a_pack_that_is_not_the_manifests_is_refused() -> None:
    indexes = _indexes(3)
    pack = shard_index.pack_indexes([i.to_binary() for i in indexes])
    manifest = _manifest(indexes, pack)
    other = shard_index.pack_indexes([i.to_binary() for i in indexes[:2]])
    flipped = pack[:-1] + bytes([pack[-1] ^ 1])
    for raw, why in ((pack[:-1], "bytes of checksum"), (flipped, "bytes of checksum"),
                     (other, "bytes of checksum")):  # fmt: skip
        with pytest.raises(ShardFormatError, match=why):
            shard_index.IndexPack(raw, manifest, backend="b")
    # the right size and checksum, but of two shards where the manifest lists three
    with pytest.raises(ShardFormatError, match="holds 2 indexes, not 3"):
        shard_index.IndexPack(other, _manifest(indexes, other), backend="b")
    # a pack whose index of a shard is another shard's: refused when that index is read
    swapped = shard_index.pack_indexes([indexes[1].to_binary(), indexes[0].to_binary(),
                                        indexes[2].to_binary()])  # fmt: skip
    unpacked = shard_index.IndexPack(swapped, _manifest(indexes, swapped), backend="b")
    assert unpacked.index(2).name == indexes[2].name
    with pytest.raises(ShardFormatError, match=r"the manifest 'shard-000000\.tar'"):
        unpacked.index(0)


def test_no_pack_is_written_past_its_limit(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    blobs = [i.to_binary() for i in _indexes(3)]
    under = shard_index.PackWriter(limit=sum(map(len, blobs)))
    over = shard_index.PackWriter(limit=sum(map(len, blobs)) - 1)
    for blob in blobs:
        under.add(blob)
        over.add(blob)
    assert over.write(storage, "big") is None
    assert not storage.exists(shard_index.index_pack_path("big"))
    entry = under.write(storage, "small")
    raw = storage.read(shard_index.index_pack_path("small"))
    assert entry == shard_index.PackEntry(len(raw), shard_index.checksum(raw))
    assert raw == shard_index.pack_indexes(blobs)

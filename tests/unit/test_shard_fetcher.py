"""The shard fetcher's and the feed's holds, on a written dataset in a local directory (no
Redis: the feed's lease walk is a list of batches, its stream a stand-in at that seam).

A shard leased twice in one walk has each demand released; a copy held part-way is never
handed out for samples it does not have; a dropped fetch that ends while it is dropped does
not stop the fetcher; a closed fetcher refuses a demand and loses no cached shard; a fetch
that ends after its entry was replaced does not size the new one."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from strata_redis.data.position import Position
from strata_redis.data.sharding import DatasetParams
from strata_redis.shards.feed import ShardFeed
from strata_redis.shards.fetcher import Fetched, ShardFetcher, _Entry
from strata_redis.shards.index import Manifest, read_manifest
from strata_redis.shards.writer import ShardWriter
from strata_redis.storage import LocalStorage

PER = 10


def _dataset(tmp_path: Path) -> tuple[LocalStorage, Manifest]:
    storage = LocalStorage(str(tmp_path / "store"))
    with ShardWriter(storage, "ds", samples_per_shard=PER) as writer:
        for i in range(3 * PER):
            writer.write({"bin": bytes([65 + i]) * 100})
    return storage, read_manifest(storage, "ds")


def _fetcher(tmp_path: Path, storage: LocalStorage, manifest: Manifest, **kw: Any) -> ShardFetcher:
    # (a cache directory: the fetcher copies and holds the shards, not read in place)
    return ShardFetcher(storage, manifest, cache_dir=str(tmp_path / "cache"), processes=0, **kw)


class _Stream:
    """The feed's view of a lease walk: its dataset, position and resume starts."""

    def __init__(self) -> None:
        self.params = DatasetParams("ds", 3 * PER, PER, shuffle=False)
        self.starts: dict[int, int] = {}
        self.position = Position("ds", 0, 3, set())
        self.consumptions = 0

    def consumed(self, batches: int = 1) -> None:
        self.consumptions += batches


def test_a_shard_leased_again_in_one_walk_has_each_demand_released(tmp_path: Path) -> None:
    storage, manifest = _dataset(tmp_path)
    stream = _Stream()
    feed = ShardFeed(stream, storage, members=lambda: ("w",), worker_id="w", prefetch=0,
                     processes=0)  # fmt: skip
    feed.fetcher.close()
    feed.fetcher = _fetcher(tmp_path, storage, manifest, prefetch=0)
    # shard 0's first half, shard 1, then shard 0 again (its lease taken back and leased
    # again) while the first half's item is not consumed yet: two demands of shard 0
    batches = [np.arange(0, 5), np.arange(10, 20), np.arange(5, 10)]
    items = list(feed.items(iter(batches)))
    assert [item.shard for item in items] == ["shard-000000.tar", "shard-000001.tar",
                                              "shard-000000.tar"]  # fmt: skip
    assert feed.fetcher._entries[0].users == 2
    for _ in items:
        feed.consumed()
    assert feed.fetcher._entries == {}  # (held by nobody: shard 0 was held once before)
    assert feed.fetcher.stats()["held_shards"] == 0
    assert sorted(feed.fetcher._cached) == [0, 1]  # both whole: kept in the cache directory
    feed.close()


def test_a_copy_held_part_way_is_never_handed_out_for_more(tmp_path: Path) -> None:
    storage, manifest = _dataset(tmp_path)
    fetcher = _fetcher(tmp_path, storage, manifest, prefetch=0)
    part = fetcher.demand(0, list(range(5, 10))).result()  # a resumed shard: 5 samples
    assert not part.whole
    with pytest.raises(RuntimeError, match="held part-way"):
        fetcher.demand(0)  # the whole shard, while the part is held: not that copy
    again = fetcher.demand(0, [7, 8]).result()  # what the part holds: the same copy
    assert again is part
    fetcher.release(0)
    fetcher.release(0)
    whole = fetcher.demand(0).result()  # released: fetched whole now
    assert whole.whole
    offset, size = whole.index.offsets[0], whole.index.sizes[0]
    with open(whole.path, "rb") as file:
        assert file.read()[offset : offset + size].count(b"A" * 100) == 1
    fetcher.close()


def test_a_fetch_that_ends_while_dropped_does_not_stop_the_fetcher(tmp_path: Path) -> None:
    storage, manifest = _dataset(tmp_path)
    fetcher = _fetcher(tmp_path, storage, manifest, prefetch=2)
    done = fetcher.demand(1).result()
    fetcher.release(1)  # whole, in the cache directory
    fetcher._cached.pop(1)

    class EndsAsCancelled(Future[Fetched]):
        """A fetch thread's result landing between _drop's done() and its callback."""

        def cancel(self) -> bool:
            self.set_running_or_notify_cancel()
            self.set_result(done)
            return False

    entry = _Entry(1, EndsAsCancelled(), None)
    entry.ahead = True
    fetcher._entries[1] = entry
    dropping = threading.Thread(target=fetcher.expect, args=([],), daemon=True)
    dropping.start()  # shard 1 no longer expected: dropped, its callback run at once
    dropping.join(10)
    assert not dropping.is_alive(), "expect() hung on the fetcher's own lock"
    assert list(fetcher._cached) == [1]  # the dropped whole copy joined the cache
    assert fetcher.demand(2).result().whole  # and the fetcher still works
    fetcher.close()


def test_a_closed_fetcher_refuses_a_demand_and_keeps_its_cache(tmp_path: Path) -> None:
    storage, manifest = _dataset(tmp_path)
    first = _fetcher(tmp_path, storage, manifest, prefetch=0)
    first.demand(2).result()
    first.release(2)
    first.close()  # shard 2 stays in the cache directory for the next run
    fetcher = _fetcher(tmp_path, storage, manifest, prefetch=0)
    assert fetcher.stats()["cached_bytes"] == manifest.shards[2].size
    fetcher.close()
    for _ in range(2):  # (the second as the first: no entry left pending behind the first)
        with pytest.raises(RuntimeError, match="is closed"):
            fetcher.demand(2)
    assert fetcher._entries == {}
    assert fetcher.stats()["cached_bytes"] == manifest.shards[2].size


def test_a_fetch_ending_after_its_entry_was_replaced_does_not_size_it(tmp_path: Path) -> None:
    storage, manifest = _dataset(tmp_path)
    fetcher = _fetcher(tmp_path, storage, manifest, prefetch=1)
    whole = fetcher.demand(0).result()
    size = manifest.shards[0].size
    assert fetcher._entries[0].size == size
    late = fetcher._fetch(0, [9])  # a part-way fetch, dropped earlier, ending now
    assert fetcher._entries[0].size == size
    os.unlink(late.path)
    fetcher.release(0)
    assert fetcher.stats()["cached_bytes"] == os.path.getsize(whole.path) == size
    fetcher.close()

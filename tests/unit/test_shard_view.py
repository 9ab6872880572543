"""How a process holds a local shard file's bytes (``feed._mapped``): read whole where it
reads every batch of the shard, mapped in a DataLoader worker (daemonic) or past
``READ_WHOLE``; either way checked unchanged by its stamp."""

from __future__ import annotations

import mmap
import os
import types
from pathlib import Path

import pytest

from strata_redis.shards import feed


@pytest.fixture(autouse=True)
def _fresh_view() -> None:
    feed._MAPPED.clear()


def _file(tmp_path: Path, name: str, size: int) -> str:
    path = tmp_path / name
    path.write_bytes(bytes(range(256)) * (size // 256))
    return str(path)


def test_the_training_process_reads_a_shard_whole(tmp_path: Path) -> None:
    path = _file(tmp_path, "a.tar", 4096)
    view, stamp = feed._mapped(path)
    assert isinstance(view, bytes) and view[256:260] == bytes([0, 1, 2, 3])
    st = os.stat(path)
    assert stamp == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    assert feed._mapped(path)[0] is view  # (the next batch of the shard: no read again)


def test_a_loader_worker_or_a_big_shard_maps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _file(tmp_path, "a.tar", 4096)
    monkeypatch.setattr(feed, "READ_WHOLE", 1024)
    assert isinstance(feed._mapped(path)[0], mmap.mmap)
    monkeypatch.setattr(feed, "READ_WHOLE", 1 << 20)
    daemonic = types.SimpleNamespace(daemon=True)
    monkeypatch.setattr(feed.multiprocessing, "current_process", lambda: daemonic)
    other = _file(tmp_path, "b.tar", 4096)
    view = feed._mapped(other)[0]
    assert isinstance(view, mmap.mmap) and view[:4] == bytes([0, 1, 2, 3])


def test_a_file_replaced_at_its_path_is_read_anew(tmp_path: Path) -> None:
    path = _file(tmp_path, "a.tar", 4096)
    first, stamp = feed._mapped(path)
    replacement = tmp_path / "new"
    replacement.write_bytes(b"x" * 512)
    os.replace(replacement, path)
    view, new_stamp = feed._mapped(path)
    assert new_stamp != stamp and view == b"x" * 512 and first[:1] == b"\0"

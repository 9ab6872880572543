"""``LocalStorage.delete`` beside another deleter: retention passes of several ranks delete
the same checkpoint's files at once (``tests/test_checkpoint.py``'s four processes)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from strata_redis.storage import LocalStorage
from strata_redis.storage import local as local_module


def test_a_delete_whose_directory_another_deleter_removed_meanwhile_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = LocalStorage(tmp_path)
    storage.write("job/checkpoints/step_1/rank_0/model.bin", b"a")
    storage.write("job/checkpoints/step_2/model.bin", b"b")
    unlink = os.unlink

    def unlink_then_the_other_rank_prunes(path: str) -> None:
        unlink(path)  # this rank's file goes; the other rank empties the directory and
        os.rmdir(os.path.dirname(path))  # removes it before this rank makes it durable

    monkeypatch.setattr(local_module.os, "unlink", unlink_then_the_other_rank_prunes)
    # before: StorageError "cannot delete ...: No such file or directory", and the
    # retention pass stopped there, leaving older checkpoints behind
    storage.delete("job/checkpoints/step_1/rank_0/model.bin")
    monkeypatch.undo()
    assert storage.list("job/") == ["job/checkpoints/step_2/model.bin"]
    assert not (tmp_path / "job/checkpoints/step_1").exists()  # its emptied parent too

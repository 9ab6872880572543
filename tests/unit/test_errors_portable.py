"""Errors a DataLoader worker can raise cross processes as themselves: made from a message
alone (torch's ``reraise``: ``type(error)(text)``) and pickled with their ids, the message
not prefixed twice."""

from __future__ import annotations

import pickle

import pytest

from strata_redis.errors import (
    ShardChecksumError,
    ShardFormatError,
    StorageError,
    StorageNotFoundError,
)


@pytest.mark.parametrize("cls", [ShardFormatError, ShardChecksumError])
def test_a_shard_error_pickles_with_its_ids_and_one_prefix(cls: type[ShardFormatError]) -> None:
    error = cls("no tar header at 1024", dataset="ds", path="ds/shards/a.tar", backend="file:///r")
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls
    assert (back.dataset, back.path, back.backend) == ("ds", "ds/shards/a.tar", "file:///r")
    assert str(back) == str(error) == "file:///r: 'ds/shards/a.tar': no tar header at 1024"


def test_a_storage_error_pickles_with_its_ids() -> None:
    error = StorageNotFoundError("no such object", backend="s3://b", path="ds/x")
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is StorageNotFoundError and isinstance(back, StorageError)
    assert (back.backend, back.path, str(back)) == ("s3://b", "ds/x", "no such object")


@pytest.mark.parametrize("cls", [ShardFormatError, StorageNotFoundError])
def test_made_from_its_message_alone_as_torch_reraises_it(cls: type[Exception]) -> None:
    text = "Caught it in DataLoader worker process 0.\nOriginal Traceback: ..."
    error = cls(text)  # (what ExceptionWrapper.reraise does)
    assert str(error) == text

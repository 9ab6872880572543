"""The dataset registry: each job's datasets and their parameters, in one Redis hash."""

from __future__ import annotations

from typing import Any

import orjson

from ..connection import Replies, run_read, take_reply
from ..context import JobContext
from ..errors import DatasetNotFoundError
from ..keys import Keys
from ..validate import check_id
from .sharding import DatasetParams

__all__ = [
    "delete_dataset",
    "get_dataset",
    "list_datasets",
    "queue_datasets",
    "register_dataset",
    "take_datasets",
]


def _encode(params: DatasetParams) -> bytes:
    # Canonical JSON (sorted keys) so "same parameters" is a byte comparison in Lua.
    return orjson.dumps(
        {
            "total_samples": params.total_samples,
            "samples_per_shard": params.samples_per_shard,
            "shuffle": params.shuffle,
            "seed": params.seed,
        },
        option=orjson.OPT_SORT_KEYS,
    )


def register_dataset(ctx: JobContext, params: DatasetParams, *, replace: bool = False) -> None:
    """Register ``params`` under its name; the same parameters again are a no-op.

    Raises:
        DatasetConflictError: registered with other parameters and ``replace`` is false.
    """
    ctx.scripts.run(
        "register_dataset",
        [ctx.keys.datasets],
        [params.name, _encode(params), "1" if replace else "0"],
        {"job_id": ctx.job_id, "dataset": params.name},
    )


def get_dataset(ctx: JobContext, name: str) -> DatasetParams:
    """The parameters of a registered dataset.

    Raises:
        DatasetNotFoundError: no dataset of that name (the message says how to register it).
        StateLostError: it is missing because the job's state in Redis was lost.
    """
    check_id("name", name)
    raw = ctx.client.hget(ctx.keys.datasets, name)
    if raw is None:
        # gone with the job's state (its era, or the datasets anchor: the era and anchor
        # check alone says which), or never registered?
        ctx.scripts.check()
        raise DatasetNotFoundError.missing(ctx.job_id, name)
    return _decode(name, raw)


def _decode(name: str, raw: str | bytes) -> DatasetParams:
    return DatasetParams(name=name, **orjson.loads(raw))


def list_datasets(ctx: JobContext) -> list[DatasetParams]:
    """Every registered dataset, sorted by name."""
    return run_read(ctx.client, lambda pipe: queue_datasets(pipe, ctx.job_id), take_datasets)


def queue_datasets(pipe: Any, job_id: str) -> None:
    """Queue a read of every registered dataset (a batched read; connection.py: queue/take)."""
    pipe.hgetall(Keys(job_id).datasets)


def take_datasets(replies: Replies) -> list[DatasetParams]:
    """The datasets ``queue_datasets`` read, sorted by name."""
    # the field "" is no dataset: it keeps the HASH standing (an anchor: register_dataset.lua)
    return [_decode(n, v) for n, v in sorted(take_reply(replies).items()) if n]


def delete_dataset(ctx: JobContext, name: str) -> bool:
    """Forget a dataset's registration; returns whether it existed."""
    check_id("name", name)
    return bool(ctx.client.hdel(ctx.keys.datasets, name))

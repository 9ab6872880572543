"""Retention: keep a job's newest committed steps, delete older ones and crash leftovers.

Storage is the truth: a step is committed when its metadata.json exists. A pass lists the
job's ``{job_id}/checkpoints/`` prefix once and then

- deletes committed steps beyond the ``keep_count`` newest (never the newest): first from
  the Redis index, then ``metadata.json``, then the other files, so a half-deleted step can
  never look committed;
- deletes leftovers: steps without metadata.json older than the newest committed step
  (they can never commit: acks of steps behind the newest committed one are refused),
  unless Redis says a leader is committing one right now;
- on a ``LocalStorage``, deletes the hidden ``.strata-tmp-*`` files of killed writers in
  those steps (and, in kept steps, once they are older than ``tmp_age``).

Only paths of the form ``{job_id}/checkpoints/step_{N}/...`` are ever touched: another job's
files, or anything else under the prefix, are left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .manifest import METADATA, checkpoints_prefix, step_dir, step_of
from .storage import LocalStorage
from .storage.base import TMP_PREFIX

if TYPE_CHECKING:
    from .job import Job
    from .storage import Storage

__all__ = ["PruneReport", "prune", "scan"]

log = logging.getLogger("strata_redis.checkpoint")


@dataclass
class PruneReport:
    """What one retention pass did.

    Attributes:
        kept: the committed steps kept, newest first.
        deleted: committed steps deleted (beyond ``keep_count``).
        leftovers: uncommitted steps deleted (crash leftovers).
        tmp_files: temporary files of killed local writers deleted.
    """

    kept: list[int] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)
    leftovers: list[int] = field(default_factory=list)
    tmp_files: int = 0


def scan(storage: Storage, job_id: str) -> dict[int, list[str]]:
    """Every step directory of ``job_id`` in storage: step -> its files (paths inside it)."""
    prefix = checkpoints_prefix(job_id)
    steps: dict[int, list[str]] = {}
    for path in storage.list(prefix):
        parsed = step_of(path[len(prefix) :])
        if parsed is not None:
            steps.setdefault(parsed[0], []).append(parsed[1])
    return steps


def prune(storage: Storage, job: Job, keep_count: int, *, tmp_age: float = 600.0) -> PruneReport:
    """Run one retention pass over ``job``'s checkpoints (see the module docstring).

    Args:
        storage: the checkpoints' storage.
        job: the job (its id names the prefix; its Redis holds the index).
        keep_count: how many of the newest committed steps to keep (at least 1).
        tmp_age: seconds after which a temporary file in a kept step counts as abandoned.

    Returns:
        What was kept and deleted.

    Raises:
        StorageError: the storage failed (the pass stops; the next one carries on).
    """
    report = PruneReport()
    steps = scan(storage, job.job_id)
    committed = sorted((s for s, files in steps.items() if METADATA in files), reverse=True)
    report.kept = committed[:keep_count]
    newest = committed[0] if committed else None
    k = job.keys
    for step in sorted(committed[keep_count:]):
        with job.client.pipeline(transaction=True) as pipe:
            pipe.zrem(k.checkpoints, str(step))
            pipe.hdel(k.checkpoint_info, str(step))
            pipe.execute()
        _delete_step(storage, job.job_id, step, steps[step])
        report.deleted.append(step)
    if newest is not None:
        candidates = [s for s in steps if s < newest and METADATA not in steps[s]]
        for step in sorted(set(candidates) - _committing(job, candidates)):
            _delete_step(storage, job.job_id, step, steps[step])
            report.leftovers.append(step)
    if isinstance(storage, LocalStorage) and newest is not None:
        report.tmp_files = _delete_tmp_files(storage, job, newest, set(report.kept), tmp_age)
    if report.deleted or report.leftovers or report.tmp_files:
        log.info(
            "checkpoint retention of job %r: kept steps %s, deleted %s, leftovers %s, "
            "%d temporary files", job.job_id, report.kept, report.deleted, report.leftovers,
            report.tmp_files,
        )  # fmt: skip
    return report


def _committing(job: Job, steps: list[int]) -> set[int]:
    """The steps among ``steps`` whose leader may be writing metadata.json right now."""
    if not steps:
        return set()
    with job.client.pipeline(transaction=False) as pipe:
        for step in steps:
            pipe.hget(job.keys.checkpoint_step(step), "state")
        states = pipe.execute()
    return {s for s, state in zip(steps, states, strict=True) if state == "committing"}


def _delete_step(storage: Storage, job_id: str, step: int, files: list[str]) -> None:
    base = step_dir(job_id, step)
    if METADATA in files:
        storage.delete(f"{base}/{METADATA}")  # first: the step stops being valid at once
    for rest in files:
        if rest != METADATA:
            storage.delete(f"{base}/{rest}")


def _delete_tmp_files(
    storage: LocalStorage, job: Job, newest: int, kept: set[int], tmp_age: float
) -> int:
    """Delete killed writers' temporary files; return how many.

    In steps older than the newest committed one that are not kept, every temporary file is
    abandoned (nothing can write there any more); in kept steps, only old ones are.
    """
    root = os.path.join(storage.root, *checkpoints_prefix(job.job_id).rstrip("/").split("/"))
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    dirs = {}
    for name in names:
        parsed = step_of(name + "/x")
        if parsed is not None and (parsed[0] < newest or parsed[0] in kept):
            dirs[parsed[0]] = os.path.join(root, name)
    live = _committing(job, [s for s in dirs if s not in kept])
    cutoff = time.time() - tmp_age
    count = 0
    for step, path in dirs.items():
        if step in live:
            continue
        for dirpath, _dirnames, filenames in os.walk(path, topdown=False):
            for name in filenames:
                full = os.path.join(dirpath, name)
                if not name.startswith(TMP_PREFIX):
                    continue
                with contextlib.suppress(OSError):
                    if step not in kept or os.stat(full).st_mtime < cutoff:
                        os.unlink(full)
                        count += 1
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)  # only succeeds when empty
    return count

"""What one dashboard read found, as typed values: the snapshot every view shapes.

``state.DashboardState.read`` returns a ``Snapshot``; the views shape it and never read
Redis: ``document.py`` into the JSON of ``GET /api/dashboard`` (``schema.json``),
``metrics.py`` into ``/metrics``, ``strata_redis.cli.views`` into ``strata status``'s text.
Figures that need more than one read (samples/s, Redis' request rate) are computed by the
reader, which keeps the history, and arrive here as values, so every view shows the same
number. Pure values: no Redis, no key, no JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.checkpoint.records import CheckpointTotals
from strata_redis.coordination.registry import MembershipEvent
from strata_redis.data.sharding import DatasetParams

#: a chart's points: ``[seconds, value, ...]`` each
Series = tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class HeldShard:
    """A shard lease a worker holds now."""

    dataset: str
    epoch: int
    shard_id: int
    token: int
    expires_in_s: float


@dataclass(frozen=True)
class WorkerRow:
    """One worker of the requested page. ``status`` is ``stale`` for a live worker silent
    past the job's heartbeat timeout (whatever it last set; ``stale`` says the same)."""

    job_id: str
    worker_id: str
    status: str | None
    stale: bool
    last_seen_s: float | None
    host: str | None
    address: str | None
    gpu_count: int
    labels: Mapping[str, str]
    incarnation: int
    shards: tuple[HeldShard, ...]


@dataclass(frozen=True)
class ShardCounts:
    """A dataset's shards in the job's current epoch (``todo`` is every shard before the
    epoch is initialized); ``steals`` is the lease owner's lifetime count."""

    initialized: bool
    total: int
    done: int
    leased: int
    todo: int
    steals: int


@dataclass(frozen=True)
class WorkerShards:
    """Shards one worker completed in the epoch, and shards it holds a lease on now."""

    worker_id: str
    done: int
    leased: int


@dataclass(frozen=True)
class DatasetView:
    """A registered dataset, its epoch's progress, and (for datasets small enough to read
    it) the per-worker distribution of its shards."""

    params: DatasetParams
    epoch: int
    progress: ShardCounts
    distribution: tuple[WorkerShards, ...] | None


@dataclass(frozen=True)
class CheckpointRow:
    """One checkpoint step as the job's table shows it: committed (from its metadata),
    aborted (who and why) or open (``state`` as the step's state hash says, else
    ``unknown``), with its save records' figures."""

    id: CheckpointId
    state: str
    world_size: int | None
    ranks_saved: int
    nbytes: int
    files: int | None
    workers: Mapping[str, str]
    seconds: float | None
    mb_s: float | None
    at_ms: int | None
    culprit: str | None
    reason: str | None


@dataclass(frozen=True)
class WorkerRate:
    """One live worker's samples trained (lifetime) and samples/s."""

    worker_id: str
    samples_trained: int
    samples_per_s: float | None
    slowest: bool


@dataclass(frozen=True)
class DatasetTraining:
    """One dataset's training figures: lifetime samples and steals, the epoch's rest."""

    name: str
    epoch: int
    samples_trained: int
    steals_total: int
    remaining_samples: int | None
    ratio: float


@dataclass(frozen=True)
class CommittedCheckpoint:
    """A committed checkpoint and where its files are (None: metadata unreadable)."""

    id: CheckpointId
    location: str | None


@dataclass(frozen=True)
class Training:
    """The job's training progress (``progress.training`` derives it).

    ``samples_per_s`` is over ``rate_window_s`` seconds, at most ``progress.RATE_WINDOW_S`` +
    ``progress.RATE_STEP_S`` (None: no recent data, or no worker heartbeating); ``eta_s`` is
    0 once the epoch is done, None without a rate; ``slowest_worker`` is None at a tie.
    """

    samples_trained: int
    samples_per_s: float | None
    rate_window_s: float | None
    epoch_remaining_samples: int | None
    eta_s: float | None
    slowest_worker: str | None
    workers: tuple[WorkerRate, ...]
    datasets: tuple[DatasetTraining, ...]
    checkpoints: tuple[CommittedCheckpoint, ...]


@dataclass(frozen=True)
class Recent:
    """Failures and leaves within the window; ``complete`` false: at least these."""

    window_s: float
    failed: int
    left: int
    complete: bool


@dataclass(frozen=True)
class BarrierFigures:
    """Barrier release latency over the newest releases read (ms; None: none recorded)."""

    releases: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    series: Series


@dataclass(frozen=True)
class CheckpointFigures:
    """Checkpoint saves over the newest save records read, and the newest checkpoint
    saved (``last``: None if none)."""

    saves: int
    aborted_saves: int
    aborted_steps: int
    nbytes: int
    seconds: float
    last: CheckpointId | None
    last_bytes: int | None
    last_seconds: float | None
    last_mb_s: float | None
    series: Series


@dataclass(frozen=True)
class JobSnapshot:
    """One job as read: its state, workers, datasets, checkpoints, events and figures.

    ``live_workers`` are those registered and not failed or left; ``silent_workers`` the
    live ones past the job's heartbeat timeout (not yet reaped). ``workers`` are the ones
    on the requested page; ``counts`` covers every worker listed (by status, a silent live
    one as ``stale`` only).
    """

    job_id: str
    state: str
    heartbeat_timeout_s: float
    epoch: int
    generation: int
    live_workers: int
    silent_workers: int
    registered_workers: int
    latest_checkpoint: CheckpointId | None
    training: Training
    workers: tuple[WorkerRow, ...]
    events: tuple[MembershipEvent, ...]
    datasets: tuple[DatasetView, ...]
    checkpoints: tuple[CheckpointRow, ...]
    counts: Mapping[str, int]
    lease_grants_total: int
    worker_failures_total: int
    recent: Recent
    checkpoint_totals: CheckpointTotals
    last_commit_ms: int | None
    barrier: BarrierFigures
    checkpoint: CheckpointFigures
    membership_series: Series

    @property
    def all_silent(self) -> bool:
        """Every live worker is past the timeout: nothing trains that anyone can see."""
        return self.live_workers > 0 and self.silent_workers >= self.live_workers


@dataclass(frozen=True)
class RedisRate:
    """Commands per second on the whole server, the reader's own excluded (None: not
    known, e.g. no ``INFO`` right, or Redis Cluster)."""

    commands_per_s: float | None
    ops_per_s: int | None
    series: Series


@dataclass(frozen=True)
class Listing:
    """The all-jobs view: jobs known, shown in detail, and whether the sweep completed."""

    known: int
    shown: int
    complete: bool


@dataclass(frozen=True)
class Page:
    """The requested page of workers, and how many there are."""

    offset: int
    limit: int
    total: int


@dataclass(frozen=True)
class ReadCost:
    """What the read cost: commands, round trips, milliseconds."""

    commands: int
    round_trips: int
    ms: float


@dataclass(frozen=True)
class Snapshot:
    """One read of one job (``job``) or of every job (``job`` None; ``listing`` set)."""

    redis: str
    time_ms: int
    job: str | None
    jobs: tuple[JobSnapshot, ...]
    listing: Listing | None
    page: Page
    redis_rate: RedisRate
    read: ReadCost

    def find(self, job_id: str) -> JobSnapshot:
        """The job ``job_id`` of this snapshot (``KeyError`` if it is not in it)."""
        for job in self.jobs:
            if job.job_id == job_id:
                return job
        raise KeyError(job_id)

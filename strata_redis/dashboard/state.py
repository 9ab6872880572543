"""Every Redis read of the dashboard: one job's (or every job's) state as one typed snapshot.

This module is the only place where the dashboard touches Redis, and it only reads. What it
reads is bounded by what the page shows, never by a job's history:

- workers: the live ones (the heartbeat ZSET) and those that failed or left within
  ``gone_window`` seconds (found in the newest ``EVENTS_READ`` membership events), with
  registration details only for the requested page of them;
- membership events, barrier releases and save records: the newest ``EVENTS_READ``,
  ``LATENCIES_READ`` and ``RECORDS_READ`` entries of their capped streams, read
  incrementally: stream entries never change, so each document asks only for the entries
  newer than the newest it kept (``StreamTail``);
- checkpoints: the newest ``CHECKPOINTS_READ`` committed steps of the index, and the steps
  of the save records read; a committed step's summary never changes, so it is decoded once
  and kept (``_committed_cache``);
- datasets: every registered dataset's progress in the job's current epoch (three O(1)
  counts, exact in every document), the leases held now (the lease hash: about one per
  live worker), and the per-worker distribution of completed shards (the completion hash),
  read at most every ``DISTRIBUTION_EVERY_S`` seconds and only for datasets of at most
  ``DISTRIBUTION_MAX_SHARDS`` shards, so no read holds Redis for more than a few
  milliseconds;
- training progress: each dataset's lifetime lease counts (``record.LeaseTotals``: samples
  trained, by live worker, and steals; one ``HMGET`` bounded by the live workers); the
  samples/s of the job and of each worker are the deltas of those counts between documents
  (``progress.py``: the reader keeps a few points per job), so the first document has none;
- the list of jobs (the all-jobs view only): the registry's ``SCAN`` for jobs
  (``registry.scan_jobs``), advanced by at most ``SCAN_CALLS`` steps per document and
  repeated every ``JOBS_REFRESH_S`` seconds (``JobDirectory``); with a job given there is
  no ``SCAN``.

A document costs two pipelined round trips (plus the bounded ``SCAN`` steps of the job list)
and about 25 commands per job; what they return grows with the workers listed and the
shards of the datasets (at most ``DISTRIBUTION_MAX_SHARDS``), not with the job's history.

Every read goes through the owner of what it reads: this module passes its pipelines to the
owners' queue/take pairs (``queue_x(pipe, ...)`` before a round trip, ``take_x(replies, ...)``
after it: ``strata_redis.connection`` describes the convention) and gets their typed values
back (``WorkerInfo``, ``MembershipEvent``, ``LeaseHolder``, ``EpochProgress``,
``CheckpointInfo``, ``StepState``, ``SaveRecord``, ``BarrierLatency``, ``DatasetParams``).
It knows no key and no stored value format: a change of either is made in its owner alone.
What is derived from the values read lives beside it: rates, ETA and the slowest worker in
``progress.py``, percentiles and chart series in ``series.py``; what is kept between reads
in ``caches.py``. It returns a ``snapshot.Snapshot`` (frozen dataclasses) and shapes no
view: ``document.py`` makes the JSON of it, ``metrics.py`` ``/metrics``,
``strata_redis.cli.views`` ``strata status``'s text.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import Counter, deque
from typing import Any, Final

import redis

from strata_redis import era
from strata_redis.checkpoint import commit, index, records
from strata_redis.checkpoint.commit import StepState
from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.checkpoint.manifest import CheckpointInfo
from strata_redis.checkpoint.records import SaveRecord
from strata_redis.connection import Replies, describe, is_cluster, take_reply
from strata_redis.coordination import epochs, latency, lifecycle, registry
from strata_redis.coordination.latency import BarrierLatency
from strata_redis.coordination.lifecycle import JobRecord
from strata_redis.coordination.registry import (
    SETTABLE_STATUSES,
    STATUSES,
    MembershipEvent,
    WorkerInfo,
)
from strata_redis.dashboard import progress, series
from strata_redis.dashboard.caches import MAX_JOBS, Committed, JobDirectory, ReadCaches, StreamTail
from strata_redis.dashboard.snapshot import (
    CheckpointRow,
    CommittedCheckpoint,
    DatasetView,
    HeldShard,
    JobSnapshot,
    Listing,
    Page,
    ReadCost,
    Recent,
    RedisRate,
    ShardCounts,
    Snapshot,
    Training,
    WorkerRow,
    WorkerShards,
)
from strata_redis.data import datasets, record
from strata_redis.data.record import EpochProgress, LeaseHolder, LeaseTotals
from strata_redis.data.sharding import DatasetParams
from strata_redis.errors import JobNotFoundError
from strata_redis.validate import check_id

LIVE_STATUSES: Final = SETTABLE_STATUSES
#: newest membership events read per job (the timeline, and who failed or left lately)
EVENTS_READ: Final = 500
#: newest barrier releases read per job (latency percentiles and their series)
LATENCIES_READ: Final = 500
#: newest save records read per job (checkpoint MB/s, aborted saves)
RECORDS_READ: Final = 200
#: newest committed steps read per job
CHECKPOINTS_READ: Final = 10
#: datasets with more shards than this show progress counts but no per-worker distribution
DISTRIBUTION_MAX_SHARDS: Final = 20_000
#: the largest page of workers
MAX_LIMIT: Final = 5000


def check_job_id(job_id: str) -> str:
    """``job_id`` if it can be a job's id, else ``JobNotFoundError`` saying why not."""
    try:
        return check_id("job_id", job_id, job=True)
    except (TypeError, ValueError) as exc:
        raise JobNotFoundError(f"no job {job_id!r}: not a valid job id ({exc})", job_id) from None


class DashboardState:
    """Reads dashboard snapshots from one Redis. Thread-safe; keeps small caches.

    Args:
        client: a decoding redis-py client (``strata_redis.connection.make_client``).
        heartbeat_timeout: seconds without a heartbeat after which a live worker is shown
            as ``stale`` (not yet declared failed by any reaper), for a job that has no
            timeout stored with it (``coordination/lifecycle.py``: jobs store their own,
            and it is the one used).
        gone_window: seconds during which a worker that failed or left is still listed
            (and exported to Prometheus); older ones drop out.
    """

    def __init__(
        self, client: redis.Redis, *, heartbeat_timeout: float = 10.0, gone_window: float = 600.0
    ) -> None:
        if not heartbeat_timeout > 0 or not math.isfinite(heartbeat_timeout):
            raise ValueError(f"heartbeat_timeout must be > 0 seconds, got {heartbeat_timeout!r}")
        if not gone_window > 0 or not math.isfinite(gone_window):
            raise ValueError(f"gone_window must be > 0 seconds, got {gone_window!r}")
        self.client = client
        self.heartbeat_timeout = float(heartbeat_timeout)
        self.gone_window = float(gone_window)
        self.directory = JobDirectory()
        self._lock = threading.Lock()
        self.caches = ReadCaches()
        # (redis ms, total commands processed, commands this reader sent so far)
        self._samples: deque[tuple[int, int, int]] = deque(maxlen=series.SERIES_POINTS * 10)
        self._sent = 0
        self._info_allowed = True

    @property
    def redis_description(self) -> str:
        """Where the client connects, without credentials."""
        return describe(self.client)

    # -- the document ------------------------------------------------------------------------
    def read(self, job: str | None = None, *, offset: int = 0, limit: int = 1000) -> Snapshot:
        """A snapshot of ``job``, or of every job (``document.document`` shapes it into the
        JSON of ``GET /api/dashboard``, ``schema.json``).

        Args:
            job: a job id; None for every job in this Redis (at most ``MAX_JOBS`` in detail).
            offset, limit: the page of workers (ordered by job id, then worker id).

        Raises:
            JobNotFoundError: ``job`` is malformed or has no state in this Redis.
            ValueError: a bad ``offset`` or ``limit``.
            redis.RedisError: Redis failed.
        """
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"limit must be an int in [1, {MAX_LIMIT}], got {limit!r}")
        started = time.perf_counter()
        commands = scan_calls = 0
        listing: Listing | None = None
        if job is None:
            scan_calls = self.directory.advance(self.client)
            commands += scan_calls
            known = self.directory.jobs
            ids = known[:MAX_JOBS]
            listing = Listing(len(known), len(ids), self.directory.complete)
        else:
            check_job_id(job)
            ids = [job]
        jobs = [_JobRead(j, self) for j in ids]

        # Round 1: the clock, the server's counters, and each job's bounded heads.
        # (redis-py refuses TIME and INFO in a cluster pipeline: with Redis Cluster the clock
        # is read apart, from the node of the first job shown, and there is no request rate)
        cluster = is_cluster(self.client)
        round1 = self.client.pipeline(transaction=False)
        if not cluster:
            round1.time()
        with self._lock:
            info = self._info_allowed and not cluster
        if info:
            round1.info("stats")
        for j in jobs:
            j.queue_heads(round1)
        replies = round1.execute(raise_on_error=False)
        commands += len(replies) + cluster
        rest = iter(replies)
        if cluster:
            sec, usec = registry.job_clock(self.client, jobs[0].job_id if jobs else None)
        else:
            sec, usec = take_reply(rest)
        now_ms = int(sec) * 1000 + int(usec) // 1000
        stats: dict[str, Any] | None = None
        if info:
            stats = self._stats(next(rest))
        for j in jobs:
            j.take_heads(rest, self.client)
            j.settle(now_ms, self.heartbeat_timeout)
        if job is not None and not jobs[0].exists:
            raise JobNotFoundError(
                f"no job {job!r} in this Redis ({self.redis_description}): it has no "
                "workers, datasets or checkpoints", job,
            )  # fmt: skip

        # Round 2: statuses of the shown workers, a page of their details, each dataset's
        # progress and distribution, and the checkpoint steps not decoded before.
        gone_since = now_ms - int(self.gone_window * 1000)
        candidates = [(j.job_id, w) for j in jobs for w in j.candidates(gone_since)]
        page = set(candidates[offset : offset + limit])
        round2 = self.client.pipeline(transaction=False)
        for j in jobs:
            j.queue_details(round2, {w for jid, w in page if jid == j.job_id}, self)
        replies = round2.execute()
        commands += len(replies)
        rest = iter(replies)
        for j in jobs:
            j.take_details(rest, now_ms, self)

        return Snapshot(
            redis=self.redis_description,
            time_ms=now_ms,
            job=job,
            jobs=tuple(j.snapshot(now_ms) for j in jobs),
            listing=listing,
            page=Page(offset, limit, len(candidates)),
            redis_rate=self._redis_metrics(now_ms, stats, commands),
            read=ReadCost(
                commands=commands,
                round_trips=2 + scan_calls,
                ms=round((time.perf_counter() - started) * 1000, 3),
            ),
        )

    # -- the server's request rate -------------------------------------------------------
    def _stats(self, reply: Any) -> dict[str, Any] | None:
        if isinstance(reply, redis.exceptions.NoPermissionError):
            with self._lock:
                self._info_allowed = False  # an ACL user without INFO: no request rate
            return None
        if isinstance(reply, Exception):
            raise reply
        return dict(reply)

    def _redis_metrics(self, now_ms: int, stats: dict[str, Any] | None, commands: int) -> RedisRate:
        """Commands per second on the whole server, not counting this reader's own."""
        if stats is None:
            return RedisRate(None, None, ())
        total = int(stats.get("total_commands_processed", 0))
        with self._lock:
            self._sent += commands
            # Keep a sample at most every second: the rate over at least one second.
            if not self._samples or now_ms - self._samples[-1][0] >= 1000:
                self._samples.append((now_ms, total, self._sent))
            samples = list(self._samples)
        points: list[tuple[float, ...]] = []
        for (t0, c0, s0), (t1, c1, s1) in itertools.pairwise(samples):
            rate = max(0.0, ((c1 - c0) - (s1 - s0)) / ((t1 - t0) / 1000))
            points.append((t1 / 1000, round(rate, 1)))
        return RedisRate(
            commands_per_s=points[-1][1] if points else None,
            ops_per_s=int(stats.get("instantaneous_ops_per_sec", 0)),
            series=series.thin(points),
        )


class _JobRead:
    """One job's part of a read: what to queue on each round, what came back, and the
    job's snapshot made of it."""

    def __init__(self, job_id: str, state: DashboardState) -> None:
        self.job_id = job_id
        caches = state.caches
        self._event_tail: StreamTail[MembershipEvent] = caches.tail(job_id, "events", EVENTS_READ)
        self._latency_tail: StreamTail[BarrierLatency] = caches.tail(
            job_id, "barrier_latency", LATENCIES_READ
        )
        self._record_tail: StreamTail[SaveRecord] = caches.tail(job_id, "records", RECORDS_READ)
        self.window_s = state.gone_window
        self.beats: dict[str, float] = {}
        self.registered = 0
        self.generation = 0
        self.epoch = 0
        self.fence = 0
        self.failures = 0
        self.totals = records.CheckpointTotals()
        self.dataset_params: list[DatasetParams] = []
        self.events: list[tuple[str, MembershipEvent]] = []
        self.committed_steps: list[CheckpointId] = []
        self.records: list[tuple[str, SaveRecord]] = []
        self.exists = False
        self.record: JobRecord | None = None
        self.era = False
        self.timeout_s = 10.0
        self.state = "idle"
        self.status: dict[str, str | None] = {}
        self.info: dict[str, WorkerInfo] = {}
        self.progress: dict[str, ShardCounts] = {}
        self.lease_totals: dict[str, LeaseTotals] = {}
        self.training: Training | None = None
        self.holders: dict[str, dict[int, LeaseHolder]] = {}
        self.distribution: dict[str, tuple[WorkerShards, ...] | None] = {}
        self.committed: dict[CheckpointId, Committed | None] = {}
        self.step_state: dict[CheckpointId, StepState] = {}
        self._candidates: list[str] = []
        self._page: list[str] = []
        self._details: list[tuple[DatasetParams, bool, tuple[str, str, int], Any]] = []
        self._uncached: list[CheckpointId] = []
        self._open_steps: list[CheckpointId] = []

    # -- round 1 ---------------------------------------------------------------------------
    def queue_heads(self, pipe: Any) -> None:
        job = self.job_id
        # live workers with their last heartbeat: the first page here, the others (one
        # bounded command each) when it is taken
        registry.queue_heartbeats(pipe, job)
        registry.queue_registered(pipe, job)
        registry.queue_generation(pipe, job)
        epochs.queue_epoch(pipe, job)
        datasets.queue_datasets(pipe, job)
        registry.queue_events(pipe, job, EVENTS_READ, self._event_tail.after)
        latency.queue_latencies(pipe, job, LATENCIES_READ, self._latency_tail.after)
        index.queue_newest_steps(pipe, job, CHECKPOINTS_READ)
        records.queue_save_records(pipe, job, RECORDS_READ, self._record_tail.after)
        record.queue_lease_grants(pipe, job)
        registry.queue_failures(pipe, job)
        records.queue_totals(pipe, job)
        lifecycle.queue_record(pipe, job)
        era.queue_era_state(pipe, job)

    def take_heads(self, replies: Replies, client: Any) -> None:
        self.beats = registry.take_heartbeats(replies, client, self.job_id)
        self.registered = registry.take_registered(replies)
        self.generation = registry.take_generation(replies)
        self.epoch = epochs.take_epoch(replies)
        self.dataset_params = datasets.take_datasets(replies)
        events = registry.take_events(replies)
        self.events = self._event_tail.take(events)
        latencies = latency.take_latencies(replies)
        self._latency_tail.take(latencies)
        self.committed_steps = index.take_newest_steps(replies)
        saves = records.take_save_records(replies)
        self.records = self._record_tail.take(saves)
        self.fence = record.take_lease_grants(replies)
        self.failures = registry.take_failures(replies)
        self.totals = records.take_totals(replies)
        self.record = lifecycle.take_record(replies)
        self.era = era.take_era_state(replies)
        self.exists = bool(
            self.registered or self.generation or self.dataset_params or self.committed_steps
            or saves.length or events.length or self.epoch or self.fence
            or self.record is not None
        )  # fmt: skip

    def settle(self, now_ms: int, default_timeout: float) -> None:
        """The job's heartbeat timeout (stored with the job, else ``default_timeout``) and
        its lifecycle state, from round 1's reads."""
        rec = self.record
        self.timeout_s = (
            rec.heartbeat_timeout_s if rec is not None and rec.heartbeat_timeout_s
            else default_timeout
        )  # fmt: skip
        cutoff = now_ms - self.timeout_s * 1000
        fresh = sum(1 for seen in self.beats.values() if seen >= cutoff)
        last = self.events[0][1].type if self.events else None
        self.state = lifecycle.job_state(
            rec, era=self.era, live=len(self.beats), fresh=fresh, registered=self.registered,
            last_event=last,
        )  # fmt: skip

    def candidates(self, gone_since_ms: int) -> list[str]:
        """The workers to list: live ones, and those whose failure or leave is recent."""
        ids = set(self.beats)
        for entry_id, event in self.events:
            if event.type in ("fail", "leave") and series.entry_ms(entry_id) >= gone_since_ms:
                ids.add(event.worker_id)
        ids.discard("")
        self._candidates = sorted(ids)
        return self._candidates

    # -- round 2 ---------------------------------------------------------------------------
    def queue_details(self, pipe: Any, page: set[str], state: DashboardState) -> None:
        job = self.job_id
        self._page = sorted(page)
        self._details = []
        registry.queue_statuses(pipe, job, self._candidates)
        # the events again, after the statuses: a worker failed or left between the rounds
        # (its status and its event written by one script) shows with its event, never ahead
        registry.queue_events(pipe, job, EVENTS_READ, self._event_tail.after)
        registry.queue_worker_infos(pipe, job, self._page)
        live = sorted(self.beats)
        for params in self.dataset_params:
            record.queue_progress(pipe, job, params.name, self.epoch)
            record.queue_lease_totals(pipe, job, params.name, live)
            small = params.num_shards <= DISTRIBUTION_MAX_SHARDS
            key = (job, params.name, self.epoch)
            kept = state.caches.completed(key) if small else None
            if small:  # both reads return at most num_shards values
                record.queue_holders(pipe, job, params.name, self.epoch)
                if kept is None:
                    record.queue_completed_by(pipe, job, params.name, self.epoch)
            self._details.append((params, small, key, kept))
        record_steps = {r.checkpoint for _, r in self.records}
        self._uncached = []
        for step in self.committed_steps:
            hit, summary = state.caches.cached_committed(job, step)
            if hit:
                self.committed[step] = summary
            else:
                self._uncached.append(step)
        index.queue_infos(pipe, job, self._uncached)
        # The steps shown: the newest CHECKPOINTS_READ of the committed ones read and those
        # of the save records read. Those not committed: their state hash tells aborted (who
        # and why) or still open.
        shown = sorted(record_steps | set(self.committed_steps), reverse=True)[:CHECKPOINTS_READ]
        self._open_steps = [s for s in shown if s not in self.committed_steps]
        for step in self._open_steps:
            commit.queue_step_state(pipe, job, step)

    def take_details(self, replies: Replies, now_ms: int, state: DashboardState) -> None:
        self.status = registry.take_statuses(replies, self._candidates)
        self.events = self._event_tail.take(registry.take_events(replies))
        self.info = registry.take_worker_infos(replies, self._page, self.status, self.beats, now_ms)
        live = sorted(self.beats)
        for params, small, key, kept in self._details:
            counts = record.take_progress(replies, params.num_shards)
            self.progress[params.name] = _shard_counts(counts)
            self.lease_totals[params.name] = record.take_lease_totals(replies, live)
            if small:
                holders = record.take_holders(replies)
                if kept is None:
                    kept = record.take_completed_by(replies)
                    state.caches.keep_completed(key, kept)
                self.holders[params.name] = holders
                self.distribution[params.name] = _distribution(holders, kept)
            else:
                self.holders[params.name] = {}
                self.distribution[params.name] = None
        for step, info in index.take_infos(replies, self.job_id, self._uncached).items():
            summary = _committed_summary(info)
            self.committed[step] = summary
            if summary is not None:
                state.caches.cache_committed(self.job_id, step, summary)
        for step in self._open_steps:
            self.step_state[step] = commit.take_step_state(replies)
        # the job's training progress (``schema.json``'s ``jobs[].progress``)
        self.training = progress.training(
            now_ms, state.caches.trained(self.job_id), epoch=self.epoch, live=live,
            beats=self.beats,
            timeout_s=self.timeout_s, page=set(self._page), datasets=self.dataset_params,
            progress=self.progress, totals=self.lease_totals,
            checkpoints=[
                CommittedCheckpoint(step, getattr(self.committed.get(step), "location", None))
                for step in self.committed_steps
            ],
        )  # fmt: skip

    # -- the snapshot ---------------------------------------------------------------------
    def snapshot(self, now_ms: int) -> JobSnapshot:
        """What this job's reads found, as the snapshot's typed values (after both rounds)."""
        if self.training is None:
            raise RuntimeError(f"job {self.job_id!r}: a snapshot before its second round")
        held = self._held(now_ms)
        seen_cutoff = now_ms - self.timeout_s * 1000
        silent = sum(1 for seen in self.beats.values() if seen < seen_cutoff)
        last_commit = self.committed.get(self.committed_steps[0]) if self.committed_steps else None
        return JobSnapshot(
            job_id=self.job_id,
            state=self.state,
            heartbeat_timeout_s=self.timeout_s,
            epoch=self.epoch,
            generation=self.generation,
            live_workers=len(self.beats),
            silent_workers=silent,
            registered_workers=self.registered,
            latest_checkpoint=self.committed_steps[0] if self.committed_steps else None,
            training=self.training,
            workers=tuple(self._worker_row(w, held) for w in self._page),
            events=self._event_tail.derived("events", _events),
            datasets=tuple(
                DatasetView(p, self.epoch, self.progress[p.name], self.distribution[p.name])
                for p in self.dataset_params
            ),
            checkpoints=self._checkpoints(),
            counts=self._counts(now_ms),
            lease_grants_total=self.fence,
            worker_failures_total=self.failures,
            recent=self._recent(now_ms),
            checkpoint_totals=self.totals,
            last_commit_ms=None if last_commit is None else last_commit.acked_ms,
            barrier=self._latency_tail.derived("barrier", series.barrier_metrics),
            checkpoint=series.checkpoint_metrics(self.records, self.step_state),
            membership_series=self._event_tail.derived("series", series.membership_series),
        )

    def _held(self, now_ms: int) -> dict[str, list[HeldShard]]:
        """Worker -> the shard leases it holds now, by dataset and shard."""
        held: dict[str, list[HeldShard]] = {}
        for name, holders in self.holders.items():
            for h in holders.values():
                held.setdefault(h.worker_id, []).append(
                    HeldShard(name, self.epoch, h.shard_id, h.token, (h.expires_ms - now_ms) / 1000)
                )
        for shards in held.values():
            if len(shards) > 1:
                shards.sort(key=lambda s: (s.dataset, s.shard_id))
        return held

    def _worker_row(self, w: str, held: dict[str, list[HeldShard]]) -> WorkerRow:
        """A worker of the requested page: a live worker silent past the job's heartbeat
        timeout shows status ``stale`` (whatever it last set), even if no reaper declared
        it failed."""
        info = self.info[w]
        seen = info.last_seen_s
        stale = seen is not None and seen > self.timeout_s and info.status in LIVE_STATUSES
        return WorkerRow(
            job_id=self.job_id, worker_id=w, status="stale" if stale else info.status,
            stale=stale, last_seen_s=seen, host=info.host, address=info.address,
            gpu_count=info.gpu_count, labels=info.labels, incarnation=info.incarnation,
            shards=tuple(held.get(w, ())),
        )  # fmt: skip

    def _counts(self, now_ms: int) -> dict[str, int]:
        """Workers by status; a live one silent past the job's timeout counts as ``stale``
        only (not under the status it last set)."""
        counts = dict.fromkeys((*STATUSES, "stale"), 0)
        timeout_ms = self.timeout_s * 1000
        for w in self._candidates:
            status = self.status.get(w)
            seen = self.beats.get(w)
            if seen is not None and now_ms - seen > timeout_ms and status in LIVE_STATUSES:
                counts["stale"] += 1
            elif status in counts:
                counts[status] += 1
        return counts

    def _checkpoints(self) -> tuple[CheckpointRow, ...]:
        """The newest ``CHECKPOINTS_READ`` steps, committed or not, newest first."""
        saves: dict[CheckpointId, list[SaveRecord]] = {}
        for _, r in self.records:
            saves.setdefault(r.checkpoint, []).append(r)
        steps = sorted({*self.committed_steps, *self._open_steps}, reverse=True)[:CHECKPOINTS_READ]
        rows = []
        for step in steps:
            uploaded = [r for r in saves.get(step, []) if r.outcome == "uploaded"]
            rate = series.throughput(uploaded)
            summary = self.committed.get(step) if step in self.committed_steps else None
            if summary is not None:
                # committed: every rank acked (its metadata says who), whether or not their
                # save records are still here (a state loss keeps storage's, not Redis')
                rows.append(CheckpointRow(
                    id=step, state="committed", world_size=summary.world_size,
                    ranks_saved=max(rate["ranks"], len(summary.workers)), nbytes=summary.nbytes,
                    files=summary.files, workers=summary.workers, seconds=rate["seconds"],
                    mb_s=rate["mb_s"], at_ms=summary.acked_ms, culprit=None, reason=None,
                ))  # fmt: skip
                continue
            st = self.step_state.get(step) or StepState()
            rows.append(CheckpointRow(
                id=step, state=st.state or "unknown", world_size=st.world_size,
                ranks_saved=rate["ranks"], nbytes=rate["bytes"], files=None,
                workers={str(r.rank): r.worker_id for r in uploaded}, seconds=rate["seconds"],
                mb_s=rate["mb_s"], at_ms=max((r.at_ms for r in saves.get(step, [])), default=None),
                culprit=st.culprit, reason=st.reason,
            ))  # fmt: skip
        return tuple(rows)

    def _recent(self, now_ms: int) -> Recent:
        """Failures and leaves in the window (the dashboard's ``gone_window``), counted from
        the membership events whose time lies in it: a worker declared failed that has
        rejoined since still counts. ``complete`` is false when the events read (the newest
        ``EVENTS_READ``) may not reach back to the window's start: the counts are then at
        least these."""
        since = now_ms - int(self.window_s * 1000)
        kinds = Counter(e.type for _, e in self.events if e.ms >= since)
        full = len(self.events) >= EVENTS_READ
        return Recent(
            window_s=self.window_s, failed=kinds["fail"], left=kinds["leave"],
            complete=not (full and self.events[-1][1].ms >= since),
        )  # fmt: skip


def _events(entries: list[tuple[str, MembershipEvent]]) -> tuple[MembershipEvent, ...]:
    """The kept membership events, oldest first."""
    return tuple(e for _, e in reversed(entries))


def _shard_counts(p: EpochProgress) -> ShardCounts:
    return ShardCounts(
        initialized=p.initialized, total=p.total, done=p.done, leased=p.leased,
        todo=p.todo if p.initialized else p.total, steals=p.steals,
    )  # fmt: skip


def _distribution(
    holders: dict[int, LeaseHolder], completed: Counter[str]
) -> tuple[WorkerShards, ...]:
    """Per worker: shards it completed in the epoch, and shards it holds a lease on now."""
    leased = Counter(h.worker_id for h in holders.values())
    return tuple(
        WorkerShards(w, completed.get(w, 0), leased.get(w, 0))
        for w in sorted(completed.keys() | leased.keys())
    )


def _committed_summary(info: CheckpointInfo | None) -> Committed | None:
    if info is None:
        return None
    return Committed(
        world_size=info.world_size, nbytes=info.nbytes, files=len(info.files),
        workers={str(r): w for r, w in info.workers.items()}, acked_ms=info.acked_ms,
        location=info.location or None,
    )  # fmt: skip

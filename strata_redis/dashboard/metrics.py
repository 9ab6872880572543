"""``/metrics``: the dashboard's snapshot in Prometheus' text format (``prometheus_client``).

Names follow Prometheus' conventions: a ``strata_`` prefix, base units (``_seconds``,
``_bytes``), ``_total`` on counters only, and labels for the job (``job_id``: never ``job``
or ``instance``, Prometheus' own target labels), status, dataset. Counters are exported only
where Redis keeps a count that never goes back for the life of the job (the membership
generation, the fencing-token counter, the registry's failure count, the checkpoint
totals, the lease owner's lifetime counts of steals and samples trained); what comes from
capped records (barrier releases) is a gauge over the newest records read, said so in its
help text.

``strata_redis_up`` is 1 when the snapshot was read, 0 when Redis failed or stalled: then
the exposition holds that gauge alone, with HTTP 200, so Prometheus tells a Redis outage
from a dashboard that is down.

Label sets stay bounded: jobs are the ones the snapshot holds (at most
``caches.MAX_JOBS``), and workers are the live ones plus those that failed or left within
the dashboard's ``gone_window`` (default 10 minutes); older ones drop out of the
exposition, so a long job with churn does not grow the scrape without end.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from strata_redis.checkpoint.records import MB_S_DEFINITION
from strata_redis.coordination.lifecycle import JOB_STATES
from strata_redis.coordination.registry import STATUSES

from .snapshot import Snapshot
from .state import LATENCIES_READ


class _SnapshotCollector(Collector):
    """Metric families built from one dashboard snapshot."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def collect(self) -> Iterator[Metric]:
        jobs = self.snap.jobs

        yield GaugeMetricFamily(
            "strata_redis_up",
            "1: the dashboard read Redis for this scrape; 0: Redis failed",
            value=1,
        )
        workers = GaugeMetricFamily(
            "strata_workers",
            "Workers by status: live ones, and those that failed or left within the "
            "dashboard's gone window; 'stale' counts live workers past the job's heartbeat "
            "timeout (not also under the status they last set)",
            labels=["job_id", "status"],
        )
        for j in jobs:
            for key in (*STATUSES, "stale"):
                workers.add_metric([j.job_id, key], j.counts[key])
        yield workers

        status = GaugeMetricFamily(
            "strata_worker_status",
            "1 for each listed worker, labelled with its status",
            labels=["job_id", "worker", "status"],
        )
        age = GaugeMetricFamily(
            "strata_worker_heartbeat_age_seconds",
            "Seconds since a live worker's last heartbeat, on Redis' clock",
            labels=["job_id", "worker"],
        )
        gpus = GaugeMetricFamily(
            "strata_worker_gpus",
            "GPUs a listed worker registered with",
            labels=["job_id", "worker"],
        )
        for w in (w for j in jobs for w in j.workers):
            status.add_metric([w.job_id, w.worker_id, str(w.status)], 1)
            gpus.add_metric([w.job_id, w.worker_id], w.gpu_count)
            if w.last_seen_s is not None:
                age.add_metric([w.job_id, w.worker_id], w.last_seen_s)
        yield status
        yield age
        yield gpus

        changes = CounterMetricFamily(
            "strata_membership_changes",
            "Membership changes (joins, leaves, failures): the job's membership generation",
            labels=["job_id"],
        )
        epoch = GaugeMetricFamily("strata_epoch", "The job's epoch", labels=["job_id"])
        state = GaugeMetricFamily(
            "strata_job_state",
            "1 for the job's lifecycle state (running, stale, ended, lost, idle), else 0",
            labels=["job_id", "state"],
        )
        timeout = GaugeMetricFamily(
            "strata_job_heartbeat_timeout_seconds",
            "The job's heartbeat timeout (stored with the job): live workers silent for "
            "longer are stale",
            labels=["job_id"],
        )
        for j in jobs:
            changes.add_metric([j.job_id], j.generation)
            epoch.add_metric([j.job_id], j.epoch)
            for name in JOB_STATES:
                state.add_metric([j.job_id, name], 1 if j.state == name else 0)
            timeout.add_metric([j.job_id], j.heartbeat_timeout_s)
        yield changes
        yield epoch
        yield state
        yield timeout

        grants = CounterMetricFamily(
            "strata_lease_grants", "Shard leases granted (the fencing-token counter)",
            labels=["job_id"],
        )  # fmt: skip
        for j in jobs:
            grants.add_metric([j.job_id], j.lease_grants_total)
        yield grants

        failures = CounterMetricFamily(
            "strata_worker_failures",
            "Workers declared failed over the job's life (the registry's failure count: a "
            "failed worker that rejoins stays counted)",
            labels=["job_id"],
        )
        for j in jobs:
            failures.add_metric([j.job_id], j.worker_failures_total)
        yield failures

        shards = GaugeMetricFamily(
            "strata_shards",
            "Shards of a dataset in the job's current epoch: done (completions), leased, todo",
            labels=["job_id", "dataset", "state"],
        )
        for j in jobs:
            for d in j.datasets:
                for key in ("done", "leased", "todo"):
                    shards.add_metric([j.job_id, d.params.name, key], getattr(d.progress, key))
        yield shards

        ratio = GaugeMetricFamily(
            "strata_epoch_progress_ratio",
            "Fraction (0..1) of a dataset's shards done in the job's current epoch",
            labels=["job_id", "dataset"],
        )
        for j in jobs:
            for d in j.datasets:
                total = d.progress.total or d.params.num_shards
                ratio.add_metric([j.job_id, d.params.name], d.progress.done / total if total else 0)
        yield ratio

        steals = CounterMetricFamily(
            "strata_lease_steals",
            "Shard leases stolen over the job's life (grants from the shared pool once the "
            "worker's own shards were gone; the lease owner's lifetime count, never reset)",
            labels=["job_id", "dataset"],
        )
        samples = CounterMetricFamily(
            "strata_samples_trained",
            "Samples trained over the job's life, every dataset (the lease owner's count: a "
            "completed lease counts its shard's samples from the lease's start, a hand-back "
            "with an offset the part taken)",
            labels=["job_id"],
        )
        for j in jobs:
            samples.add_metric([j.job_id], j.training.samples_trained)
            for t in j.training.datasets:
                steals.add_metric([j.job_id, t.name], t.steals_total)
        yield steals
        yield samples

        latency = GaugeMetricFamily(
            "strata_barrier_release_latency_seconds",
            f"Barrier release latency percentiles (nearest rank; 100: the slowest) over the "
            f"newest {LATENCIES_READ} releases (a gauge: 'quantile' is a summary's label)",
            labels=["job_id", "percentile"],
        )
        releases = GaugeMetricFamily(
            "strata_barrier_releases_recorded",
            f"Barrier releases in the record read (at most {LATENCIES_READ})",
            labels=["job_id"],
        )
        for j in jobs:
            b = j.barrier
            releases.add_metric([j.job_id], b.releases)
            for q, ms in (("50", b.p50_ms), ("99", b.p99_ms), ("100", b.max_ms)):
                if ms is not None:
                    latency.add_metric([j.job_id, q], ms / 1000)
        yield latency
        yield releases

        life = "over the job's life (the checkpoint totals: never reset)"
        totals = {
            "saves": CounterMetricFamily(
                "strata_checkpoint_saves",
                f"Ranks' checkpoint saves acked (uploaded), {life}",
                labels=["job_id"],
            ),
            "saved_bytes": CounterMetricFamily(
                "strata_checkpoint_saved_bytes",
                f"Bytes uploaded by acked saves, {life}",
                labels=["job_id"],
            ),
            "save_seconds": CounterMetricFamily(
                "strata_checkpoint_save_seconds",
                f"Seconds taken by acked saves, summed over ranks, {life}",
                labels=["job_id"],
            ),
            "aborted_saves": CounterMetricFamily(
                "strata_checkpoint_aborted_saves",
                f"Failed saves that aborted a step, {life}",
                labels=["job_id"],
            ),
            "aborted_steps": CounterMetricFamily(
                "strata_checkpoint_aborted_steps",
                f"Checkpoints that became aborted, {life}",
                labels=["job_id"],
            ),
        }
        last_commit = GaugeMetricFamily(
            "strata_checkpoint_last_commit_timestamp_seconds",
            "When the newest committed checkpoint's last rank acked, Unix seconds on Redis' "
            "clock (absent: none committed)",
            labels=["job_id"],
        )
        last_bytes = GaugeMetricFamily(
            "strata_checkpoint_last_save_bytes",
            "Bytes of the newest checkpoint saved, all its ranks' uploads (the page's MB/s is "
            f"this over strata_checkpoint_last_save_seconds: {MB_S_DEFINITION})",
            labels=["job_id"],
        )
        last_seconds = GaugeMetricFamily(
            "strata_checkpoint_last_save_seconds",
            "Seconds of the newest checkpoint saved: its slowest rank's, from snapshot to the "
            "end of its upload",
            labels=["job_id"],
        )
        for j in jobs:
            for key, family in totals.items():
                family.add_metric([j.job_id], getattr(j.checkpoint_totals, key))
            if j.last_commit_ms is not None:
                last_commit.add_metric([j.job_id], j.last_commit_ms / 1000)
            c = j.checkpoint
            if c.last_bytes is not None and c.last_seconds is not None:
                last_bytes.add_metric([j.job_id], c.last_bytes)
                last_seconds.add_metric([j.job_id], c.last_seconds)
        yield from totals.values()
        yield from (last_commit, last_bytes, last_seconds)

        # The newest committed checkpoint is the loop's (epoch, step), in (run, epoch, step)
        # order: a relaunched job's run 1 step 0 is newer than run 0's step 200.
        latest_run = GaugeMetricFamily(
            "strata_checkpoint_latest_run",
            "The run (0: the job's first launch, +1 per relaunch that resumed) of the newest "
            "committed checkpoint",
            labels=["job_id"],
        )
        latest = GaugeMetricFamily(
            "strata_checkpoint_latest_step",
            "The loop's step of the newest committed checkpoint", labels=["job_id"],
        )  # fmt: skip
        latest_epoch = GaugeMetricFamily(
            "strata_checkpoint_latest_epoch",
            "The loop's epoch of the newest committed checkpoint (absent: saved without one)",
            labels=["job_id"],
        )  # fmt: skip
        for j in jobs:
            newest = j.latest_checkpoint
            if newest is not None:
                latest_run.add_metric([j.job_id], newest.run)
                latest.add_metric([j.job_id], newest.step)
                if newest.epoch is not None:
                    latest_epoch.add_metric([j.job_id], newest.epoch)
        yield latest_run
        yield latest
        yield latest_epoch

        rate = self.snap.redis_rate.commands_per_s
        if rate is not None:
            yield GaugeMetricFamily(
                "strata_redis_commands_per_second",
                "Commands per second on the whole Redis server (the dashboard's own excluded)",
                value=rate,
            )


class _DownCollector(Collector):
    """The exposition when Redis could not be read: ``strata_redis_up`` 0 alone."""

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "strata_redis_up",
            "1: the dashboard read Redis for this scrape; 0: Redis failed",
            value=0,
        )


def render_metrics(snap: Snapshot | None) -> tuple[bytes, str]:
    """``(body, content type)`` of the Prometheus text exposition of ``snap``; with ``snap``
    None (Redis could not be read), ``strata_redis_up 0`` and nothing else."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snap) if snap is not None else _DownCollector())
    return generate_latest(registry), CONTENT_TYPE_LATEST

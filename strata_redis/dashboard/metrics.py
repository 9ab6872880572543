"""``/metrics``: the dashboard document in Prometheus' text format (``prometheus_client``).

Names follow Prometheus' conventions: a ``strata_`` prefix, base units (``_seconds``,
``_bytes``), ``_total`` on counters only, and labels for job, status, dataset. Counters are
exported only where Redis keeps a count that never goes back (the membership generation,
the fencing-token counter); what comes from capped records (barrier releases, saves) is a
gauge over the newest records read, said so in its help text.

Label sets stay bounded: jobs are the ones the document shows (at most
``state.MAX_JOBS``), and workers are the live ones plus those that failed or left within
the dashboard's ``gone_window`` (default 10 minutes); older ones drop out of the
exposition, so a long job with churn does not grow the scrape without end.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from strata_redis.coordination.lifecycle import JOB_STATES
from strata_redis.coordination.registry import STATUSES

from .state import LATENCIES_READ, RECORDS_READ


class _DocumentCollector(Collector):
    """Metric families built from one dashboard document."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc

    def collect(self) -> Iterator[Metric]:
        doc = self.doc
        jobs = doc["jobs"]
        per_job = {m["job_id"]: m for m in doc["metrics"]["jobs"]}

        workers = GaugeMetricFamily(
            "strata_workers",
            "Workers by status: live ones, and those that failed or left within the "
            "dashboard's gone window; 'stale' counts live workers past the job's heartbeat "
            "timeout (not also under the status they last set)",
            labels=["job", "status"],
        )
        for job_id, m in per_job.items():
            for key in (*STATUSES, "stale"):
                workers.add_metric([job_id, key], m["workers"][key])
        yield workers

        status = GaugeMetricFamily(
            "strata_worker_status",
            "1 for each listed worker, labelled with its status",
            labels=["job", "worker", "status"],
        )
        age = GaugeMetricFamily(
            "strata_worker_heartbeat_age_seconds",
            "Seconds since a live worker's last heartbeat, on Redis' clock",
            labels=["job", "worker"],
        )
        gpus = GaugeMetricFamily(
            "strata_worker_gpus", "GPUs a listed worker registered with", labels=["job", "worker"]
        )
        for w in doc["workers"]:
            status.add_metric([w["job_id"], w["worker_id"], w["status"]], 1)
            gpus.add_metric([w["job_id"], w["worker_id"]], w["gpu_count"])
            if w["last_seen_s"] is not None:
                age.add_metric([w["job_id"], w["worker_id"]], w["last_seen_s"])
        yield status
        yield age
        yield gpus

        changes = CounterMetricFamily(
            "strata_membership_changes",
            "Membership changes (joins, leaves, failures): the job's membership generation",
            labels=["job"],
        )
        epoch = GaugeMetricFamily("strata_epoch", "The job's epoch", labels=["job"])
        state = GaugeMetricFamily(
            "strata_job_state",
            "1 for the job's lifecycle state (running, stale, ended, lost, idle), else 0",
            labels=["job", "state"],
        )
        timeout = GaugeMetricFamily(
            "strata_job_heartbeat_timeout_seconds",
            "The job's heartbeat timeout (stored with the job): live workers silent for "
            "longer are stale",
            labels=["job"],
        )
        for j in jobs:
            changes.add_metric([j["job_id"]], j["membership_generation"])
            epoch.add_metric([j["job_id"]], j["epoch"])
            for name in JOB_STATES:
                state.add_metric([j["job_id"], name], 1 if j["state"] == name else 0)
            timeout.add_metric([j["job_id"]], j["heartbeat_timeout_s"])
        yield changes
        yield epoch
        yield state
        yield timeout

        grants = CounterMetricFamily(
            "strata_lease_grants", "Shard leases granted (the fencing-token counter)",
            labels=["job"],
        )  # fmt: skip
        for job_id, m in per_job.items():
            grants.add_metric([job_id], m["lease_grants_total"])
        yield grants

        shards = GaugeMetricFamily(
            "strata_shards",
            "Shards of a dataset in the job's current epoch: done (completions), leased, todo",
            labels=["job", "dataset", "state"],
        )
        for d in doc["datasets"]:
            for key in ("done", "leased", "todo"):
                shards.add_metric([d["job_id"], d["name"], key], d["progress"][key])
        yield shards

        steals = CounterMetricFamily(
            "strata_lease_steals",
            "Shard leases stolen in the job's current epoch (grants from the shared pool once "
            "the worker's own shards were gone); resets at a new epoch",
            labels=["job", "dataset"],
        )
        for d in doc["datasets"]:
            steals.add_metric([d["job_id"], d["name"]], d["progress"]["steals"])
        yield steals

        latency = GaugeMetricFamily(
            "strata_barrier_release_latency_seconds",
            f"Barrier release latency quantiles over the newest {LATENCIES_READ} releases",
            labels=["job", "quantile"],
        )
        releases = GaugeMetricFamily(
            "strata_barrier_releases_recorded",
            f"Barrier releases in the record read (at most {LATENCIES_READ})",
            labels=["job"],
        )
        for job_id, m in per_job.items():
            b = m["barrier"]
            releases.add_metric([job_id], b["releases"])
            for q, key in (("0.5", "p50_ms"), ("0.99", "p99_ms")):
                if b[key] is not None:
                    latency.add_metric([job_id, q], b[key] / 1000)
        yield latency
        yield releases

        window = f"over the newest {RECORDS_READ} save records"
        saves = GaugeMetricFamily(
            "strata_checkpoint_saves", f"Checkpoint saves by outcome, {window}",
            labels=["job", "outcome"],
        )  # fmt: skip
        saved = GaugeMetricFamily(
            "strata_checkpoint_saved_bytes", f"Bytes uploaded by checkpoint saves, {window}",
            labels=["job"],
        )  # fmt: skip
        seconds = GaugeMetricFamily(
            "strata_checkpoint_save_seconds", f"Seconds spent by checkpoint saves, {window}",
            labels=["job"],
        )  # fmt: skip
        aborted = GaugeMetricFamily(
            "strata_checkpoint_aborted_steps", f"Checkpoint steps aborted, {window}",
            labels=["job"],
        )  # fmt: skip
        last_bytes = GaugeMetricFamily(
            "strata_checkpoint_last_save_bytes", "Bytes of the newest successful save",
            labels=["job"],
        )  # fmt: skip
        last_seconds = GaugeMetricFamily(
            "strata_checkpoint_last_save_seconds", "Seconds of the newest successful save",
            labels=["job"],
        )  # fmt: skip
        for job_id, m in per_job.items():
            c = m["checkpoint"]
            saves.add_metric([job_id, "uploaded"], c["saves"])
            saves.add_metric([job_id, "aborted"], c["aborted_saves"])
            saved.add_metric([job_id], c["bytes"])
            seconds.add_metric([job_id], c["seconds"])
            aborted.add_metric([job_id], c["aborted_steps"])
            if c["last_bytes"] is not None:
                last_bytes.add_metric([job_id], c["last_bytes"])
                last_seconds.add_metric([job_id], c["last_seconds"])
        yield from (saves, saved, seconds, aborted, last_bytes, last_seconds)

        # The newest committed checkpoint is the loop's (epoch, step), in (run, epoch, step)
        # order: a relaunched job's run 1 step 0 is newer than run 0's step 200.
        latest = GaugeMetricFamily(
            "strata_checkpoint_latest_step",
            "The loop's step of the newest committed checkpoint", labels=["job"],
        )  # fmt: skip
        latest_epoch = GaugeMetricFamily(
            "strata_checkpoint_latest_epoch",
            "The loop's epoch of the newest committed checkpoint (absent: saved without one)",
            labels=["job"],
        )  # fmt: skip
        for j in jobs:
            newest = j["latest_checkpoint"]
            if newest is not None:
                latest.add_metric([j["job_id"]], newest["step"])
                if newest["epoch"] is not None:
                    latest_epoch.add_metric([j["job_id"]], newest["epoch"])
        yield latest
        yield latest_epoch

        rate = doc["metrics"]["redis"]["commands_per_s"]
        if rate is not None:
            yield GaugeMetricFamily(
                "strata_redis_commands_per_second",
                "Commands per second on the whole Redis server (the dashboard's own excluded)",
                value=rate,
            )


def render_metrics(doc: dict[str, Any]) -> tuple[bytes, str]:
    """``(body, content type)`` of the Prometheus text exposition of ``doc``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_DocumentCollector(doc))
    return generate_latest(registry), CONTENT_TYPE_LATEST

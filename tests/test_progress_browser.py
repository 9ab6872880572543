"""The training-progress panel in a real headless Chromium, served by ``strata dashboard``, over
two real worker processes: samples/s, the epoch's ETA, the slowest worker marked, and where the
committed checkpoint lives."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import strata_redis
from strata_redis.storage import LocalStorage

from .browser import chromium, served_dashboard
from .procs import join_all, spawn, wait_for

JOB = "progress-browser-job"
TIMEOUT = 2.0


def _trainer(url: str, worker_id: str, pause: float, checkpoints: str) -> None:
    """A worker process: saves a checkpoint, then drains epoch 0 slowly; then idles."""
    job = strata_redis.connect(url, JOB, heartbeat_timeout=TIMEOUT)
    job.register_worker(worker_id, heartbeat_interval=0.2)
    job.barrier("go", expected=2).wait(worker_id, timeout=60)
    if checkpoints:
        with strata_redis.CheckpointManager(checkpoints, redis=job, worker_id=worker_id) as ckpt:
            ckpt.save(b"x" * 10_000, step=5, epoch=0).result()
    for lease in job.leases("images", 0, worker_id, ttl=5):
        time.sleep(pause)  # "train" on it
        lease.complete()
    time.sleep(300)


@pytest.fixture
def training(redis_url: str, tmp_path: Path) -> Iterator[str]:
    """Two workers training (a fast and a slow one); yields the checkpoint's location."""
    job = strata_redis.connect(redis_url, JOB, heartbeat_timeout=TIMEOUT)
    strata_redis.ShardManager(job).register_dataset_params("images", 20_000, 10, True, 42)
    where = str(tmp_path / "ckpt")
    procs = [spawn(_trainer, redis_url, "w-fast", 0.05, where),
             spawn(_trainer, redis_url, "w-slow", 0.25, "")]  # fmt: skip
    try:
        wait_for(lambda: job.client.zcard(job.keys.checkpoints) == 1, 60, why=job.workers)
        yield f"{LocalStorage(where).describe()}/{JOB}/checkpoints/epoch_0_step_5"
    finally:
        for proc in procs:
            proc.kill()
        join_all(procs, 10)
        job.close()


@pytest.fixture
def dashboard(redis_url: str) -> Iterator[str]:
    """``strata dashboard`` on a free loopback port; yields its URL."""
    with served_dashboard(redis_url, JOB, TIMEOUT) as (_, url):
        yield url


def _panel(driver: Any) -> dict[str, Any]:
    """What the progress panel shows, read in one script (it is redrawn on every reply)."""
    return dict(
        driver.execute_script("""
        const p = document.getElementById("progress");
        const card = (n) => {
          const c = p.querySelector(`[data-progress='${n}'] .value`);
          return c ? c.textContent : null;
        };
        return {
          rate: card("rate"), eta: card("eta"), slowest: card("slowest"),
          workers: [...p.querySelectorAll(".progress-workers tbody tr")].map((tr) =>
            [tr.dataset.worker, tr.classList.contains("slowest"), tr.textContent]),
          locations: [...p.querySelectorAll(".progress-checkpoints td.location")]
            .map((td) => td.textContent),
        };
        """)
    )


@pytest.mark.timeout(180)
def test_the_progress_panel_in_a_real_browser(
    training: str, dashboard: str, tmp_path: Path
) -> None:
    location = training
    driver = chromium(tmp_path / "profile")
    try:
        driver.get(f"{dashboard}job/{JOB}")

        def shown() -> bool:
            panel = _panel(driver)
            rate = (panel["rate"] or "").split(" ")[0]
            return (
                re.fullmatch(r"\d+(\.\d)?", rate) is not None and float(rate) > 0
                and re.search(r"\d+ (s|min)", panel["eta"] or "") is not None
                and panel["slowest"] == "w-slow"
                and [w[:2] for w in panel["workers"]] == [["w-fast", False], ["w-slow", True]]
                and panel["locations"] == [location]
            )  # fmt: skip

        wait_for(shown, 60, step=0.25, why=lambda: (_panel(driver), driver.get_log("browser")))
        text = driver.find_element("id", "progress").text
        assert "slowest" in text and "epoch_0_step_5" in text and location in text
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], errors
    finally:
        driver.quit()

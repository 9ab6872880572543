"""The dashboard page in a real headless Chromium, served by ``strata dashboard``, over real
worker processes: it loads clean, a SIGKILLed worker turns failed without a reload and is
counted on the failures tile of its window, charts draw, the checkpoint tile and table give
one MB/s under its definition, and a page whose Redis or server is gone says so.

The README's picture is made from the demo instead: ``scripts/screenshot.sh``.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import strata_redis
from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.server import RedisServer

from .browser import chromium, full_page_screenshot, served_dashboard
from .procs import kill9, spawn, wait_for

JOB = "browser-job"
TIMEOUT = 2.0  # the job's heartbeat timeout
WORKERS = 3


def _trainer(url: str, worker_id: str, rank: int, checkpoints: str) -> None:
    """A worker process: barriers, two checkpoint steps, then slow leases; then idles."""
    job = strata_redis.connect(url, JOB, heartbeat_timeout=TIMEOUT)
    worker = job.register_worker(
        worker_id, host=f"gpu-{rank}", address=f"10.0.0.{rank + 10}:29500", gpu_count=8,
        labels={"rack": "r1"}, heartbeat_interval=0.25,
    )  # fmt: skip
    worker.set_status("training")
    for _ in range(4):
        job.barrier("warmup", expected=WORKERS).wait(worker_id, timeout=60)
    with strata_redis.CheckpointManager(
        checkpoints, redis=job, worker_id=worker_id, rank=rank, world_size=WORKERS
    ) as ckpt:
        for step in (100, 200):
            worker.set_status("checkpointing")
            ckpt.save(bytes([rank]) * 2_000_000, step=step, epoch=0).result()
            worker.set_status("training")
    for lease in job.leases("images", 0, worker_id, ttl=3):
        time.sleep(0.3)  # "train" on it
        lease.complete()
    worker.set_status("idle")
    time.sleep(300)


@pytest.fixture
def redis_own(redis_factory: Callable[..., RedisServer]) -> RedisServer:
    """A redis-server of this test's own: the test stops it."""
    return redis_factory()


@pytest.fixture
def redis_url(redis_own: RedisServer) -> str:
    return redis_own.url


@pytest.fixture
def cluster(redis_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    job = strata_redis.connect(redis_url, JOB, heartbeat_timeout=TIMEOUT)
    strata_redis.ShardManager(job).register_dataset_params("images", 3000, 10, True, 42)
    procs = {
        f"w-{r}": spawn(_trainer, redis_url, f"w-{r}", r, str(tmp_path / "ckpt"))
        for r in range(WORKERS)
    }
    try:
        wait_for(lambda: len(job.live_workers()) == WORKERS, 60, why=job.workers)
        step_200 = CheckpointId(200, 0).member  # (epoch 0, step 200) in the index
        wait_for(lambda: job.client.zscore(job.keys.checkpoints, step_200) is not None, 60,
                 why=lambda: job.events(20))  # fmt: skip
        yield {"job": job, "procs": procs}
    finally:
        for proc in procs.values():
            if proc.is_alive():
                kill9(proc)
        job.close()


@pytest.fixture
def dashboard(redis_url: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``strata dashboard`` (waitress) on a free loopback port; yields it and its URL."""
    with served_dashboard(redis_url, JOB, TIMEOUT) as served:
        yield served


def _chart_report(driver: Any) -> dict[str, Any]:
    """Per chart: points with a value, and how many strongly coloured (series) pixels it drew."""
    return dict(
        driver.execute_script("""
        const out = {};
        for (const [name, c] of Object.entries(window.strataDashboard.charts)) {
          const u = c.plot;
          const points = u.data.slice(1)
            .reduce((n, ys) => n + ys.filter((v) => v !== null && v !== undefined).length, 0);
          const cv = u.ctx.canvas;
          const px = u.ctx.getImageData(0, 0, cv.width, cv.height).data;
          let coloured = 0;
          for (let i = 0; i < px.length; i += 4) {
            const hi = Math.max(px[i], px[i + 1], px[i + 2]);
            const lo = Math.min(px[i], px[i + 1], px[i + 2]);
            if (px[i + 3] > 0 && hi - lo > 60) coloured++;
          }
          out[name] = [points, coloured];
        }
        return out;
        """)
    )


@pytest.mark.timeout(240)
def test_the_page_live_in_a_real_browser(
    cluster: dict[str, Any],
    dashboard: tuple[subprocess.Popen[str], str],
    redis_own: RedisServer,
    tmp_path: Path,
) -> None:
    from selenium.webdriver.common.by import By

    server, url = dashboard
    driver = chromium(tmp_path / "profile")
    try:
        driver.get(f"{url}job/{JOB}")
        rows = "#workers tbody tr"
        wait_for(lambda: driver.execute_script(f"return document.querySelectorAll('{rows}').length")
                 == WORKERS, 30, why=lambda: driver.get_log("browser"))  # fmt: skip

        def status_of(worker: str) -> str:
            # The rows are redrawn on every reply: read them in one script, not by reference.
            return str(driver.execute_script(
                "const c = document.querySelector(`tr[data-worker='${arguments[0]}'] .pill`);"
                "return c ? c.textContent : '';", worker))  # fmt: skip

        # A worker SIGKILLed now shows as failed on the open page, without a reload.
        wait_for(lambda: status_of("w-2") in ("training", "checkpointing", "idle"), 30)
        job: strata_redis.Job = cluster["job"]
        wait_for(lambda: job.leases("images", 0, "w-0").progress().done > 0, 60)
        kill9(cluster["procs"]["w-2"])
        # TIMEOUT (up to twice that after a stall) + the reaper's tick + the page's poll + the
        # server's read cache + drawing: seconds on a loaded machine; a page that needs a
        # reload never shows it
        wait_for(lambda: status_of("w-2") == "failed", 20,
                 why=lambda: (status_of("w-2"), driver.get_log("browser")))  # fmt: skip

        # Every chart draws: points in its data, and series pixels on its canvas.
        expected = {"barrier", "checkpoint", "requests", "membership"}

        def charts_drawn() -> bool:
            report = _chart_report(driver)
            dist = [k for k in report if k.startswith("dist:")]
            return (
                expected <= set(report)
                and len(dist) == 1
                and all(points > 0 and coloured > 20 for points, coloured in report.values())
            )

        wait_for(charts_drawn, 20, step=0.2, why=lambda: _chart_report(driver))
        conn = driver.find_element(By.ID, "conn-text").text
        assert re.fullmatch(r"updated \d+(\.\d)? s ago", conn), conn
        assert driver.find_element(By.ID, "conn").get_attribute("data-state") == "live"

        def body() -> str:
            return str(driver.find_element(By.TAG_NAME, "body").text)

        # (the fail event can reach the timeline a poll after the status: read until it does)
        for needle in ("images · epoch 0", "committed", "fail w-2", "Barrier release latency"):
            wait_for(lambda n=needle: n in body(), 20, why=lambda n=needle: (n, body()[-3000:]))
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], errors

        # The failures tile counts the window's fail events and names the window.
        # (A survivor's heartbeat stalled past TIMEOUT would be a second failure: the killed
        # worker is declared failed by the survivors' reaper steps, with their TIMEOUT, so
        # theirs cannot be longer; the events say whether that is what happened.)
        tile = _tile(driver, "tile-failed")
        assert tile["label"] == "failed, last 10 min" and tile["value"] == "1", (
            tile, job.events(20),
        )  # fmt: skip
        assert "a worker that rejoined since still counts" in tile["title"]

        # One MB/s: the checkpoint tile's figure is its step's row's, under its definition.
        definition = "MB/s = all ranks' bytes ÷ the slowest rank's save seconds"
        mb_s = _mb_s_shown(driver)
        assert mb_s["tile_step"] == "step 200" and mb_s["row"] == mb_s["tile"], mb_s
        assert re.fullmatch(r"\d+\.\d", mb_s["tile"]), mb_s
        assert mb_s["title"] == definition and mb_s["caption"] == definition, mb_s

        shot = full_page_screenshot(driver, tmp_path / "dashboard.png")
        assert shot.stat().st_size > 20_000

        # Redis goes away: the banner names it (no password), since when, and from when the
        # numbers below are; the numbers grey out.
        shown_before = int(driver.execute_script("return window.strataDashboard.doc.time_ms"))
        redis_own.stop()
        wait_for(lambda: driver.find_element(By.ID, "conn").get_attribute("data-state") == "lost",
                 15)  # fmt: skip
        # the document shown now (a poll during stop() may have brought a newer one): no poll
        # succeeds while Redis is stopped, so it is the banner's
        shown_from = int(driver.execute_script("return window.strataDashboard.doc.time_ms"))
        assert shown_from >= shown_before
        banner = driver.find_element(By.ID, "error-text").text
        hhmmss = r"\d{1,2}:\d\d:\d\d"
        assert re.fullmatch(
            rf"Redis at {re.escape(redis_own.url)} unreachable since {hhmmss}; numbers below "
            rf"are from {hhmmss}", banner,
        ), banner  # fmt: skip
        assert banner.endswith(_clock(driver, shown_from)), banner
        assert "Redis unreachable" in driver.find_element(By.ID, "conn-text").text
        assert "stale" in (driver.find_element(By.TAG_NAME, "body").get_attribute("class") or "")

        # The server goes away: the page says so instead of showing stale numbers as live.
        server.terminate()
        server.wait(20)
        wait_for(lambda: "lost the server" in driver.find_element(By.ID, "conn-text").text, 15)
        banner = driver.find_element(By.ID, "error-text").text
        assert re.fullmatch(
            rf"Dashboard server unreachable since {hhmmss}; numbers below are from {hhmmss}, "
            "not live", banner,
        ), banner  # fmt: skip
        assert "stale" in (driver.find_element(By.TAG_NAME, "body").get_attribute("class") or "")
    finally:
        driver.quit()


def _tile(driver: Any, tile_id: str) -> dict[str, str]:
    """A tile's label, value (without its unit) and tooltip, read in one script."""
    return dict(
        driver.execute_script(
            "const t = document.getElementById(arguments[0]);"
            "return {label: t.querySelector('.label').textContent,"
            " value: t.querySelector('.value').firstChild.textContent,"
            " sub: t.querySelector('.sub').textContent, title: t.title};",
            tile_id,
        )
    )


def _mb_s_shown(driver: Any) -> dict[str, str]:
    """The checkpoint tile's MB/s and step, and the MB/s of that step's table row, read in
    one script (so from one document)."""
    return dict(
        driver.execute_script("""
        const t = document.getElementById("tile-checkpoint");
        const step = t.querySelector(".sub").textContent.split(" · ")[0];
        const row = document.querySelector(
          `#checkpoints tr[data-step="${step.replace("step ", "")}"] td.mb-s`);
        return {tile: t.querySelector(".value").firstChild.textContent, tile_step: step,
                row: row ? row.textContent : null, title: t.title,
                caption: document.getElementById("mb-s-caption").textContent};
        """)
    )


def _clock(driver: Any, ms: int) -> str:
    """``ms`` as the page writes a time of day."""
    return str(
        driver.execute_script(
            "return new Date(arguments[0]).toLocaleTimeString([], { hour12: false });", ms
        )
    )

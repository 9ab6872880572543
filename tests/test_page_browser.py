"""The page says what the CLI knows, in a real headless Chromium served by ``strata
dashboard`` (every job): each job's state as a badge, each checkpoint with its run, no rate,
ETA, live count or slowest worker where the document has none, no raw object text
(``[object Object]``, ``undefined``, ``NaN``) in any cell, and no sideways scrolling at
400 px.

The jobs: ``run-job`` running (a worker heartbeating, a shard held, checkpoints of run 0 and
of run 1), ``stale-job`` (its one worker silent past the timeout: no rate), ``end-job``
(ended). ``build_jobs`` is also what ``docs/img/page-*.png`` were shot from.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from itertools import product
from pathlib import Path
from typing import Any

import pytest

import strata_redis
from strata_redis.server import RedisServer

from .browser import chromium, served_dashboard
from .procs import wait_for

RUNNING, STALE, ENDED = "run-job", "stale-job", "end-job"
#: the heartbeat timeout of the running job: long, so a loaded machine never reads it stale
TIMEOUT = 30.0
#: the stale job's: its worker beats once, at registration, and reads silent after this
SILENT_AFTER = 1.0
#: the words the page must never show: JavaScript's text of an object, a missing field, a bad number
RAW = ("[object", "undefined", "NaN")


@contextlib.contextmanager
def build_jobs(url: str, checkpoints: Path) -> Iterator[None]:
    """The three jobs above in the Redis at ``url``; the running one's worker heartbeats
    until the block ends."""
    with strata_redis.connect(url, RUNNING, heartbeat_timeout=TIMEOUT) as job:
        strata_redis.ShardManager(job).register_dataset_params("imagenet_train", 1000, 10, True, 42)
        worker = job.register_worker("w-a", host="gpu-1", address="10.0.0.1:29500",
                                     gpu_count=8, heartbeat_interval=0.5)  # fmt: skip
        worker.set_status("training")
        lease = job.leases("imagenet_train", 0, "w-a", ttl=3600).acquire()
        assert lease is not None  # held: the worker's shard in progress
        with strata_redis.CheckpointManager(checkpoints, redis=job, worker_id="w-a") as ckpt:
            ckpt.save(b"x" * 200_000, step=200, epoch=0).result()
            ckpt.save(b"x" * 200_000, step=3, epoch=0, run=1).result()  # after a relaunch
        with strata_redis.connect(url, STALE, heartbeat_timeout=SILENT_AFTER) as stale:
            stale.register_worker("w-s", heartbeat_interval=None).set_status("training")
        with strata_redis.connect(url, ENDED, heartbeat_timeout=TIMEOUT) as ended:
            w = ended.register_worker("w-e", heartbeat_interval=None)
            with strata_redis.CheckpointManager(checkpoints, redis=ended, worker_id="w-e") as c:
                c.save(b"y" * 1000, step=50, epoch=1).result()
            w.deregister()
            ended.end()
        try:
            yield
        finally:
            worker.stop_heartbeat()


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    """A Chromium on ``strata dashboard`` of the three jobs: ``(driver, base URL)``."""
    tmp = tmp_path_factory.mktemp("page")
    with (
        RedisServer() as server,
        build_jobs(server.url, tmp / "ckpt"),
        served_dashboard(server.url, None, TIMEOUT) as (_, url),
    ):
        driver = chromium(tmp / "profile")
        try:
            yield driver, url
        finally:
            driver.quit()


def load(driver: Any, url: str, width: int = 1440, height: int = 1000) -> None:
    """Open ``url`` in a window ``width`` x ``height`` px and wait until a document has been
    drawn."""
    driver.set_window_size(width, height)
    driver.get(url)
    wait_for(
        lambda: driver.execute_script(
            # a poll starts once the previous reply was drawn: the second one, the first drawn
            "const s = window.strataDashboard; return !!(s && s.doc && s.polls >= 2);"
        ),
        30,
        step=0.1,
        why=lambda: (
            driver.execute_script(
                "const s = window.strataDashboard;"
                " return [document.URL, s && s.polls, s && s.failure];"
            ),
            driver.get_log("browser"),
        ),
    )


def texts(driver: Any) -> list[str]:
    """Every text node of the page and every title (tooltip), read in one script."""
    return list(
        driver.execute_script("""
        const out = [];
        const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
        while (walk.nextNode()) out.push(walk.currentNode.nodeValue);
        for (const e of document.querySelectorAll("[title]")) out.push(e.title);
        return out;
        """)
    )


@pytest.mark.timeout(180)
def test_no_raw_object_text_in_any_cell(page: tuple[Any, str]) -> None:
    """The index's latest checkpoint used to read ``[object Object]`` (it became an object)."""
    driver, url = page
    for where in ("", f"job/{RUNNING}", f"job/{STALE}", f"job/{ENDED}"):
        load(driver, url + where)
        wait_for(lambda: driver.execute_script(
            "return window.strataDashboard.polls") >= 3, 30)  # fmt: skip
        bad = [t for t in texts(driver) if any(r in t for r in RAW)]
        assert bad == [], (where, bad)


def _badges(driver: Any) -> dict[str, Any]:
    return dict(
        driver.execute_script("""
        const rows = {};
        for (const tr of document.querySelectorAll("#jobs tbody tr")) {
          const b = tr.querySelector(".job-state");
          rows[tr.dataset.job] = b ? [b.textContent, b.className, b.title] : null;
        }
        const h = document.getElementById("job-state");
        return {rows, header: h && !h.hidden ? h.textContent : null};
        """)
    )


@pytest.mark.timeout(180)
def test_the_state_badge_of_a_running_a_stale_and_an_ended_job(page: tuple[Any, str]) -> None:
    driver, url = page
    load(driver, url)
    wait_for(lambda: len(_badges(driver)["rows"]) == 3, 30, why=lambda: _badges(driver))
    rows = _badges(driver)["rows"]
    assert {job: row[0] if row else None for job, row in rows.items()} == {
        RUNNING: "running", STALE: "stale", ENDED: "ended",
    }, rows  # fmt: skip
    assert "state-running" in rows[RUNNING][1] and "heartbeat" in rows[RUNNING][2], rows
    for job, state in ((RUNNING, "running"), (ENDED, "ended"), (STALE, "stale")):
        load(driver, f"{url}job/{job}")
        assert _badges(driver)["header"] == state, (job, _badges(driver))


def _progress(driver: Any) -> dict[str, Any]:
    return dict(
        driver.execute_script("""
        const p = document.getElementById("progress");
        const card = (n) => {
          const c = p.querySelector(`[data-progress='${n}']`);
          return c ? c.textContent : null;
        };
        const live = document.getElementById("tile-live");
        return {rate: card("rate"), eta: card("eta"), slowest: card("slowest"),
                progress: p.textContent, live: live ? live.textContent : null,
                runs: [...document.querySelectorAll("#checkpoints tbody tr")].map(
                  (tr) => [tr.dataset.step, tr.querySelector("td.run").textContent])};
        """)
    )


@pytest.mark.timeout(180)
def test_runs_beside_checkpoints_and_no_rate_where_there_is_none(page: tuple[Any, str]) -> None:
    driver, url = page
    load(driver, f"{url}job/{RUNNING}")
    assert _progress(driver)["runs"] == [["3", "1"], ["200", "0"]], _progress(driver)
    load(driver, url)
    cell = driver.execute_script(
        f"return document.querySelector(\"#jobs tr[data-job='{RUNNING}'] td.latest\").textContent"
    )
    assert "run 1" in cell and "step 3" in cell, cell
    # every live worker silent: no rate (the words instead), no ETA, no slowest, no live count
    load(driver, f"{url}job/{STALE}")
    shown = _progress(driver)
    assert "no recent data" in shown["rate"] and "no worker heartbeating" in shown["rate"], shown
    assert shown["eta"] is None and "ETA" not in shown["progress"], shown
    assert shown["slowest"] is None, shown
    assert "none heartbeating" in shown["live"] and "1 silent" in shown["live"], shown


@pytest.mark.timeout(180)
def test_at_400_px_nothing_scrolls_sideways(page: tuple[Any, str]) -> None:
    driver, url = page
    # tall too: without a vertical scrollbar the cards lay out three to a row, not two
    for where, height in product(("", f"job/{RUNNING}", f"job/{STALE}", f"job/{ENDED}"),
                                 (1000, 3000)):  # fmt: skip
        load(driver, url + where, width=400, height=height)
        inner = driver.execute_script("return window.innerWidth")
        assert inner <= 420, inner  # the window really is narrow
        # the page's width beside the room it has: the window less its vertical scrollbar
        wide, room = driver.execute_script(
            "const d = document.documentElement; return [d.scrollWidth, d.clientWidth];"
        )
        assert wide <= room <= inner, (where, wide, room, inner)

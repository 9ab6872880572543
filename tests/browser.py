"""Headless Debian Chromium driven by Selenium, for the dashboard's browser test."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1440,1000",
]  # fmt: skip
INSTALL = (
    "the dashboard's browser test needs Debian's chromium and chromium-driver at {} and {}: "
    "run scripts/setup.sh (it installs them with apt-get), or "
    "`apt-get install -y chromium chromium-driver`"
)


def chromium(profile: Path) -> Any:
    """A headless Chromium with a fresh profile in ``profile``; fails the test (never skips)
    when the browser or its driver is missing."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(INSTALL.format(CHROMIUM, CHROMEDRIVER) + f" (missing: {missing})")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def full_page_screenshot(driver: Any, path: Path, width: int = 1440) -> Path:
    """A PNG of the whole page (the window grown to the page's height)."""
    for _ in range(3):  # the window's frame takes some height: grow until the page fits
        need = int(driver.execute_script("return document.documentElement.scrollHeight"))
        have = int(driver.execute_script("return window.innerHeight"))
        if have >= need:
            break
        outer = driver.get_window_size()["height"]
        driver.set_window_size(width, min(outer + need - have, 4000))
        time.sleep(0.3)  # let the charts follow the resize
    driver.save_screenshot(str(path))
    return path


@contextlib.contextmanager
def served_dashboard(
    redis_url: str, job: str | None, heartbeat_timeout: float
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``strata dashboard`` (waitress) for ``job`` (None: every job) on a free loopback port;
    yields the process and its URL, and stops it."""
    only = [] if job is None else ["--job", job]
    proc = subprocess.Popen(
        [sys.executable, "-m", "strata_redis", "dashboard", "--redis-url", redis_url, *only,
         "--port", "0", "--heartbeat-timeout", str(heartbeat_timeout)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "strata dashboard: serving http://127.0.0.1:N/ ..."
        match = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert match, f"no URL from strata dashboard: {line!r}"
        yield proc, match.group(0)
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(20)
        if proc.stdout is not None:
            proc.stdout.close()

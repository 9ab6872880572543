"""Shoot the dashboard's picture from the demo: ``python scripts/screenshot.py docs/dashboard.png``.

Starts ``strata dashboard --demo`` (a private Redis and real worker processes) on a free
port, waits until the page has something to show (a worker failed and rejoined, committed
checkpoints, a minute of charts; at most ``--wait`` seconds), opens the page in headless
Chromium (tests/browser.py: Debian's chromium and chromium-driver, ``scripts/setup.sh
--browser``) and saves the whole page as a PNG. Run it from the repository's root with the
project's Python (``.venv/bin/python``); it stops the demo when done.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.browser import chromium, full_page_screenshot  # noqa: E402


def _ready(doc: dict, started: float, least: float) -> bool:
    """Enough to show: a failure in the feed, two committed checkpoints, ``least`` seconds."""
    failed = any(e["type"] == "fail" for e in doc["events"])
    committed = sum(c["state"] == "committed" for c in doc["checkpoints"])
    return failed and committed >= 2 and time.monotonic() - started >= least


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="the PNG to write (e.g. docs/dashboard.png)")
    parser.add_argument("--wait", type=float, default=150.0, help="seconds at most (150)")
    parser.add_argument("--least", type=float, default=60.0, help="seconds at least (60)")
    parser.add_argument("--workers", type=int, default=4, help="demo workers (4)")
    args = parser.parse_args()

    demo = subprocess.Popen(
        [sys.executable, "-m", "strata_redis", "dashboard", "--demo", "--port", "0",
         "--workers", str(args.workers)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # Ctrl-C stops it
    )  # fmt: skip
    try:
        assert demo.stdout is not None
        url = None
        for line in demo.stdout:
            print(line, end="", flush=True)
            match = re.search(r"dashboard: (http://127\.0\.0\.1:\d+/)", line)
            if match:
                url = match.group(1)
                break
        if url is None:
            print("screenshot: the demo did not start", file=sys.stderr)
            return 1
        started = time.monotonic()
        while time.monotonic() - started < args.wait:
            with urllib.request.urlopen(url + "api/dashboard", timeout=10) as reply:
                if _ready(json.load(reply), started, args.least):
                    break
            time.sleep(2)
        else:
            print(f"screenshot: nothing much to show after {args.wait:g} s; shooting anyway")
        with tempfile.TemporaryDirectory() as profile:
            driver = chromium(Path(profile))
            try:
                driver.get(url + "job/demo")
                time.sleep(4)  # a few polls: charts drawn, the clock "updated 0.x s ago"
                full_page_screenshot(driver, args.output.resolve())
            finally:
                driver.quit()
        print(f"screenshot: wrote {args.output}")
        return 0
    finally:
        demo.send_signal(signal.SIGINT)
        try:
            demo.wait(60)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait(10)


if __name__ == "__main__":
    raise SystemExit(main())

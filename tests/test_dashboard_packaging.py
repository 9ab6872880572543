"""The wheel carries the dashboard's page, vendored chart code with its licence, and schema."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_carries_the_dashboard(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("strata_redis-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    base = "strata_redis/dashboard/"
    for name in ("schema.json", "templates/index.html", "static/dashboard.js", "static/progress.js",
                 "static/dashboard.css", "static/vendor/uplot/uPlot.iife.min.js",
                 "static/vendor/uplot/uPlot.min.css", "static/vendor/uplot/LICENSE"):  # fmt: skip
        assert base + name in names, name

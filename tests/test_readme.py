"""Every Python example in the README runs as written (against the test Redis and S3)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_has_examples() -> None:
    assert len(EXAMPLES) >= 2


def run_example(code: str, redis_url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STRATA_REDIS_URL": redis_url, "LOCAL_STORAGE_PATH": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("code", EXAMPLES, ids=[f"example-{i}" for i in range(len(EXAMPLES))])
def test_readme_example_runs(code: str, redis_url: str, tmp_path: Path) -> None:
    run = run_example(code, redis_url, tmp_path)
    assert run.returncode == 0, run.stderr


def test_readme_examples_run_one_after_another_on_one_redis(redis_url: str, tmp_path: Path) -> None:
    """A reader runs them in turn against one Redis: none may trip over what another left."""
    for i, code in enumerate(EXAMPLES):
        run = run_example(code, redis_url, tmp_path)
        assert run.returncode == 0, f"example {i}: {run.stderr}"

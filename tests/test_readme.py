"""Every Python example in the README and the docs site runs as written.

Each ```python block of ``README.md`` and ``docs/**/*.md`` runs in a fresh interpreter
against the test Redis (``STRATA_REDIS_URL``), with ``LOCAL_STORAGE_PATH`` a scratch
directory and, for a block that uses S3, the test S3 endpoint (``AWS_ENDPOINT_URL``) with a
bucket ``my-bucket``. A block that cannot run says why in a comment right before it:
``<!-- no-run: reason -->``. (``mkdocs build --strict`` runs in ``scripts/test.sh``.)
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
NO_RUN = re.compile(r"<!-- no-run: (\S[^>]*?) -->\s*$")
BUCKET = "my-bucket"


@dataclass(frozen=True)
class Example:
    """One ```python block: where it is, its code, and why it does not run (if it does not)."""

    page: str
    line: int
    code: str
    no_run: str | None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def uses_s3(self) -> bool:
        return "S3Storage(" in self.code or "s3://" in self.code

    @property
    def uses_torch(self) -> bool:
        return re.search(r"^\s*(import|from) torch\b", self.code, re.M) is not None


def examples_of(path: Path) -> list[Example]:
    text = path.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()]
        reason = NO_RUN.search(before)
        found.append(
            Example(
                page=path.relative_to(ROOT).as_posix(),
                line=before.count("\n") + 1,
                code=match.group(1),
                no_run=reason.group(1) if reason else None,
            )
        )
    return found


EXAMPLES = [e for page in PAGES for e in examples_of(page)]
BY_PAGE = {p: [e for e in EXAMPLES if e.page == p] for p in dict.fromkeys(e.page for e in EXAMPLES)}


def test_examples_are_collected_from_the_readme_and_the_docs() -> None:
    pages = {e.page for e in EXAMPLES}
    assert "README.md" in pages
    assert len([e for e in EXAMPLES if e.page == "README.md"]) >= 2
    guides = ("getting-started", "training-loop", "pytorch", "checkpoints", "datasets")
    for guide in (*guides, "data-in-s3"):
        assert f"docs/guides/{guide}.md" in pages, guide
    # a fence indented into a list item would be skipped by FENCE: there is none
    for page in PAGES:
        indented = re.findall(r"^[ \t]+```python", page.read_text(encoding="utf-8"), re.M)
        assert not indented, f"{page}: an indented ```python block is not collected"


def test_every_skipped_example_says_why() -> None:
    for e in EXAMPLES:
        assert e.no_run is None or len(e.no_run.split()) >= 2, f"{e.id}: give a reason"


def test_the_wording_rules_hold() -> None:
    """Issue 28: the original design is named once, where it matters; never "the seeds"."""
    texts = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in PAGES}
    assert not [p for p, t in texts.items() if re.search(r"\bthe seeds\b", t, re.I)]
    named = [p for p, t in texts.items() for _ in re.finditer(r"the original Strata\s+design", t)]
    assert len(named) == 1, named


def run_example(
    e: Example, redis_url: str, tmp_path: Path, s3: str | None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STRATA_REDIS_URL": redis_url, "LOCAL_STORAGE_PATH": str(tmp_path)}
    if s3 is not None:
        env["AWS_ENDPOINT_URL"] = s3
    return subprocess.run(
        [sys.executable, "-c", e.code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def prepare(e: Example, request: pytest.FixtureRequest) -> str | None:
    """Skip what cannot run here; for an S3 example, the endpoint with the bucket made."""
    if e.no_run is not None:
        pytest.skip(f"{e.id}: {e.no_run}")
    if e.uses_torch and importlib.util.find_spec("torch") is None:
        pytest.skip(f"{e.id}: needs PyTorch (scripts/setup.sh --torch)")
    if not e.uses_s3:
        return None
    endpoint = str(request.getfixturevalue("s3_endpoint"))
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
    return endpoint


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example_runs(
    example: Example, redis_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    s3 = prepare(example, request)
    run = run_example(example, redis_url, tmp_path, s3)
    assert run.returncode == 0, f"{example.id}:\n{run.stderr}"


@pytest.mark.parametrize("page", [p for p, es in BY_PAGE.items() if len(es) > 1])
def test_a_pages_examples_run_one_after_another_on_one_redis(
    page: str, redis_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A reader runs a page's examples in turn against one Redis: none may trip over what
    another left."""
    for e in BY_PAGE[page]:
        if e.no_run is not None or (e.uses_torch and importlib.util.find_spec("torch") is None):
            continue
        run = run_example(e, redis_url, tmp_path, prepare(e, request))
        assert run.returncode == 0, f"{e.id}:\n{run.stderr}"


def test_the_readmes_links_resolve() -> None:
    """The README is not part of the site (whose strict build checks its own links): its
    relative links must name files that exist."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t)]
    assert len(local) >= 10
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, missing

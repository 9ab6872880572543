#!/usr/bin/env bash
# Quick start 2: set everything up, then run the linters, the docs build and the whole test
# suite.
# Extra arguments go to pytest, e.g. -k barrier.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --browser --torch --prometheus
.venv/bin/ruff check strata_redis tests perf examples
.venv/bin/mypy
.venv/bin/lint-imports  # the layer contract in pyproject.toml: imports only point down
# the docs site: a broken link, a missing page or an API reference to a name that does not
# exist fails the build (strict); its examples run in tests/test_readme.py. Not --quiet:
# it hides the warnings from the strict count, and the build then passes.
site_dir=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$site_dir"
rm -rf "$site_dir"
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test: pytest collected no tests; that is a failure here" >&2
  exit 1
fi
exit "$rc"

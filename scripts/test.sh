#!/usr/bin/env bash
# Quick start 2: set everything up, then run the linters, the docs build and the whole test
# suite (both tiers: tests/unit, pure parts and seams through fakes; tests/test_*.py, real
# redis-servers and processes).
#
#   scripts/test.sh           everything (what CI runs: .ci/run)
#   scripts/test.sh --fast    the linters and the unit tier only (tests/unit, about a minute):
#                             set up without the browser, Prometheus and PyTorch, no docs build
#
# Extra arguments go to pytest, e.g. -k barrier. The whole suite runs in STRATA_TEST_WORKERS
# pytest-xdist worker processes (3 by default: most tests wait on servers and processes,
# not on the CPU; 0 runs it in this process, one test after another).
set -euo pipefail
cd "$(dirname "$0")/.."
FAST=0
if [ "${1:-}" = "--fast" ]; then
  FAST=1
  shift
fi
if [ "$FAST" = 1 ]; then
  scripts/setup.sh  # the package with its dev and docs extras: what the unit tier imports
else
  scripts/setup.sh --browser --torch --prometheus
fi
.venv/bin/ruff check strata_redis tests perf examples
.venv/bin/mypy
.venv/bin/lint-imports  # the layer contract in pyproject.toml: imports only point down
if [ "$FAST" = 0 ]; then
  # the docs site: a broken link, a missing page or an API reference to a name that does not
  # exist fails the build (strict); its examples run in tests/test_readme.py. Not --quiet:
  # it hides the warnings from the strict count, and the build then passes.
  site_dir=$(mktemp -d)
  NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$site_dir"
  rm -rf "$site_dir"
fi
set +e
if [ "$FAST" = 1 ]; then
  .venv/bin/python -m pytest tests/unit "$@"
else
  .venv/bin/python -m pytest -n "${STRATA_TEST_WORKERS:-3}" "$@"
fi
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test: pytest collected no tests; that is a failure here" >&2
  exit 1
fi
exit "$rc"

#!/usr/bin/env bash
# Quick start 2: set everything up, then run the linters and the whole test suite.
# Extra arguments go to pytest, e.g. -k barrier.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --browser --torch --prometheus
.venv/bin/ruff check strata_redis tests perf examples
.venv/bin/mypy
.venv/bin/lint-imports  # the layer contract in pyproject.toml: imports only point down
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test: pytest collected no tests; that is a failure here" >&2
  exit 1
fi
exit "$rc"

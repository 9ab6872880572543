#!/usr/bin/env bash
# Quick start 1: set everything up, then run the demo (a simulated training cluster on a
# private redis-server). Extra arguments go to `strata demo`, e.g. --workers 6.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --demo  # the package alone: what the demo needs
exec .venv/bin/strata demo "$@"

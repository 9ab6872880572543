#!/usr/bin/env bash
# Set everything up on a fresh Debian/Ubuntu machine: a redis-server binary (from PATH, else
# apt-get), with --browser Chromium and chromedriver for the dashboard's browser test
# (apt-get), a virtual environment in .venv, and strata-redis in it: with --demo the package
# alone (what `strata demo` needs: scripts/demo.sh), else with its dev and docs extras (the
# test suite, and what `mkdocs build --strict` needs: scripts/test.sh).
#
# apt-get runs through scripts/apt.sh: a package lock held by another process is waited for
# (up to STRATA_APT_LOCK_WAIT seconds, 120 by default), a missing privilege said as such.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/apt.sh
. scripts/apt.sh

say() { echo "setup: $*" >&2; }

find_redis() {
  [ -n "${STRATA_REDIS_SERVER:-}" ] && [ -x "$STRATA_REDIS_SERVER" ] && return 0
  command -v redis-server >/dev/null && return 0
  for p in /usr/bin/redis-server /usr/sbin/redis-server /usr/local/bin/redis-server; do
    [ -x "$p" ] && return 0
  done
  return 1
}

BROWSER=0 TORCH=0 PROMETHEUS=0 DEMO=0
for arg in "$@"; do
  case "$arg" in
    --browser) BROWSER=1 ;;
    --torch) TORCH=1 ;;
    --prometheus) PROMETHEUS=1 ;;
    --demo) DEMO=1 ;;
    *) say "unknown option $arg (known: --demo, --browser, --torch, --prometheus)"; exit 2 ;;
  esac
done

if ! find_redis; then
  if command -v apt-get >/dev/null; then
    say "no redis-server found: installing Debian's redis-server package"
    apt_install redis-server || exit 1
  else
    say "no redis-server found and no apt-get: install Redis 7 yourself (macOS: brew install redis;"
    say "Fedora: dnf install redis) or set STRATA_REDIS_SERVER=/path/to/redis-server"
    exit 1
  fi
fi


# The dashboard's browser test drives Debian's headless Chromium through its chromedriver:
# `setup.sh --browser` (what scripts/test.sh runs) installs them; the demo does not need them.
if [ "$BROWSER" = 1 ] && { [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; }; then
  if command -v apt-get >/dev/null; then
    say "no /usr/bin/chromium or /usr/bin/chromedriver: installing Debian's chromium and chromium-driver"
    apt_install chromium chromium-driver || exit 1
  else
    say "no /usr/bin/chromium and no apt-get: the dashboard's browser test will fail until"
    say "Chromium and its chromedriver are installed at /usr/bin/chromium and /usr/bin/chromedriver"
  fi
fi

# tests/test_prometheus.py runs a real Prometheus against the dashboard and promtool on
# /metrics and the alert rules: `setup.sh --prometheus` (what scripts/test.sh runs) installs
# Debian's prometheus package when either binary is missing. (On Debian it also enables a
# prometheus service where systemd runs; the tests start their own, on a free port.)
if [ "$PROMETHEUS" = 1 ] && { [ ! -x /usr/bin/prometheus ] || [ ! -x /usr/bin/promtool ]; }; then
  if command -v apt-get >/dev/null; then
    say "no /usr/bin/prometheus or /usr/bin/promtool: installing Debian's prometheus"
    apt_install prometheus || exit 1
  else
    say "no /usr/bin/prometheus and no apt-get: tests/test_prometheus.py will fail until"
    say "prometheus and promtool are installed at /usr/bin (https://prometheus.io/download/)"
  fi
fi

PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || { say "no $PY: install Python 3.10 or newer (apt-get install python3)"; exit 1; }
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { say "$PY is $("$PY" -V 2>&1); strata-redis needs Python >= 3.10 (set PYTHON=...)"; exit 1; }

if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  if ! "$PY" -m venv .venv 2>/dev/null; then
    rm -rf .venv
    if command -v apt-get >/dev/null; then
      say "python venv support missing: installing python3-venv"
      apt_install python3-venv || exit 1
    fi
    "$PY" -m venv .venv
  fi
fi
# strata_redis.torch's tests (`--torch`, what scripts/test.sh runs) need PyTorch: the pinned
# release first, so the `torch` extra's range is met by it (an unpinned torch can resolve to a
# CUDA build of several GB; pip here takes the CPU build of 2.13.0)
if [ "$TORCH" = 1 ] && ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  say "installing torch==${STRATA_TORCH_VERSION:=2.13.0} into .venv (strata_redis.torch's tests)"
  .venv/bin/python -m pip install -q --disable-pip-version-check "torch==$STRATA_TORCH_VERSION"
fi
if [ "$DEMO" = 1 ]; then
  # the demo runs on the package's own dependencies (redis, hiredis, numpy, orjson): no
  # extras, and no pip cache kept in the environment
  say "installing strata-redis into .venv (the demo's needs only; scripts/test.sh adds the rest)"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-cache-dir -e .
  exit 0
fi
EXTRAS=dev,docs
# (with Lightning and Accelerate: strata_redis.lightning and strata_redis.accelerate's tests)
[ "$TORCH" = 1 ] && EXTRAS=dev,docs,torch,lightning,accelerate
say "installing strata-redis[$EXTRAS] into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$EXTRAS]"

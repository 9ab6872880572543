# shellcheck shell=bash
# apt_install PACKAGE...: install Debian packages with apt-get, sourced by scripts/setup.sh.
#
# It tells the two reasons an install fails on a machine that has apt-get apart:
#   - no privilege: not root and no sudo (or sudo refused): says to run as root or with sudo;
#   - the package lock held by another process (an unattended upgrade, another apt-get):
#     waits for it, up to STRATA_APT_LOCK_WAIT seconds (default 120), saying so and naming
#     the holder apt-get reports, then fails saying who still holds it.
# Anything else: apt-get's own error, shown as is.
#
# STRATA_APT_GET (default apt-get) and STRATA_APT_POLL (whole seconds between tries, default 5)
# exist for tests/test_setup.py.

apt_say() { echo "setup: $*" >&2; }

apt_as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else return 126
  fi
}

# one apt-get command as root; its stderr kept in $APT_ERR; returns apt-get's status
apt_run() {
  local errfile rc
  errfile=$(mktemp)
  rc=0
  apt_as_root env DEBIAN_FRONTEND=noninteractive "${STRATA_APT_GET:-apt-get}" "$@" \
    >/dev/null 2>"$errfile" || rc=$?
  APT_ERR=$(cat "$errfile")
  rm -f "$errfile"
  return "$rc"
}

apt_locked() {  # apt-get's messages for a lock another process holds
  grep -qiE "could not get lock|unable to acquire the dpkg frontend lock|unable to lock (the )?(administration )?directory|is another process using it" <<<"$APT_ERR"
}

apt_denied() {  # and for a missing privilege
  grep -qiE "permission denied|are you root|a password is required|not in the sudoers" <<<"$APT_ERR"
}

# apt_step ARGS...: one apt-get command, waiting out a lock held by another process
apt_step() {
  local waited=0 wait_s=${STRATA_APT_LOCK_WAIT:-120} poll=${STRATA_APT_POLL:-5} rc
  while :; do
    if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null; then
      apt_say "apt-get $1 needs root: this user is not root and there is no sudo;"
      apt_say "run this script as root (or install sudo), then retry"
      return 1
    fi
    rc=0
    apt_run "$@" || rc=$?
    [ "$rc" -eq 0 ] && return 0
    # first: apt-get without privilege also says it cannot "acquire the dpkg frontend lock"
    if [ "$rc" -eq 126 ] || apt_denied; then
      apt_say "apt-get $1 was refused for lack of privilege: run this script as root (or with"
      apt_say "sudo rights), then retry"
      [ -n "$APT_ERR" ] && echo "$APT_ERR" >&2
      return 1
    fi
    if apt_locked; then
      local holder
      holder=$(grep -oiE "held by process [0-9]+( \([^)]*\))?" <<<"$APT_ERR" | head -n1)
      if [ "$waited" -ge "$wait_s" ]; then
        apt_say "the package lock is still held by another process after ${wait_s}s${holder:+ ($holder)}:"
        apt_say "wait for it to finish (or stop it), then retry; STRATA_APT_LOCK_WAIT=<s> waits longer"
        return 1
      fi
      [ "$waited" -eq 0 ] && apt_say "another process holds the package lock${holder:+ ($holder)}: waiting up to ${wait_s}s for it"
      sleep "$poll"
      waited=$((waited + poll))
      continue
    fi
    apt_say "apt-get $1 failed (status $rc):"
    echo "$APT_ERR" >&2
    return 1
  done
}

apt_install() {
  apt_step update -qq && apt_step install -y -qq "$@"
}

"""``scripts/setup.sh``'s apt-get step (``scripts/apt.sh``): a package lock held by another
process is waited for, a bounded time, and told apart from a missing privilege.

A stand-in ``apt-get`` (``STRATA_APT_GET``) answers as Debian's does; ``PATH`` holds only
the few tools the step uses (so no ``sudo``), and a stand-in ``id`` plays root or a user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: what apt-get 2.x prints when another process holds the frontend lock (exit status 100)
LOCKED = (
    "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)\n"
    "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another "
    "process using it?"
)
DENIED = (
    "E: Could not open lock file /var/lib/dpkg/lock-frontend - open (13: Permission denied)\n"
    "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), are you root?"
)

#: the stand-in apt-get: logs each call; the first $LOCKED_CALLS calls fail with the lock
#: message, then each fails with $FAIL_WITH (if set) or succeeds
FAKE_APT = """#!/bin/bash
echo "$*" >> "$CALLS"
n=$(wc -l < "$CALLS")
if [ "$n" -le "$LOCKED_CALLS" ]; then printf '%s\\n' "$LOCKED_TEXT" >&2; exit 100; fi
if [ -n "${FAIL_WITH:-}" ]; then printf '%s\\n' "$FAIL_WITH" >&2; exit 100; fi
exit 0
"""


def _apt(tmp_path: Path, *, uid: int, locked_calls: int, fail_with: str = "",
         wait_s: int = 3) -> tuple[subprocess.CompletedProcess[str], list[str]]:  # fmt: skip
    """``apt_install x`` as ``setup.sh`` runs it; its result and apt-get's calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("grep", "mktemp", "cat", "rm", "sleep", "env", "head", "wc", "bash"):
        found = shutil.which(tool)
        assert found, tool
        target = bin_dir / tool
        if not target.exists():
            target.symlink_to(found)
    (bin_dir / "id").write_text(f"#!/bin/bash\necho {uid}\n")
    (bin_dir / "fake-apt-get").write_text(FAKE_APT)
    for f in ("id", "fake-apt-get"):
        (bin_dir / f).chmod(0o755)
    calls = tmp_path / "calls"
    calls.write_text("")
    env = {
        "PATH": str(bin_dir), "STRATA_APT_GET": "fake-apt-get", "STRATA_APT_POLL": "1",
        "STRATA_APT_LOCK_WAIT": str(wait_s), "CALLS": str(calls),
        "LOCKED_CALLS": str(locked_calls), "LOCKED_TEXT": LOCKED, "FAIL_WITH": fail_with,
    }  # fmt: skip
    run = subprocess.run(
        [str(bin_dir / "bash"), "-c", "set -euo pipefail; . scripts/apt.sh; apt_install x"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return run, calls.read_text().splitlines()


def test_a_lock_held_by_another_process_is_waited_for(tmp_path: Path) -> None:
    run, calls = _apt(tmp_path, uid=0, locked_calls=2)
    assert run.returncode == 0, run.stderr
    assert calls == ["update -qq"] * 3 + ["install -y -qq x"]
    (said,) = run.stderr.splitlines()  # said once, not once per try
    assert said == (
        "setup: another process holds the package lock (held by process 4242 (apt-get)): "
        "waiting up to 3s for it"
    )
    assert "root" not in run.stderr


def test_a_lock_never_freed_fails_after_the_bound_naming_the_holder(tmp_path: Path) -> None:
    run, calls = _apt(tmp_path, uid=0, locked_calls=1000, wait_s=2)
    assert run.returncode == 1
    assert calls == ["update -qq"] * 3  # at 0, 1 and 2 s: then the bound
    assert "still held by another process after 2s (held by process 4242 (apt-get))" in (
        run.stderr
    ), run.stderr
    assert "STRATA_APT_LOCK_WAIT" in run.stderr and "as root" not in run.stderr


@pytest.mark.parametrize("uid", [1000, 0])
def test_a_missing_privilege_is_said_as_such_at_once(tmp_path: Path, uid: int) -> None:
    """A user with no sudo (apt-get never runs), or apt-get refusing for lack of privilege:
    the message says to run as root, with no wait."""
    run, calls = _apt(tmp_path, uid=uid, locked_calls=0, fail_with=DENIED)
    assert run.returncode == 1
    assert "run this script as root" in run.stderr, run.stderr
    assert "waiting" not in run.stderr and "lock (held" not in run.stderr
    assert calls == ([] if uid else ["update -qq"])
    if uid:
        assert "not root and there is no sudo" in run.stderr


def test_the_demo_sets_up_the_package_alone() -> None:
    """``demo.sh`` asks ``setup.sh`` for the package without extras (the demo's needs);
    ``test.sh`` still sets up the dev and docs extras."""
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    assert "scripts/setup.sh --demo" in demo
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "-e .\n" in setup and "EXTRAS=dev,docs" in setup
    assert "scripts/setup.sh --demo" not in (ROOT / "scripts" / "test.sh").read_text()
    assert os.access(ROOT / "scripts" / "setup.sh", os.X_OK)

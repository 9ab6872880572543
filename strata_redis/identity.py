"""Default identities no two runs share: a worker id, a job id, a checkpoint directory.

What a training script gets when it names none of them (``TrainingOrchestrator()``):

- **worker id**: the host name and torchrun's rank (``gpu-a-rank-3``; ``RANK``, else
  ``GROUP_RANK`` and ``LOCAL_RANK``), so a restarted rank comes back as itself; with no
  torchrun, the host name and the process id (``gpu-a-pid-4242``): unique per process.
- **replace**: a registration of the id whose holder looks alive is taken over only when
  torchrun says the process is a restart (``TORCHELASTIC_RESTART_COUNT`` > 0); a stale one
  (its heartbeat past the timeout, or its process gone on this host) always is.
- **job id**: ``$STRATA_JOB_ID``, else torchrun's run id (``TORCHELASTIC_RUN_ID``, unless it
  is torchrun's shared default ``none``), else ``<script>-<8 hex>``: a digest of the user,
  the main script's absolute path and the working directory, which a relaunch of the same
  command reproduces (so it resumes) and another script or directory does not. Every entry
  point that is given no job id takes this one (``connect``, ``Job``, ``ShardManager``,
  ``CheckpointManager``, ``TrainingOrchestrator``: ``context.JobContext``), so the parts of
  one script meet in one job; it is derived once per process (a later ``os.chdir`` does
  not change it).
- **checkpoint directory**: ``$XDG_DATA_HOME/strata_redis/checkpoints``, else
  ``~/.local/share/strata_redis/checkpoints``: per user and persistent, never the system
  temp dir.

Each derived value is logged once per process (ids at INFO; the checkpoint directory at
WARNING, since the user did not choose it).
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import os
import re
import socket
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from .validate import check_id

__all__ = [
    "JOB_ENV",
    "RESTART_ENV",
    "RUN_ID_ENV",
    "TORCHRUN_DEFAULT_RUN_ID",
    "checkpoint_dir",
    "host_name",
    "job_id",
    "restarted",
    "worker_id",
]

log = logging.getLogger("strata_redis.identity")

#: the job id a user sets for every process of a job
JOB_ENV = "STRATA_JOB_ID"
#: torchrun's run id (``--rdzv-id``), the same in every process of one launch
RUN_ID_ENV = "TORCHELASTIC_RUN_ID"
#: torchrun's count of restarts of the worker group (0 at the first start)
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"
#: the run id torchrun sets when ``--rdzv-id`` is not given: shared by every such launch
TORCHRUN_DEFAULT_RUN_ID = "none"
#: characters of the host name kept in a worker id
HOST_CHARS = 64
#: characters of the script name kept in a derived job id
SCRIPT_CHARS = 40

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_said: set[tuple[str, str]] = set()
_said_lock = threading.RLock()
#: this process's derived job id, once derived (``job_id``)
_launch_job: str | None = None


def _first_time(kind: str, value: str) -> bool:
    """Whether ``value`` of ``kind`` is new to this process (then it is logged)."""
    with _said_lock:
        if (kind, value) in _said:
            return False
        _said.add((kind, value))
        return True


def host_name(name: str | None = None) -> str:
    """The host name (default: this machine's) as id text: ASCII letters, digits, ``.-_``.

    Any other run of characters becomes ``-``; at most ``HOST_CHARS`` characters are kept;
    an empty result is ``host``.
    """
    raw = socket.gethostname() if name is None else name
    return _UNSAFE.sub("-", raw).strip("-.")[:HOST_CHARS].strip("-.") or "host"


def _rank(env: Mapping[str, str], var: str) -> int | None:
    value = env.get(var, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise ValueError(f"{var} must be a non-negative integer (torchrun sets it), got {value!r}")
    return int(value)


def worker_id(
    environ: Mapping[str, str] | None = None, *, host: str | None = None, pid: int | None = None
) -> str:
    """This process's default worker id: unique per process, stable across a rank's restart.

    ``<host>-rank-<RANK>`` under torchrun (``<host>-group-<GROUP_RANK>-local-<LOCAL_RANK>``
    when only those are set), else ``<host>-pid-<pid>``. Logged once at INFO.

    Args:
        environ: the variables to read; default ``os.environ``.
        host: the host name (default: this machine's); made id text by ``host_name``.
        pid: the process id (default: this process's).

    Raises:
        ValueError: ``RANK``, ``GROUP_RANK`` or ``LOCAL_RANK`` is set but not a number.
    """
    env = os.environ if environ is None else environ
    name = host_name(host)
    rank = _rank(env, "RANK")
    group, local = _rank(env, "GROUP_RANK"), _rank(env, "LOCAL_RANK")
    if rank is not None:
        derived, source = f"{name}-rank-{rank}", "the host name and torchrun's RANK"
    elif group is not None and local is not None:
        derived = f"{name}-group-{group}-local-{local}"
        source = "the host name and torchrun's GROUP_RANK and LOCAL_RANK"
    else:
        derived = f"{name}-pid-{os.getpid() if pid is None else pid}"
        source = "the host name and the process id"
    derived = check_id("worker_id", derived)
    if _first_time("worker", derived):
        log.info("worker id %r (from %s; pass worker_id= to choose one)", derived, source)
    return derived


def restarted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether torchrun says this process is a restart (``TORCHELASTIC_RESTART_COUNT`` > 0):
    the default of ``replace``, so a restarted rank takes its id back from its dead self.

    Raises:
        ValueError: the variable is set but not a number.
    """
    count = _rank(os.environ if environ is None else environ, RESTART_ENV)
    return bool(count)


def job_id(
    environ: Mapping[str, str] | None = None,
    *,
    argv0: str | None = None,
    cwd: str | None = None,
    user: str | None = None,
) -> str:
    """The job id of a script that names none: ``$STRATA_JOB_ID``, else torchrun's run id,
    else ``<script>-<8 hex>`` derived from the launch (logged once at INFO).

    The derived id is a digest of the user, the main script's absolute path and the working
    directory: a relaunch of the same command in the same directory reproduces it (and so
    resumes the run), another script or directory gets another job.

    Args:
        environ: the variables to read; default ``os.environ``.
        argv0: the main script (default ``sys.argv[0]``).
        cwd: the working directory (default: this process's).
        user: the user name (default: this process's).

    Raises:
        ValueError: ``STRATA_JOB_ID`` or ``TORCHELASTIC_RUN_ID`` is not a valid job id.
    """
    env = os.environ if environ is None else environ
    given = env.get(JOB_ENV, "")
    if given:
        return check_id(JOB_ENV, given, job=True)
    run = env.get(RUN_ID_ENV, "").strip()
    if run and run != TORCHRUN_DEFAULT_RUN_ID:
        derived = check_id(RUN_ID_ENV, run, job=True)
        if _first_time("job", derived):
            log.info(
                "job id %r (torchrun's %s; set %s to choose one)", derived, RUN_ID_ENV, JOB_ENV
            )
        return derived
    if argv0 is None and cwd is None and user is None:
        global _launch_job
        with _said_lock:  # this process's launch: derived once, whatever changes later
            if _launch_job is None:
                _launch_job = _derive_job_id(None, None, None)
            return _launch_job
    return _derive_job_id(argv0, cwd, user)


def _derive_job_id(argv0: str | None, cwd: str | None, user: str | None) -> str:
    """``<script>-<8 hex>`` from the launch (``job_id``), logged once."""
    script = (sys.argv[0] if sys.argv else "") if argv0 is None else argv0
    where = os.getcwd() if cwd is None else cwd
    who = _user() if user is None else user
    named = script not in ("", "-", "-c", "-m")
    main = os.path.abspath(os.path.join(where, script)) if named else script
    digest = hashlib.sha256("\0".join((who, main, where)).encode()).hexdigest()[:8]
    stem = _UNSAFE.sub("-", Path(main).stem if named else "").strip("-.")[:SCRIPT_CHARS]
    derived = check_id("job_id", f"{stem.strip('-.') or 'train'}-{digest}", job=True)
    if _first_time("job", derived):
        log.info(
            "job id %r (derived from the user, the script %r and the directory %r: a relaunch "
            "of the same command resumes it; set %s or pass job_id= to choose one)",
            derived, main, where, JOB_ENV,
        )  # fmt: skip
    return derived


def _user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        return str(os.getuid()) if hasattr(os, "getuid") else ""


def checkpoint_dir(environ: Mapping[str, str] | None = None) -> str:
    """The per-user default checkpoint directory (logged once per process at WARNING).

    ``$XDG_DATA_HOME/strata_redis/checkpoints`` when ``XDG_DATA_HOME`` is an absolute path,
    else ``$HOME/.local/share/strata_redis/checkpoints``.

    Args:
        environ: the variables to read; default ``os.environ``.
    """
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_DATA_HOME", "")
    if xdg and os.path.isabs(xdg):  # the XDG spec: a relative path is invalid, ignore it
        base = Path(xdg)
    else:
        home = env.get("HOME") or str(Path.home())
        base = Path(home) / ".local" / "share"
    path = str(base / "strata_redis" / "checkpoints")
    if _first_time("checkpoints", path):
        log.warning(
            "checkpoints go to %s, the per-user default: no checkpoint path, LOCAL_STORAGE_PATH "
            "or STORAGE_BACKEND=s3 was given",
            path,
        )
    return path

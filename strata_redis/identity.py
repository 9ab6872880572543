"""Default identities: a worker id, a job id, a checkpoint directory.

What a training script gets when it names none of them (``TrainingOrchestrator()``):

- **worker id**: the host name and torchrun's rank (``gpu-a-rank-3``; ``RANK``, else
  ``GROUP_RANK`` and ``LOCAL_RANK``), so a restarted rank comes back as itself; with no
  torchrun, the host name and the process id (``gpu-a-pid-4242``): unique per process.
- **replace**: a registration of the id whose holder looks alive is taken over only when
  torchrun says the process is a restart (``TORCHELASTIC_RESTART_COUNT`` > 0); a stale one
  (its heartbeat past the timeout, or its process gone on this host) always is.
- **job id**: ``$STRATA_JOB_ID``, else torchrun's run id (``TORCHELASTIC_RUN_ID``, unless
  torchrun made it up: its shared default ``none``, or the random UUID it gives a
  ``--standalone`` or single-node launch, new at every launch), else ``<script>-<8 hex>``: a
  digest of the main script's *content* and its arguments (``sys.argv[1:]``, less the
  ``--local-rank``/``--local_rank`` a launcher gives each local process). Every process of
  one launch shares both wherever it runs (another directory, another checkout path, another
  user, another host), so copies of one command meet in one job, a relaunch resumes it, and
  a sweep (the same script with other arguments) gets a job per run. With no script file
  (``python -c``) the digest is of the user, the working directory and the arguments; in a
  notebook, of the user and the working directory (the kernel's own arguments are new at
  every start). Editing the script changes its id (a relaunch after an edit starts a new
  job: set ``STRATA_JOB_ID`` to keep one), and a UUID given as ``--rdzv-id`` is taken for
  one torchrun made up. What it cannot tell apart: two runs of the same script and arguments
  meant as separate (a sweep through environment variables) share one job, and hosts whose
  copies of the script differ (or whose arguments name host-specific paths) get a job each:
  give such runs ``STRATA_JOB_ID``. ``TrainingOrchestrator`` warns when a derived job has
  live workers on more than one host (``launch.py``). Every entry point that is given no job
  id takes this one (``connect``, ``Job``, ``ShardManager``, ``CheckpointManager``,
  ``TrainingOrchestrator``: ``context.JobContext``), so the parts of one script meet in one
  job; it is derived once per process (a later ``os.chdir`` does not change it).
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
from collections.abc import Mapping, Sequence
from pathlib import Path

from .validate import check_id

__all__ = [
    "AGENTS_SUFFIX",
    "JOB_ENV",
    "RESTART_ENV",
    "RUN_ID_ENV",
    "TORCHRUN_DEFAULT_RUN_ID",
    "agents_job",
    "checkpoint_dir",
    "chosen_run_id",
    "derived_job",
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
#: what a torchrun agents' job id adds to the run id (``--rdzv-backend strata``): the agents'
#: rendezvous is a job of its own, never the trainers' (whose default job is the run id)
AGENTS_SUFFIX = ".agents"
#: characters of the host name kept in a worker id
HOST_CHARS = 64
#: characters of the script name kept in a derived job id
SCRIPT_CHARS = 40

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: the random run id torchrun makes up for a --standalone or single-node launch (uuid4)
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
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
    script: str | None = None,
    args: Sequence[str] | None = None,
    cwd: str | None = None,
    user: str | None = None,
) -> str:
    """The job id of a script that names none: ``$STRATA_JOB_ID``, else torchrun's run id
    (unless torchrun made it up), else ``<script>-<8 hex>`` derived from the launch (logged
    once at INFO; see the module doc for why).

    The derived id digests the main script's content and its arguments: every process of
    one launch derives the same one wherever it runs, a relaunch of the same command
    reproduces it (and so resumes the run), another script or other arguments do not.

    Args:
        environ: the variables to read; default ``os.environ``.
        script: the main script's path (default: ``__main__.__file__``, else
            ``sys.argv[0]``), relative paths against ``cwd``.
        args: its arguments (default ``sys.argv[1:]``).
        cwd: the working directory (default: this process's); in the digest only when
            there is no script file to read.
        user: the user name (default: this process's); as ``cwd``.

    Raises:
        ValueError: ``STRATA_JOB_ID`` or ``TORCHELASTIC_RUN_ID`` is not a valid job id.
    """
    env = os.environ if environ is None else environ
    given = env.get(JOB_ENV, "")
    if given:
        return check_id(JOB_ENV, given, job=True)
    run = env.get(RUN_ID_ENV, "").strip()
    if chosen_run_id(run):
        derived = check_id(RUN_ID_ENV, run, job=True)
        if _first_time("job", derived):
            log.info(
                "job id %r (torchrun's %s; set %s to choose one)", derived, RUN_ID_ENV, JOB_ENV
            )
        return derived
    if script is None and args is None and cwd is None and user is None:
        global _launch_job
        with _said_lock:  # this process's launch: derived once, whatever changes later
            if _launch_job is None:
                _launch_job = _derive_job_id(None, None, None, None)
            return _launch_job
    return _derive_job_id(script, args, cwd, user)


def agents_job(run_id: str) -> str:
    """The job of torchrun's agents on ``--rdzv-backend strata`` for run ``run_id``:
    ``<run_id>.agents``, so the trainers' default job (the run id itself) never meets the
    agents' rendezvous.

    Raises:
        ValueError: the result is not a valid job id (too long, braces).
    """
    return check_id("--rdzv-id", run_id + AGENTS_SUFFIX, job=True)


def chosen_run_id(run: str) -> bool:
    """Whether torchrun's run id ``run`` was chosen for the launch (``--rdzv-id``), rather
    than made up by torchrun: empty, its shared default ``none``, or the random UUID it
    gives a ``--standalone`` or single-node launch (a new one at every launch, so a job named
    by it would never be resumed)."""
    return bool(run) and run != TORCHRUN_DEFAULT_RUN_ID and _UUID.fullmatch(run) is None


def derived_job() -> str | None:
    """This process's derived job id (``job_id`` with no arguments), if its default job id
    was derived rather than chosen (``STRATA_JOB_ID``, torchrun's ``--rdzv-id``); else None."""
    with _said_lock:
        return _launch_job


def _main_launch() -> tuple[str, list[str]]:
    """This process's main script and its arguments. A ``__main__`` with no file whose
    ``argv[0]`` is one is an interactive kernel (a notebook: ``ipykernel_launcher.py -f
    kernel-<uuid>.json``): the launcher and its arguments are the kernel's own, new at every
    start, so there is no script and no argument."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if isinstance(main, str) and main:
        return main, list(sys.argv[1:])
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 not in ("", "-", "-c", "-m") and os.path.isfile(argv0):
        return "", []
    return argv0, list(sys.argv[1:])


#: an argument a launcher gives each local process of one launch a different value of
#: (``torch.distributed.launch``, DeepSpeed: ``--local_rank=N`` or ``--local-rank N``)
_PER_PROCESS = re.compile(r"--local[-_]rank(=.*)?")


def _launch_args(args: Sequence[str]) -> list[str]:
    """``args`` without the ones a launcher gives each process of one launch its own value
    of (``_PER_PROCESS``), so those processes derive one job id."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        match = _PER_PROCESS.fullmatch(arg)
        if match:
            skip = match.group(1) is None  # "--local-rank N": its value is the next one
            continue
        out.append(arg)
    return out


def _derive_job_id(
    script: str | None, args: Sequence[str] | None, cwd: str | None, user: str | None
) -> str:
    """``<script>-<8 hex>`` from the launch (``job_id``), logged once."""
    if script is None:
        script, launched = _main_launch()
        args = launched if args is None else args
    args = _launch_args(sys.argv[1:] if args is None else args)
    where = os.getcwd() if cwd is None else cwd
    named = script not in ("", "-", "-c", "-m")
    main = os.path.abspath(os.path.join(where, script)) if named else script
    content: bytes | None = None
    if named:
        try:
            with open(main, "rb") as f:
                content = f.read()
        except OSError:  # not a file (an interpreter's own stand-in): the launch's place
            content = None
    h = hashlib.sha256()
    if content is not None:
        h.update(b"content\0" + hashlib.sha256(content).digest())
        source = f"the content of the script {main!r} and its arguments {args!r}"
    else:
        who = _user() if user is None else user
        h.update("\0".join(("place", who, where, main)).encode())
        source = f"the user, the directory {where!r} and the arguments {args!r} (no script file)"
    for arg in args:
        h.update(b"\0" + arg.encode("utf-8", "surrogateescape"))
    digest = h.hexdigest()[:8]
    stem = _UNSAFE.sub("-", Path(main).stem if named else "").strip("-.")[:SCRIPT_CHARS]
    derived = check_id("job_id", f"{stem.strip('-.') or 'train'}-{digest}", job=True)
    if _first_time("job", derived):
        log.info(
            "job id %r (derived from %s: every process of this command meets in it, wherever "
            "it runs, and a relaunch resumes it; set %s or pass job_id= to choose one)",
            derived, source, JOB_ENV,
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

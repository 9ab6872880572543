"""Default identities: worker ids, job ids and the checkpoint directory never collide by default.

The derivations are checked as functions, and end to end with real worker processes on a real
Redis: two copies of the README loop side by side, a duplicate live id, torchrun's variables.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
import types
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import strata_redis
from strata_redis import identity
from strata_redis.coordination.registry import list_jobs
from strata_redis.validate import check_id

from .procs import wait_for

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
HOST = identity.host_name()

# -- the derivations ---------------------------------------------------------------------------


def test_worker_id_from_torchrun_rank_else_pid() -> None:
    assert identity.worker_id({"RANK": "3"}, host="gpu-a") == "gpu-a-rank-3"
    assert identity.worker_id({"RANK": "3", "LOCAL_RANK": "1"}, host="gpu-a") == "gpu-a-rank-3"
    both = {"GROUP_RANK": "2", "LOCAL_RANK": "5"}
    assert identity.worker_id(both, host="gpu-a") == "gpu-a-group-2-local-5"
    assert identity.worker_id({"LOCAL_RANK": "5"}, host="gpu-a", pid=77) == "gpu-a-pid-77"
    assert identity.worker_id({}, host="gpu-a", pid=77) == "gpu-a-pid-77"
    assert identity.worker_id({}) == f"{HOST}-pid-{os.getpid()}"
    with pytest.raises(ValueError, match=r"RANK must be a non-negative integer.*'x'"):
        identity.worker_id({"RANK": "x"})


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("gpu-a.example.com", "gpu-a.example.com"),
        ("gpu a{1}:x", "gpu-a-1-x"),
        ("héte\tx", "h-te-x"),
        ("", "host"),
        ("---", "host"),
        ("a" * 300, "a" * identity.HOST_CHARS),
    ],
)
def test_host_names_become_valid_ids(host: str, expected: str) -> None:
    assert identity.host_name(host) == expected
    wid = identity.worker_id({"RANK": "0"}, host=host)
    assert check_id("worker_id", wid) == f"{expected}-rank-0"


def test_restart_count_says_whether_to_replace() -> None:
    assert identity.restarted({}) is False
    assert identity.restarted({"TORCHELASTIC_RESTART_COUNT": "0"}) is False
    assert identity.restarted({"TORCHELASTIC_RESTART_COUNT": "2"}) is True
    with pytest.raises(ValueError, match="TORCHELASTIC_RESTART_COUNT"):
        identity.restarted({"TORCHELASTIC_RESTART_COUNT": "-1"})


def test_job_id_given_then_torchrun_then_derived_from_the_launch(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('train')\n")
    launch: dict[str, Any] = {"script": "train.py", "args": [], "cwd": str(tmp_path), "user": "ada"}
    assert identity.job_id({"STRATA_JOB_ID": "run-7", "TORCHELASTIC_RUN_ID": "r"}) == "run-7"
    assert identity.job_id({"TORCHELASTIC_RUN_ID": "elastic-9"}, **launch) == "elastic-9"
    derived = identity.job_id({}, **launch)
    assert re.fullmatch(r"train-[0-9a-f]{8}", derived), derived
    # torchrun's made-up run ids name no job: its shared default, and the random UUID of a
    # --standalone or single-node launch (new at every launch: a relaunch would not resume)
    assert identity.job_id({"TORCHELASTIC_RUN_ID": "none"}, **launch) == derived
    standalone = {"TORCHELASTIC_RUN_ID": "0b7d9c1e-5f7a-4c3e-9d2a-8e1f6a4b3c2d"}
    assert identity.job_id(standalone, **launch) == derived
    assert not identity.chosen_run_id("none") and identity.chosen_run_id("my-job")
    # a relaunch reproduces it (the script by relative or absolute path)
    assert identity.job_id({}, **{**launch, "script": str(tmp_path / "train.py")}) == derived
    # so does a copy of the script elsewhere, run from elsewhere by someone else
    other = tmp_path / "checkout-b"
    other.mkdir()
    (other / "train.py").write_text("print('train')\n")
    copy = {"script": str(other / "train.py"), "args": [], "cwd": "/", "user": "grace"}
    assert identity.job_id({}, **copy) == derived
    # another script, other arguments (a sweep), another content: another job
    (tmp_path / "eval.py").write_text("print('eval')\n")
    (other / "changed.py").write_text("print('train')  # changed\n")
    others = [
        identity.job_id({}, **{**launch, "script": "eval.py"}),
        identity.job_id({}, **{**launch, "args": ["--lr", "0.1"]}),
        identity.job_id({}, **{**launch, "args": ["--lr", "0.01"]}),
        identity.job_id({}, **{**launch, "args": ["--lr 0.1"]}),
        identity.job_id({}, **{**copy, "script": str(other / "changed.py")}),
    ]
    assert len({derived, *others}) == 6, others
    assert others[0].startswith("eval-")
    # no script file (python -c): the user, the directory and the arguments
    c = {**launch, "script": "-c"}
    assert re.fullmatch(r"train-[0-9a-f]{8}", identity.job_id({}, **c))
    assert identity.job_id({}, **{**c, "user": "grace"}) != identity.job_id({}, **c)
    assert identity.job_id({}, **{**c, "args": ["x"]}) != identity.job_id({}, **c)
    (tmp_path / "my {odd} script.py").write_text("")
    assert identity.job_id({}, **{**launch, "script": "my {odd} script.py"}).startswith(
        "my-odd-script-"
    )
    with pytest.raises(ValueError, match="STRATA_JOB_ID"):
        identity.job_id({"STRATA_JOB_ID": "a{b}"})
    with pytest.raises(ValueError, match="TORCHELASTIC_RUN_ID"):
        identity.job_id({"TORCHELASTIC_RUN_ID": "a}b"})


def test_a_launchers_per_process_local_rank_does_not_split_the_job(tmp_path: Path) -> None:
    # torch.distributed.launch and DeepSpeed give each local process its own --local_rank:
    # in the digest it made a one-worker job of each process of one launch
    (tmp_path / "train.py").write_text("print('train')\n")
    launch: dict[str, Any] = {"script": "train.py", "cwd": str(tmp_path), "user": "ada"}
    plain = identity.job_id({}, **launch, args=["--lr", "0.1"])
    for rank in ("0", "1"):
        assert identity.job_id({}, **launch, args=[f"--local_rank={rank}", "--lr", "0.1"]) == plain
        assert identity.job_id({}, **launch, args=["--lr", "0.1", "--local-rank", rank]) == plain
    assert identity.job_id({}, **launch, args=["--lr", "0.2", "--local-rank=0"]) != plain


def test_a_notebook_kernels_own_arguments_do_not_make_a_job_per_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a notebook: __main__ has no file, argv is the kernel launcher and its connection file
    launcher = tmp_path / "ipykernel_launcher.py"
    launcher.write_text("# the kernel\n")
    main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    ids = set()
    for start in ("a1", "b2"):
        monkeypatch.setattr(sys, "argv", [str(launcher), "-f", f"/run/kernel-{start}.json"])
        ids.add(identity._derive_job_id(None, None, str(tmp_path), "ada"))
    assert len(ids) == 1, ids


def test_the_agents_job_is_not_the_run_id() -> None:
    assert (
        identity.agents_job("my-job")
        == "my-job.agents"
        != identity.job_id({"TORCHELASTIC_RUN_ID": "my-job"})
    )
    with pytest.raises(ValueError, match="--rdzv-id"):
        identity.agents_job("x" * 300)


def test_derived_ids_are_logged_once_at_info(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    launch: dict[str, Any] = {"script": "once.py", "args": [], "cwd": str(tmp_path), "user": "a"}
    with caplog.at_level(logging.INFO, logger="strata_redis.identity"):
        wids = {identity.worker_id({}, host="log-once", pid=4242) for _ in range(3)}
        jobs = {identity.job_id({}, **launch) for _ in range(3)}
        given = identity.job_id({"STRATA_JOB_ID": "chosen"})
    ((wid,), (job,)) = wids, jobs
    assert given == "chosen"
    for value in (wid, job):
        told = [r for r in caplog.records if repr(value) in r.getMessage()]
        assert len(told) == 1 and told[0].levelno == logging.INFO, caplog.text
    assert "chosen" not in caplog.text  # the user's own choice needs no word


def test_checkpoint_dir_is_per_user_and_persistent(tmp_path: Path) -> None:
    home, xdg = str(tmp_path / "home"), str(tmp_path / "xdg")
    assert (
        identity.checkpoint_dir({"HOME": home}) == f"{home}/.local/share/strata_redis/checkpoints"
    )
    assert identity.checkpoint_dir({"HOME": home, "XDG_DATA_HOME": xdg}) == (
        f"{xdg}/strata_redis/checkpoints"
    )
    # the XDG spec: a relative XDG_DATA_HOME is invalid and ignored
    assert identity.checkpoint_dir({"HOME": home, "XDG_DATA_HOME": "rel"}).startswith(home)


def test_the_default_checkpoint_directory_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}
    with caplog.at_level(logging.INFO, logger="strata_redis.identity"):
        first = strata_redis.storage_from_env(env)
        again = strata_redis.storage_from_env(env)
        chosen = strata_redis.storage_from_env({**env, "LOCAL_STORAGE_PATH": str(tmp_path)})
    assert isinstance(first, strata_redis.LocalStorage) and isinstance(
        again, strata_redis.LocalStorage
    )
    assert first.root == again.root == str(tmp_path / "data" / "strata_redis" / "checkpoints")
    assert isinstance(chosen, strata_redis.LocalStorage) and chosen.root == str(tmp_path)
    told = [r for r in caplog.records if first.root in r.getMessage()]
    assert len(told) == 1 and told[0].levelno == logging.WARNING, caplog.text


# -- real processes ----------------------------------------------------------------------------

#: one worker process: the orchestrator with the kwargs of argv[1]; it prints what it is (or
#: the WorkerExistsError it got) as JSON, then trains ``epochs`` epochs, logging each batch
WORKER = """
import json, os, sys, time
import strata_redis

cfg = json.loads(sys.argv[1])
try:
    orch = strata_redis.TrainingOrchestrator(os.environ["STRATA_REDIS_URL"], **cfg["kwargs"])
except strata_redis.errors.WorkerExistsError as exc:
    print(json.dumps({"error": str(exc), "host": exc.holder_host, "pid": exc.holder_pid}),
          flush=True)
    sys.exit(3)
except strata_redis.WorkerError as exc:
    print(json.dumps({"error": type(exc).__name__ + ": " + str(exc)}), flush=True)
    sys.exit(4)
print(json.dumps({"worker_id": orch.worker_id, "job_id": orch.job_id, "pid": os.getpid()}),
      flush=True)
log = open(cfg["log"], "a")
try:
    with orch:
        shards = orch.get_shards(cfg.get("dataset", "ds"), batch_size=cfg.get("batch", 10))
        for epoch in range(orch.epoch, cfg.get("epochs", 1)):
            for step, batch in enumerate(shards):
                time.sleep(cfg.get("sleep", 0.05))
                log.write(f"{epoch} {' '.join(map(str, batch.tolist()))}\\n")
                log.flush()
            orch.advance_epoch()
except strata_redis.StrataError as exc:
    print(json.dumps({"error": type(exc).__name__ + ": " + str(exc)}), flush=True)
    sys.exit(5)
"""


def _env(redis_url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STRATA_", "TORCHELASTIC_"))}
    for var in ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_STORAGE_PATH", "STORAGE_BACKEND",
                "XDG_DATA_HOME"):  # fmt: skip
        env.pop(var, None)
    env.update(
        STRATA_REDIS_URL=redis_url, HOME=str(tmp_path / "home"),
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), **extra,
    )  # fmt: skip
    return env


def _start(
    tmp_path: Path, env: dict[str, str], name: str, **cfg: Any
) -> tuple[subprocess.Popen[str], Path]:
    script = tmp_path / "worker.py"
    if not script.exists():
        script.write_text(WORKER)
    log = tmp_path / f"{name}.log"
    cfg = {"log": str(log), "kwargs": {}, **cfg}
    proc = subprocess.Popen(
        [sys.executable, str(script), json.dumps(cfg)], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return proc, log


def _hello(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The first line the worker prints: what it is, or the error it got."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"the worker printed nothing; stderr: {proc.communicate(30)[1]}")
    out: dict[str, Any] = json.loads(line)
    return out


def _batches(log: Path) -> list[tuple[int, list[int]]]:
    if not log.exists():
        return []
    rows = [line.split() for line in log.read_text().splitlines()]
    return [(int(r[0]), [int(x) for x in r[1:]]) for r in rows]


def _readme_loop() -> str:
    """The README's training loop, recording each batch it trains (one line added), and
    dying at once (``os._exit``) before the batch of ``$STOP_AT`` (``"<epoch> <step>"``),
    its checkpoints in flight committed first: a crash after a checkpoint."""
    examples = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    (loop,) = [e for e in examples if "orchestrator.advance_epoch()" in e and "epoch in" in e]
    anchor = "        time.sleep(0.1)\n"
    assert "TrainingOrchestrator(coordinator_url=REDIS)" in loop and anchor in loop, loop
    record = (
        f"{anchor}        if os.environ.get('STOP_AT') == f'{{epoch}} {{step}}':\n"
        "            orchestrator.wait_for_checkpoints(60)\n"
        "            os._exit(3)\n"
        "        open(os.environ['SAMPLES_LOG'], 'a').write("
        "f\"{epoch} {' '.join(map(str, batch.tolist()))}\\n\")\n"
    )
    return loop.replace(anchor, record)


def test_two_readme_loops_side_by_side_both_train(redis_url: str, tmp_path: Path) -> None:
    """The README loop started twice, 0.2 s apart, with no worker id, job id or storage:
    two workers of one derived job; each epoch's samples split between them, none twice;
    the checkpoints land in the per-user directory, which each process names once."""
    script = tmp_path / "train.py"
    script.write_text(_readme_loop())
    procs = []
    for name in ("first", "second"):
        env = _env(redis_url, tmp_path, SAMPLES_LOG=str(tmp_path / f"{name}.log"))
        procs.append(
            subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )  # fmt: skip
        # close together: the loop's first round stays open 3 s (last_call) after the first
        # join, and the second interpreter's start-up must fit in it on a loaded machine
        time.sleep(0.2)
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err

    job = identity.job_id({}, script=str(script), args=[])
    assert re.fullmatch(r"train-[0-9a-f]{8}", job)
    client = strata_redis.connect(redis_url, job_id=job)
    try:
        assert list_jobs(client.client) == [job]
        workers = client.workers()
    finally:
        client.close()
    # one id per process, from its pid; both closed cleanly (none was replaced)
    assert [(w.worker_id, w.pid, w.status) for w in workers] == sorted(
        (f"{HOST}-pid-{p.pid}", p.pid, "left") for p in procs
    )

    logs = [_batches(tmp_path / f"{name}.log") for name in ("first", "second")]
    for epoch in (0, 1):
        mine = [Counter(s for e, b in log if e == epoch for s in b) for log in logs]
        assert all(mine), f"epoch {epoch}: a worker trained nothing: {[len(m) for m in mine]}"
        together = mine[0] + mine[1]
        assert together == Counter(range(640)), f"epoch {epoch}: not each sample exactly once"

    ckpts = tmp_path / "home" / ".local" / "share" / "strata_redis" / "checkpoints" / job
    assert sorted(p.name for p in (ckpts / "checkpoints").iterdir()), "no checkpoint saved"
    for _, err in outs:
        warned = [line for line in err.splitlines() if "strata_redis/checkpoints" in line
                  and line.startswith("WARNING")]  # fmt: skip
        assert len(warned) == 1 and "per-user default" in warned[0], err


def test_a_duplicate_live_id_is_refused_and_the_holder_keeps_training(
    redis_url: str, tmp_path: Path
) -> None:
    """An explicit worker_id that a live process holds: WorkerExistsError naming that
    process's host and pid; the holder is untouched and trains its epochs to the end."""
    ds = strata_redis.ShardManager(redis_url, job_id="dup")
    ds.register_dataset_params("ds", 600, 20, True, 1)
    env = _env(redis_url, tmp_path, STRATA_JOB_ID="dup")
    kwargs = {"worker_id": "trainer", "checkpoint_path": str(tmp_path / "ckpt")}
    holder, holder_log = _start(tmp_path, env, "holder", kwargs=kwargs, epochs=3, sleep=0.05)
    hello = _hello(holder)
    assert hello["worker_id"] == "trainer" and hello["job_id"] == "dup"
    wait_for(lambda: len(_batches(holder_log)) >= 3, 30, why=lambda: holder.poll())
    generation = ds.job.membership_generation()

    second, _ = _start(tmp_path, env, "second", kwargs=kwargs)
    refused = _hello(second)
    _, err = second.communicate(timeout=30)
    assert second.returncode == 3, err
    assert (refused["host"], refused["pid"]) == (socket.gethostname(), holder.pid)
    assert re.search(
        rf"worker 'trainer' of job 'dup' is already registered and alive, held by process "
        rf"{holder.pid} on host '{re.escape(socket.gethostname())}'.*replace=True",
        refused["error"],
    ), refused["error"]
    assert ds.job.membership_generation() == generation  # nothing was written

    trained = len(_batches(holder_log))
    wait_for(lambda: len(_batches(holder_log)) > trained, 30, why=lambda: holder.poll())
    (info,) = [w for w in ds.job.workers() if w.worker_id == "trainer"]
    assert info.status in ("idle", "training") and info.pid == holder.pid
    out, err = holder.communicate(timeout=120)
    assert holder.returncode == 0, out + err
    for epoch in range(3):  # the holder trained every epoch to its end
        samples = Counter(s for e, b in _batches(holder_log) if e == epoch for s in b)
        assert samples == Counter(range(600)), epoch
    ds.job.close()


def test_torchrun_variables_give_ids_and_the_restart_takes_over(
    redis_url: str, tmp_path: Path
) -> None:
    """RANK and TORCHELASTIC_RUN_ID give the ids; a second process of the same rank is
    refused, unless TORCHELASTIC_RESTART_COUNT says it is torchrun's restart of that rank:
    then it takes the id over (and the old process learns it was replaced)."""
    strata_redis.ShardManager(redis_url, job_id="elastic-7").register_dataset_params(
        "ds", 2000, 20, True, 1
    )
    rank3 = {"RANK": "3", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "elastic-7"}
    kwargs = {"checkpoint_path": str(tmp_path / "ckpt"), "heartbeat_timeout": 2.0}
    first_env = _env(redis_url, tmp_path, TORCHELASTIC_RESTART_COUNT="0", **rank3)
    first, first_log = _start(tmp_path, first_env, "first", kwargs=kwargs, sleep=0.05)
    hello = _hello(first)
    assert hello == {"worker_id": f"{HOST}-rank-3", "job_id": "elastic-7", "pid": first.pid}
    wait_for(lambda: len(_batches(first_log)) >= 2, 30, why=lambda: first.poll())

    twin, _ = _start(tmp_path, first_env, "twin", kwargs=kwargs)  # not a restart: refused
    refused = _hello(twin)
    _, err = twin.communicate(timeout=30)
    assert twin.returncode == 3 and refused["pid"] == first.pid, (refused, err)

    restart_env = _env(redis_url, tmp_path, TORCHELASTIC_RESTART_COUNT="1", **rank3)
    restarted, restarted_log = _start(tmp_path, restart_env, "restarted", kwargs=kwargs)
    hello = _hello(restarted)
    assert hello == {"worker_id": f"{HOST}-rank-3", "job_id": "elastic-7", "pid": restarted.pid}
    out, _ = first.communicate(timeout=60)  # the replaced process stops with an error
    assert first.returncode == 5 and "replaced" in out, out
    out, err = restarted.communicate(timeout=120)
    assert restarted.returncode == 0, out + err
    assert _batches(restarted_log)
    job = strata_redis.connect(redis_url, job_id="elastic-7")
    try:
        events = [e["type"] for e in job.events() if e["worker"] == f"{HOST}-rank-3"]
        assert events[:2] == ["join", "replace"], events
    finally:
        job.close()


#: the seeds' order in one script, with no job id anywhere: register the dataset with a
#: ShardManager, then run the loop (the working directory changes in between: the default
#: is the process's, derived once)
SEEDS_ORDER = """
import logging, os, sys
import strata_redis

logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
REDIS = os.environ["STRATA_REDIS_URL"]
sm = strata_redis.ShardManager(REDIS)
sm.register_dataset_params(name="ds", total_samples=40, samples_per_shard=10, shuffle=False,
                           seed=0)
os.chdir(sys.argv[1])
with strata_redis.TrainingOrchestrator(REDIS, min_workers=1, max_workers=1,
                                       checkpoint_path=sys.argv[1]) as orch:
    assert orch.job_id == sm.job.job_id, (orch.job_id, sm.job.job_id)
    trained = sorted(s for batch in orch.get_shards("ds", batch_size=10) for s in batch.tolist())
    assert trained == list(range(40)), trained
    print(orch.job_id, flush=True)
sm.job.close()
"""


def test_shard_manager_then_orchestrator_share_the_default_job(
    redis_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "seeds.py"
    script.write_text(SEEDS_ORDER)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run(
        [sys.executable, str(script), str(elsewhere)], cwd=tmp_path,
        env=_env(redis_url, tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job = identity.job_id({}, script=str(script), args=[str(elsewhere)])
    assert proc.stdout.split() == [job]
    # chosen once, said once, with why
    told = [
        line for line in proc.stderr.splitlines() if line.startswith("strata_redis.identity job id")
    ]
    assert len(told) == 1 and repr(job) in told[0] and "derived from" in told[0], proc.stderr
    client = strata_redis.connect(redis_url, job_id=job)
    try:
        assert list_jobs(client.client) == [job]
    finally:
        client.close()


# -- one job per launch, wherever it runs (issue 36, 1 and 2) ----------------------------------

#: the loop's start line, as the README's logging.basicConfig prints it
START = re.compile(
    r"^INFO:strata_redis\.orchestrator:job '(?P<job>[^']+)', worker '(?P<worker>[^']+)': "
    r"rank (?P<rank>\d+) of (?P<world>\d+); checkpoints go to (?P<where>\S+); (?P<how>.*)$",
    re.M,
)


def _start_line(err: str) -> dict[str, str]:
    (line,) = [m.groupdict() for m in START.finditer(err)]
    return line


def _run_loops(
    redis_url: str, tmp_path: Path, launches: list[tuple[Path, Path, list[str]]]
) -> list[str]:
    """Start the README loop once per (script, directory, arguments), 0.2 s apart; wait for
    all; each must exit 0. Returns their stderr."""
    procs = []
    for n, (script, cwd, args) in enumerate(launches):
        env = _env(redis_url, tmp_path, SAMPLES_LOG=str(tmp_path / f"{n}.log"))
        procs.append(
            subprocess.Popen([sys.executable, str(script), *args], cwd=cwd, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )  # fmt: skip
        time.sleep(0.2)  # within the first round's 3 s last call (see the test above)
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    return [err for _, err in outs]


def test_copies_of_one_script_in_two_directories_are_one_job(
    redis_url: str, tmp_path: Path
) -> None:
    """Two copies of the README loop, at two paths, each started from its own directory (two
    checkouts, as on two hosts): one job of two workers, each epoch's samples split between
    them, none twice; each process's first line names that job and its rank of 2.

    Before the fix the job id digested the script's path and the directory: two one-worker
    jobs, each training the whole dataset."""
    launches = []
    for name in ("checkout-a", "elsewhere/checkout-b"):
        home = tmp_path / name
        home.mkdir(parents=True)
        (home / "train.py").write_text(_readme_loop())
        launches.append((home / "train.py", home, []))
    errs = _run_loops(redis_url, tmp_path, launches)
    job = identity.job_id({}, script=str(launches[0][0]), args=[])
    client = strata_redis.connect(redis_url, job_id=job)
    try:
        assert list_jobs(client.client) == [job]
        assert len(client.workers()) == 2
    finally:
        client.close()
    lines = [_start_line(err) for err in errs]
    assert {line["job"] for line in lines} == {job}
    assert sorted((line["rank"], line["world"]) for line in lines) == [("0", "2"), ("1", "2")]
    assert all(line["how"] == "fresh: no checkpoint to resume from, epoch 0" for line in lines)
    assert all(line["where"].endswith(f"/strata_redis/checkpoints/{job}/checkpoints/")
               for line in lines)  # fmt: skip
    logs = [_batches(tmp_path / f"{n}.log") for n in range(2)]
    for epoch in (0, 1):
        mine = [Counter(s for e, b in log if e == epoch for s in b) for log in logs]
        assert all(mine), f"epoch {epoch}: a worker trained nothing"
        assert mine[0] + mine[1] == Counter(range(640)), f"epoch {epoch}: not each sample once"


def test_a_sweep_over_arguments_is_a_job_per_run(redis_url: str, tmp_path: Path) -> None:
    """The same script started twice with other arguments (a sweep, meant as two runs): two
    jobs, each training every sample of each epoch, and each process's first line says
    ``rank 0 of 1`` in its own job."""
    script = tmp_path / "train.py"
    script.write_text(_readme_loop())
    sweep = [["--lr", "0.1"], ["--lr", "0.01"]]
    errs = _run_loops(redis_url, tmp_path, [(script, tmp_path, args) for args in sweep])
    jobs = [identity.job_id({}, script=str(script), args=args) for args in sweep]
    assert len(set(jobs)) == 2
    client = strata_redis.connect(redis_url, job_id=jobs[0])
    try:
        assert list_jobs(client.client) == sorted(jobs)
    finally:
        client.close()
    lines = [_start_line(err) for err in errs]
    assert [(line["job"], line["rank"], line["world"]) for line in lines] == [
        (job, "0", "1") for job in jobs
    ]
    for n in range(2):
        log = _batches(tmp_path / f"{n}.log")
        for epoch in (0, 1):
            assert Counter(s for e, b in log if e == epoch for s in b) == Counter(range(640))


#: the loop's constructor, no more: its first lines (INFO and up) on stderr
HELLO = """
import logging, os
import strata_redis

logging.basicConfig(level=logging.INFO)
strata_redis.TrainingOrchestrator(os.environ["STRATA_REDIS_URL"], last_call=0.1).close()
"""


def test_a_derived_job_with_workers_on_another_host_is_said_loudly(
    redis_url: str, tmp_path: Path
) -> None:
    """A derived job id meets every host that runs the same script and arguments, and
    cannot tell whether that is meant: a process whose derived job has a live worker on
    another host warns, naming the hosts and STRATA_JOB_ID; a chosen id does not."""
    script = tmp_path / "hello.py"
    script.write_text(HELLO)
    job = identity.job_id({}, script=str(script), args=[])
    there = strata_redis.connect(redis_url, job_id=job)
    other = there.register_worker(worker_id="gpu-b-pid-7", host="gpu-b")  # heartbeating
    try:
        run = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, env=_env(redis_url, tmp_path),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert _start_line(run.stderr)["job"] == job
        (warned,) = [line for line in run.stderr.splitlines() if line.startswith("WARNING")
                     and "other hosts" in line]  # fmt: skip
        assert f"job {job!r} was derived" in warned and "(gpu-b)" in warned, warned
        assert "Set STRATA_JOB_ID" in warned, warned

        chosen = strata_redis.connect(redis_url, job_id="chosen")
        chosen.register_worker(worker_id="gpu-b-pid-8", host="gpu-b")
        run = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path,
            env=_env(redis_url, tmp_path, STRATA_JOB_ID="chosen"),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert _start_line(run.stderr)["job"] == "chosen"
        assert "other hosts" not in run.stderr, run.stderr
        chosen.close()
    finally:
        other.deregister()
        there.close()


# -- the README loop resumes as written (issue 36, 2) ------------------------------------------


def test_the_readme_loop_relaunched_after_a_resume_trains_the_epochs_it_names(
    redis_url: str, tmp_path: Path
) -> None:
    """The README loop dies in epoch 1 right after its checkpoint at step 0 committed; the
    same command relaunched resumes from it and trains the rest of epoch 1, and no epoch
    more: the loop names two. Its first line says where it resumed from.

    Before ``orchestrator.epochs(2)`` the README's ``range(2)`` relaunched trained two more
    epochs (the job's 1 and 2), recorded as the loop's 0 and 1, and only warned."""
    script = tmp_path / "train.py"
    script.write_text(_readme_loop())
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    env = _env(redis_url, tmp_path, SAMPLES_LOG=str(first_log), STOP_AT="1 1")
    first = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert first.returncode == 3, first.stderr  # the crash, after step 0 of epoch 1 committed
    assert _start_line(first.stderr)["how"] == "fresh: no checkpoint to resume from, epoch 0"
    env = _env(redis_url, tmp_path, SAMPLES_LOG=str(second_log))
    second = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert second.returncode == 0, second.stderr
    line = _start_line(second.stderr)
    assert (line["rank"], line["world"]) == ("0", "1")
    assert line["how"] == "resumed from checkpoint epoch_1_step_0 (run 0) at epoch 1", line
    assert "is not the job's epoch" not in second.stderr

    before, after = _batches(first_log), _batches(second_log)
    assert Counter(s for e, b in before if e == 0 for s in b) == Counter(range(640))
    assert {e for e, _ in after} == {1}, sorted({e for e, _ in after})  # epoch 1 only
    # epoch 1: the batch the checkpoint holds, then the rest after the relaunch, each once
    epoch1 = Counter(s for e, b in before if e == 1 for s in b)
    assert sum(epoch1.values()) == 32  # (step 0: one batch of 32)
    assert epoch1 + Counter(s for _, b in after for s in b) == Counter(range(640))
    job = strata_redis.connect(redis_url, job_id=identity.job_id({}, script=str(script), args=[]))
    try:
        assert (
            job.current_epoch() == 2
        )  # the job trained the two epochs the loop names, and no more
    finally:
        job.close()


def test_epochs_runs_from_the_jobs_epoch_and_advances_a_body_that_did_not(
    redis_url: str, tmp_path: Path
) -> None:
    """``epochs(n)`` yields the job's epochs up to ``n - 1``; a body that does not call
    ``advance_epoch()`` gets it called; a job already past ``n - 1`` yields nothing."""
    strata_redis.ShardManager(redis_url, job_id="epochs").register_dataset_params(
        "ds", 40, 10, False, 0
    )
    kwargs: dict[str, Any] = {"job_id": "epochs", "checkpoint_path": str(tmp_path),
                              "last_call": 0.1}  # fmt: skip
    with strata_redis.TrainingOrchestrator(redis_url, **kwargs) as orch:
        shards = orch.get_shards("ds", batch_size=10)
        seen = []
        for epoch in orch.epochs(2):
            seen.append((epoch, sum(len(b) for b in shards)))
        assert seen == [(0, 40), (1, 40)] and orch.epoch == 2
        assert list(orch.epochs(2)) == [] and orch.epoch == 2
        with pytest.raises(ValueError, match="count"):
            list(orch.epochs(-1))
        explicit = []
        for epoch in orch.epochs(3):
            explicit.append(epoch)
            orch.advance_epoch()  # written out, as in the README: advanced once, not twice
        assert explicit == [2] and orch.epoch == 3

"""``strata status`` (text, --json, --watch), ``strata dashboard`` and its --demo, as real
subprocesses; the plain-text help; the dashboard in docker-compose.yml."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import psutil
import pytest
import yaml

import strata_redis
from strata_redis.dashboard.app import schema_text
from strata_redis.server import RedisClusterServers, RedisServer

from .procs import Output, wait_for

ROOT = Path(__file__).resolve().parent.parent


def _ctrl_c_works() -> None:
    # A runner started in the background (nohup, `cmd &` in a script) ignores SIGINT, and
    # its children inherit that: give the command under test the terminal's default back.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen(*args: str, **kwargs: Any) -> subprocess.Popen[str]:
    """``strata <args>`` as a subprocess that Ctrl-C (SIGINT) stops, as in a terminal."""
    return subprocess.Popen(
        [sys.executable, "-m", "strata_redis", *args], text=True, preexec_fn=_ctrl_c_works,
        **kwargs,
    )  # fmt: skip


def _ctrl_c(proc: subprocess.Popen[str], timeout: float) -> None:
    """Ctrl-C, then wait; a process that does not stop is killed (and the test fails)."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)
        raise


def _close(proc: subprocess.Popen[str]) -> None:
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def stop(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    """Ctrl-C (``_ctrl_c``); what it printed after what the test read."""
    try:
        _ctrl_c(proc, timeout)
    finally:
        rest = proc.stdout.read() if proc.stdout else ""
        _close(proc)
    return rest


def interrupt(proc: subprocess.Popen[str], out: Output) -> tuple[str, str]:
    """Ctrl-C (``_ctrl_c``); once the process exits, what it printed (read by ``out``) and
    its stderr."""
    try:
        _ctrl_c(proc, 30)
        printed = out.join()  # to the end of the pipe, before it is closed under the reader
    finally:
        stderr = proc.stderr.read() if proc.stderr else ""
        _close(proc)
    return printed, stderr


def output(proc: subprocess.Popen[str]) -> Output:
    """``proc``'s stdout (a pipe), read as it comes."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    return Output(lambda: os.read(fd, 65536))


def strata(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strata_redis", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture
def busy_job(redis_url: str, job_id: str, tmp_path: Path) -> Iterator[strata_redis.Job]:
    """Workers, a dataset mid-epoch, barrier releases, a committed checkpoint."""
    # worker-01 beats once, here: the job's heartbeat timeout (stored by its first
    # registration, and what `strata status` judges staleness by) is long, so the work below
    # and a CLI started on a loaded machine never see it stale
    with strata_redis.connect(redis_url, job_id, heartbeat_timeout=600) as job:
        w = job.register_worker("worker-01", host="gpu-a", address="10.0.0.5:29500",
                                gpu_count=8, heartbeat_interval=None)  # fmt: skip
        w.set_status("training")
        job.register_worker("worker-02", heartbeat_interval=None).deregister()
        strata_redis.ShardManager(job).register_dataset_params("images", 1000, 10, True, 42)
        leases = job.leases("images", 0, "worker-01")
        for _ in range(25):
            lease = leases.acquire()
            assert lease is not None
            lease.complete()
        for _ in range(3):
            job.barrier("sync", expected=1).wait("worker-01")
        job.barrier_latencies()  # flush the latency records
        with strata_redis.CheckpointManager(tmp_path, redis=job, worker_id="worker-01") as ckpt:
            ckpt.save(b"x" * 1_500_000, step=700, epoch=0).result()
        yield job


def test_status_shows_the_pages_views(busy_job: strata_redis.Job, redis_url: str) -> None:
    out = strata("status", "--redis-url", redis_url, "--job", busy_job.job_id)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    lines = text.splitlines()
    assert "membership generation 3, 1 live of 2 workers; epoch 0" in lines[0]
    assert "1 training, 0 checkpointing, 0 idle; 0 failed and 1 left in the last 10 min" in text
    assert "(MB/s = all ranks' bytes ÷ the slowest rank's save seconds)" in text
    assert re.search(r"barrier release latency: p50 [\d.]+ ms, p99 [\d.]+ ms", text), text
    dataset = next(line for line in lines if line.startswith("images"))
    assert dataset.split()[1:6] == ["0", "25", "0", "75", "100"] and "25.0%" in dataset
    checkpoint = next(line for line in lines if line.split()[:2] == ["0", "700"])  # epoch, step
    assert "committed" in checkpoint and "1.5 MB" in checkpoint and "1/1" in checkpoint
    row = next(line for line in lines if line.startswith("worker-01"))
    assert row.split()[:2] == ["worker-01", "training"] and "10.0.0.5:29500" in row
    assert next(line for line in lines if line.startswith("worker-02")).split()[1] == "left"


def test_status_counts_a_failure_of_the_window_after_a_rejoin(
    job: strata_redis.Job, redis_url: str
) -> None:
    """A worker declared failed that registered again since is no longer failed now, but
    its failure lies in the window: `strata status` and the API count it, as the event feed
    beside them lists it."""
    # The job's timeout (stored by its first registration; `strata status` judges staleness
    # by it) is long, so the rejoined worker, which never beats again, cannot read stale
    # before the CLI has started on a loaded machine; `job` reaps with its own 2 s.
    with strata_redis.connect(redis_url, job.job_id, heartbeat_timeout=600) as first:
        first.register_worker("w-back", heartbeat_interval=None)
        wait_for(lambda: job.reap() == ["w-back"], 10)
        first.register_worker("w-back", heartbeat_interval=None)  # rejoins: idle now
    assert {w.worker_id: w.status for w in job.workers()}["w-back"] == "idle"
    out = strata("status", "--redis-url", redis_url, "--job", job.job_id)
    assert out.returncode == 0, out.stderr
    assert "0 training, 0 checkpointing, 1 idle; 1 failed and 0 left in the last 10 min" in (
        " ".join(out.stdout.split())
    ), out.stdout
    doc = json.loads(strata("status", "--redis-url", redis_url, "--job", job.job_id,
                            "--json").stdout)  # fmt: skip
    (m,) = doc["metrics"]["jobs"]
    assert m["recent"] == {"window_s": 600.0, "failed": 1, "left": 0, "complete": True}
    assert m["workers"]["failed"] == 0  # by status now: the count the tile used to show
    assert [(e["type"], e["worker_id"]) for e in doc["events"]][-3:] == [
        ("join", "w-back"),
        ("fail", "w-back"),
        ("join", "w-back"),
    ]


def test_status_json_is_the_api_document(busy_job: strata_redis.Job, redis_url: str) -> None:
    out = strata("status", "--redis-url", redis_url, "--job", busy_job.job_id, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    jsonschema.validate(doc, json.loads(schema_text()))
    assert doc["job"] == busy_job.job_id and (
        doc["checkpoints"][0]["epoch"],
        doc["checkpoints"][0]["step"],
    ) == (0, 700)
    every = json.loads(strata("status", "--redis-url", redis_url, "--json").stdout)
    assert [j["job_id"] for j in every["jobs"]] == [busy_job.job_id]


def _watch_two_frames(
    redis_url: str, job_id: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str, str]:
    """``strata status --watch 0.5`` on a pseudo-terminal until it drew two frames (each ends
    with its footer, however long the start took), then Ctrl-C: the process, its output."""
    main, tty = pty.openpty()
    proc = popen("status", "--redis-url", redis_url, "--job", job_id, "--watch", "0.5",
                 stdout=tty, stderr=subprocess.PIPE, env=env)  # fmt: skip
    os.close(tty)
    out = Output(lambda: os.read(main, 65536))  # EIO once the process exits
    try:
        wait_for(lambda: out.text().count("Ctrl-C stops") >= 2, 30, why=out.text)
    finally:
        try:
            stdout, stderr = interrupt(proc, out)
        finally:
            os.close(main)
    return proc, stdout, stderr


def test_status_watch_refreshes_in_place(busy_job: strata_redis.Job, redis_url: str) -> None:
    """On a terminal (a pseudo-terminal here) each frame is drawn from the top."""
    proc, stdout, stderr = _watch_two_frames(redis_url, busy_job.job_id)
    assert proc.returncode == 0, stderr
    frames = stdout.split("\x1b[H")
    assert len(frames) >= 3, stdout  # refreshed, each frame drawn from the top
    assert all("membership generation 3" in frame for frame in frames[1:])
    assert "Traceback" not in stderr


def test_status_watch_into_a_pipe_has_no_terminal_codes(
    busy_job: strata_redis.Job, redis_url: str
) -> None:
    proc = popen("status", "--redis-url", redis_url, "--job", busy_job.job_id, "--watch",
                 "0.5", stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    out = output(proc)
    try:
        wait_for(lambda: out.text().count("membership generation 3") >= 3, 30, why=out.text)
    finally:
        stdout, stderr = interrupt(proc, out)
    assert proc.returncode == 0, stderr
    assert "\x1b" not in stdout
    assert stdout.count("membership generation 3") >= 3, stdout


def test_status_watch_rides_out_a_redis_outage(redis_factory: Any) -> None:
    """--watch is what an operator keeps open during an outage: it says since when Redis is
    unreachable, keeps trying, and shows the job again once Redis is back."""
    server = redis_factory(aof=True)
    job = strata_redis.connect(server.url, "watched")
    job.register_worker("w1", heartbeat_interval=None)
    job.close()
    proc = popen("status", "--redis-url", server.url, "--job", "watched", "--watch", "0.5",
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    out = output(proc)
    unreachable = "Redis unreachable since "
    try:  # each step once the watcher has shown the last, however long a loaded machine takes
        wait_for(lambda: "job 'watched'" in out.text(), 30, why=out.text)
        server.stop()
        wait_for(lambda: unreachable in out.text(), 30, why=out.text)
        server.start()
        wait_for(lambda: "job 'watched'" in out.text().rpartition(unreachable)[2], 30, why=out.text)
    finally:  # the watcher stops whatever happened above
        stdout, stderr = interrupt(proc, out)
    assert proc.returncode == 0, stderr
    frames = [f for f in stdout.split("\n\n") if f.strip()]
    down = [i for i, f in enumerate(frames) if f.startswith("Redis unreachable since ")]
    assert down, stdout
    assert re.match(r"Redis unreachable since \d\d:\d\d:\d\d; retrying", frames[down[0]])
    assert len({frames[i].split(";")[0] for i in down}) == 1  # the same "since" throughout
    assert any("job 'watched'" in f for f in frames[: down[0]])
    assert any("job 'watched'" in f for f in frames[down[-1] + 1 :]), stdout  # back again
    assert "Traceback" not in stderr


@pytest.mark.parametrize("columns", [80, 60, 160])
def test_status_fits_the_terminal_width(
    busy_job: strata_redis.Job, redis_url: str, columns: int
) -> None:
    """Rows never wrap: at a narrow width the least needed columns go (the address first),
    sentences wrap at words, and nothing is longer than $COLUMNS."""
    out = subprocess.run(
        [sys.executable, "-m", "strata_redis", "status", "--redis-url", redis_url, "--job",
         busy_job.job_id], capture_output=True, text=True, timeout=60,
        env={**os.environ, "COLUMNS": str(columns)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines) <= columns, [x for x in lines if len(x) > columns]
    row = next(line for line in lines if line.startswith("worker-01"))
    assert row.split()[:2] == ["worker-01", "training"]
    header = next(line for line in lines if line.startswith("WORKER"))
    assert ("ADDRESS" in header) == (columns >= 120) and "STATUS" in header
    assert ("10.0.0.5:29500" in row) == (columns >= 120)
    dataset = next(line for line in lines if line.startswith("images"))
    assert dataset.split()[1:3] == ["0", "25"]


def test_status_watch_at_80x24_keeps_its_header_and_cuts_the_worker_table(
    redis_url: str, job_id: str
) -> None:
    """A frame of --watch on a 80x24 terminal is at most 24 lines of at most 80: the header
    first (it used to scroll off every frame), the worker table cut with "… N more workers",
    the footer last; a long shard cell keeps its shard number."""
    with strata_redis.connect(redis_url, job_id, heartbeat_timeout=600) as job:
        strata_redis.ShardManager(job).register_dataset_params(
            "imagenet_train_full", 1000, 10, True, 42
        )
        for n in range(30):
            job.register_worker(f"gpu-node-{n:02d}-rank-{n}", heartbeat_interval=None)
        lease = job.leases("imagenet_train_full", 0, "gpu-node-00-rank-0").acquire()
        assert lease is not None
        proc, stdout, stderr = _watch_two_frames(
            redis_url, job_id, env={**os.environ, "COLUMNS": "80", "LINES": "24"}
        )
    assert proc.returncode == 0, stderr
    frame = stdout.split("\x1b[H")[2].split("Ctrl-C stops)")[0] + "Ctrl-C stops)"
    lines = re.sub(r"\x1b\[[JK]", "", frame).replace("\r", "").split("\n")
    assert len(lines) <= 24 and max(map(len, lines)) <= 80, lines
    assert lines[0].startswith(f"job {job_id!r} (running): membership generation 30"), lines
    assert lines[-1] == "(every 0.5 s; Ctrl-C stops)"
    more = [line for line in lines if re.fullmatch(r"… \d+ (more )?workers not shown", line)]
    assert len(more) == 1, lines
    shown = [line for line in lines if line.startswith("gpu-node-")]
    assert len(shown) + int(re.search(r"\d+", more[0]).group()) == 30, lines
    if shown:  # the shard cell cut at its start: the shard number stays
        assert re.search(rf"…\S*#{lease.shard_id}$", shown[0]), shown[0]


def test_a_cut_shard_cell_keeps_the_shard_number(redis_url: str, job_id: str) -> None:
    with strata_redis.connect(redis_url, job_id, heartbeat_timeout=600) as job:
        strata_redis.ShardManager(job).register_dataset_params(
            "imagenet_train_full_resolution", 1000, 10, True, 42
        )
        job.register_worker("w0", heartbeat_interval=None)
        lease = job.leases("imagenet_train_full_resolution", 0, "w0").acquire()
        assert lease is not None
        out = subprocess.run(
            [sys.executable, "-m", "strata_redis", "status", "--redis-url", redis_url,
             "--job", job_id], capture_output=True, text=True, timeout=60,
            env={**os.environ, "COLUMNS": "80", "LINES": "24"},
        )  # fmt: skip
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("w0 "))
    assert len(row) <= 80 and row.endswith(f"#{lease.shard_id}"), row
    assert row.split()[-1].startswith("…"), row  # cut at its start, where it matters least


def test_watch_waits_for_a_job_not_there_yet(redis_url: str) -> None:
    """--watch started before the job's first worker says it waits, and shows the job once
    it is there (it used to exit at once)."""
    proc = popen("status", "--redis-url", redis_url, "--job", "later", "--watch", "0.5",
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    out = output(proc)
    try:
        wait_for(lambda: "no job 'later'" in out.text(), 30, why=out.text)
        assert "waiting for its first worker" in out.text() and proc.poll() is None
        with strata_redis.connect(redis_url, "later", heartbeat_timeout=600) as job:
            job.register_worker("w0", heartbeat_interval=None)
            wait_for(lambda: "job 'later' (running)" in out.text(), 30, why=out.text)
    finally:
        _, stderr = interrupt(proc, out)
    assert proc.returncode == 0, stderr


def test_watch_of_a_job_that_never_comes_lists_the_jobs_and_fails(redis_url: str) -> None:
    with strata_redis.connect(redis_url, "real-job", heartbeat_timeout=600) as job:
        job.register_worker("w0", heartbeat_interval=None)
    proc = popen("status", "--redis-url", redis_url, "--job", "typo", "--watch", "0.5",
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    out = output(proc)
    try:
        wait_for(lambda: "jobs in this Redis: real-job" in out.text(), 30, why=out.text)
    finally:
        stdout, stderr = interrupt(proc, out)
    assert proc.returncode == 1, (stdout, stderr)
    assert "no job 'typo'" in stderr and "never appeared" in stderr, stderr
    assert "jobs in this Redis: real-job" in stderr, stderr


@pytest.mark.parametrize(
    "command",
    [["status", "--job", "typo"], ["events", "--job", "typo"], ["jobs", "rm", "typo", "--yes"],
     ["status", "--job", "typo", "--json"]],
)  # fmt: skip
def test_an_unknown_job_is_said_with_the_jobs_that_exist(
    redis_url: str, command: list[str]
) -> None:
    for job_id in ("real-a", "real-b"):
        with strata_redis.connect(redis_url, job_id, heartbeat_timeout=600) as job:
            job.register_worker("w0", heartbeat_interval=None)
    out = strata(*command, "--redis-url", redis_url)
    assert out.returncode == 1, out
    assert out.stdout == "", out.stdout
    assert out.stderr.startswith("strata: no job 'typo' in redis://"), out.stderr
    assert "jobs in this Redis: real-a, real-b" in out.stderr, out.stderr


def test_an_unknown_job_in_an_empty_redis(redis_url: str) -> None:
    out = strata("events", "--job", "typo", "--redis-url", redis_url)
    assert out.returncode == 1 and "this Redis holds no strata job" in out.stderr, out


def test_status_json_into_a_closed_pipe_and_version(
    busy_job: strata_redis.Job, redis_url: str
) -> None:
    head = subprocess.run(
        f"{sys.executable} -m strata_redis status --redis-url {redis_url} --json | head -1",
        shell=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert head.stdout == "{\n" and head.stderr == "", head.stderr  # no BrokenPipeError
    out = strata("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"strata {strata_redis.__version__}"


@pytest.mark.parametrize(
    "command",
    [[], ["demo"], ["status"], ["dashboard"], ["doctor"], ["events"], ["jobs"], ["jobs", "rm"]],
)
def test_help_is_plain_text(command: list[str]) -> None:
    out = strata(*command, "--help")
    assert out.returncode == 0, out.stderr
    for markup in ("``", ":class:", ":func:", ":meth:", "`"):
        assert markup not in out.stdout, (markup, out.stdout)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["dashboard", "--port", "70000"], "argument --port: 70000 is not in 0..65535"),
        (["dashboard", "--port", "-1"], "argument --port: -1 is not in 0..65535"),
        (["dashboard", "--threads", "0"], "argument --threads: 0 is not in 1..256"),
        (["dashboard", "--threads", "-1"], "argument --threads: -1 is not in 1..256"),
        (["dashboard", "--heartbeat-timeout", "0"], "--heartbeat-timeout: 0 seconds: it must"),
        (["status", "--watch", "0"], "argument --watch: 0 seconds: it must be above 0"),
        (["status", "--watch", "-1"], "argument --watch: -1 seconds: it must be above 0"),
        (["status", "--watch", "0.2"], "argument --watch: 0.2 seconds: --watch refreshes at"),
        (["status", "--heartbeat-timeout", "nan"], "--heartbeat-timeout: nan seconds"),
        (["status", "--limit", "0"], "argument --limit: 0 is not in 1..100000"),
    ],
)
def test_bad_numbers_are_refused_before_anything_starts(args: list[str], message: str) -> None:
    out = strata(*args)
    assert out.returncode == 2, out
    assert message in out.stderr, out.stderr


def test_status_text_shows_control_characters_as_escapes(
    job: strata_redis.Job, redis_url: str
) -> None:
    """A host name is anyone's text: an escape sequence in it never reaches the terminal."""
    job.register_worker("w1", host="gpu\x1b[2J\x1b]0;pwned\x07", heartbeat_interval=None)
    out = strata("status", "--redis-url", redis_url, "--job", job.job_id)
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    assert "gpu\\x1b[2J" in out.stdout, out.stdout


def test_a_cluster_url_to_a_plain_server_is_one_clear_line(redis_server: RedisServer) -> None:
    url = f"redis+cluster://127.0.0.1:{redis_server.port}"
    out = strata("status", "--redis-url", url)
    assert out.returncode == 2, out
    assert out.stderr.startswith(f"strata: cannot use {url} as a Redis Cluster:"), out.stderr
    assert "Traceback" not in out.stderr


def test_an_unreachable_redis_is_named_with_where_its_url_came_from() -> None:
    env = {**os.environ, "STRATA_REDIS_URL": "redis://127.0.0.1:1/0"}
    out = subprocess.run([sys.executable, "-m", "strata_redis", "status"], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2, out
    assert "cannot reach redis://127.0.0.1:1/0 (from $STRATA_REDIS_URL)" in out.stderr


def test_dashboard_serves_a_redis_cluster(redis_cluster: RedisClusterServers) -> None:
    job = strata_redis.connect(redis_cluster.url, job_id="cluster-dash")
    try:
        job.register_worker("w1", host="gpu-a", heartbeat_interval=None)
        proc, url = _serve("dashboard", "--redis-url", redis_cluster.url, "--port", "0")
        try:
            status, body = _get(url + "api/dashboard?job=cluster-dash")
        finally:
            stop(proc)
        assert status == 200
        assert [w["worker_id"] for w in json.loads(body)["workers"]] == ["w1"]
    finally:
        job.close()


def test_dashboard_refuses_an_open_address_without_a_token(redis_url: str) -> None:
    out = strata("dashboard", "--redis-url", redis_url, "--host", "0.0.0.0", "--port", "0")
    assert out.returncode == 2
    assert "reachable from other machines: set a token" in out.stderr


def test_dashboard_warns_once_when_redis_is_unreachable_at_start_and_serves() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    url = f"redis://user:pa55word@127.0.0.1:{dead}/0"
    seen: list[str] = []
    proc, page = _serve("dashboard", "--redis-url", url, "--port", "0", seen=seen)
    try:
        warnings = [line for line in seen if "warning" in line]
        assert warnings == [
            f"strata dashboard: warning: Redis at redis://127.0.0.1:{dead}/0 is unreachable "
            f"(Error 111 connecting to 127.0.0.1:{dead}. Connection refused.); serving anyway: "
            "the page shows a banner until Redis answers\n"
        ], seen
        assert _get(page + "healthz") == (200, b"ok\n")
        status, body = _get(page + "api/dashboard")
        assert status == 503
        reply = json.loads(body)
        assert reply["redis"] == f"redis://127.0.0.1:{dead}/0" and reply["last_read_ms"] is None
        assert abs(reply["redis_down_since_ms"] / 1000 - time.time()) < 60
    finally:
        rest = stop(proc)
    assert "pa55word" not in "".join(seen) + rest and "Traceback" not in rest
    assert sum("warning" in line for line in [*seen, *rest.splitlines()]) == 1


def test_dashboard_on_a_busy_port_names_it_and_suggests_port_0(redis_url: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        out = strata("dashboard", "--redis-url", redis_url, "--port", str(port))
    assert out.returncode == 2, out
    assert out.stderr == (
        f"strata: cannot serve the dashboard: 127.0.0.1:{port} is already in use; pick another "
        "with --port N, or --port 0 for a free one\n"
    )
    assert "Traceback" not in out.stderr and out.stdout == ""


def _serve(
    *args: str, env: dict[str, str] | None = None, seen: list[str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    proc = popen(*args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    seen = [] if seen is None else seen
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        match = re.search(r"http://127\.0\.0\.1:\d+/", line)
        if match and ("serving" in line or line.startswith("dashboard:")):
            return proc, match.group(0)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    proc.wait(15)
    proc.stdout.close()
    raise AssertionError(f"no URL from strata {' '.join(args)}: {seen}")


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.read()


def _closed(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_dashboard_serves_with_a_token_and_stops_on_ctrl_c(
    busy_job: strata_redis.Job, redis_url: str, tmp_path: Path
) -> None:
    token = "a-long-enough-token-1234"
    (tmp_path / "token").write_text(token + "\n")
    proc, url = _serve("dashboard", "--redis-url", redis_url, "--port", "0",
                       "--token-file", str(tmp_path / "token"))  # fmt: skip
    try:
        assert _get(f"{url}api/dashboard")[0] == 401
        status, body = _get(f"{url}api/dashboard", token)
        assert status == 200 and json.loads(body)["jobs"][0]["job_id"] == busy_job.job_id
        assert _get(f"{url}healthz")[0] == 200
    finally:
        stop(proc, 30)
    assert proc.returncode == 0
    assert _closed(int(url.rsplit(":", 1)[1].strip("/")))


@pytest.mark.timeout(180)
def test_demo_starts_serves_and_stops_cleanly() -> None:
    proc, url = _serve("dashboard", "--demo", "--port", "0", "--workers", "3")
    descendants: list[Any] = []
    try:
        assert proc.stdout is not None

        def moving() -> bool:
            status, body = _get(f"{url}api/dashboard")
            doc = json.loads(body) if status == 200 else {}
            return (
                bool(doc)
                and doc["jobs"][0]["live_workers"] == 3
                and (doc["datasets"][0]["progress"]["done"] > 0)
            )

        wait_for(moving, 90, step=0.5)
        status, body = _get(f"{url}metrics")
        assert status == 200 and b'strata_workers{job_id="demo",status="training"}' in body
        descendants = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(" ".join(p.cmdline()) for p in descendants)
        assert "redis-server" in names and names.count("multiprocessing.spawn") >= 3, names
        redis_port = next(
            c.laddr.port for p in descendants if "redis-server" in " ".join(p.cmdline())
            for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN
        )  # fmt: skip
    finally:
        rest = stop(proc)  # Ctrl-C
    assert proc.returncode == 0, rest
    assert "demo: stopped" in rest
    _gone, alive = psutil.wait_procs(descendants, timeout=20)
    assert not alive, f"orphans left running: {[(p.pid, p.cmdline()) for p in alive]}"
    assert _closed(int(url.rsplit(":", 1)[1].strip("/"))) and _closed(redis_port)


def test_compose_serves_the_dashboard_on_loopback() -> None:
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    dash = spec["services"]["dashboard"]
    assert dash["command"][0] == "dashboard"
    assert dash["ports"] == ["127.0.0.1:8050:8050"]
    assert "redis" in dash["depends_on"]
    command = dash["command"]
    assert command[command.index("--redis-url") + 1].startswith("redis://redis:")
    # Inside the container it binds every interface (to be published), so it says why it
    # may go without a token: the port is published on the host's loopback only.
    assert "--no-token" in command and command[command.index("--host") + 1] == "0.0.0.0"

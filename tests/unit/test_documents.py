"""The dashboard snapshot's views, on a hand-built snapshot (``documents.py``): the JSON
document (``dashboard/document.py``) is the one expected and holds to ``schema.json``;
``/metrics`` (``dashboard/metrics.py``) and ``strata status``'s text (``cli/views.py``)
shape the same snapshot."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from typing import Any

import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from strata_redis.checkpoint.ids import CheckpointId
from strata_redis.cli.views import (
    Column,
    _duration,
    plain,
    render,
    render_job,
    table,
    window_words,
)
from strata_redis.dashboard.document import document as shape
from strata_redis.dashboard.metrics import render_metrics
from strata_redis.dashboard.snapshot import HeldShard, Page

from .documents import JOB, document, snapshot


def schema() -> dict[str, Any]:
    raw = resources.files("strata_redis.dashboard").joinpath("schema.json").read_text()
    return dict(json.loads(raw))


def samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_document_holds_to_the_schema() -> None:
    jsonschema.validate(document(), schema())


def test_the_snapshot_shapes_into_the_document() -> None:
    got = shape(snapshot())
    assert got == document()
    jsonschema.validate(got, schema())


def test_the_schema_refuses_a_broken_document() -> None:
    doc = document()
    del doc["jobs"][0]["epoch"]
    with pytest.raises(jsonschema.ValidationError, match="'epoch' is a required property"):
        jsonschema.validate(doc, schema())


# -- /metrics -----------------------------------------------------------------------------------
def test_metrics_of_a_document() -> None:
    body, content_type = render_metrics(snapshot())
    assert content_type.startswith("text/plain")
    got = samples(body)
    job = (("job_id", JOB),)
    assert got[("strata_redis_up", ())] == 1
    assert got[("strata_epoch", job)] == 2
    assert got[("strata_lease_grants_total", job)] == 321
    assert got[("strata_worker_failures_total", job)] == 1
    assert got[("strata_checkpoint_saved_bytes_total", job)] == 2_500_000
    assert got[("strata_checkpoint_latest_step", job)] == 400
    assert got[("strata_barrier_release_latency_seconds", (*job, ("percentile", "99")))] == (
        pytest.approx(0.00425)
    )  # ms in the document, seconds on /metrics


def test_metrics_counts_workers_by_status() -> None:
    got = samples(render_metrics(snapshot())[0])
    by_status = {dict(k[1])["status"]: v for k, v in got.items() if k[0] == "strata_workers"}
    assert by_status["training"] == 1 and by_status["stale"] == 1 and by_status["failed"] == 1


def test_metrics_when_redis_is_down_is_up_0_alone() -> None:
    body, _ = render_metrics(None)
    assert samples(body) == {("strata_redis_up", ()): 0}


def test_metric_names_follow_prometheus_conventions() -> None:
    for family in text_string_to_metric_families(render_metrics(snapshot())[0].decode()):
        assert family.name.startswith("strata_")
        assert family.name.endswith("_total") is False  # the parser strips it off counters
        for s in family.samples:
            assert "job" not in s.labels and "instance" not in s.labels


# -- strata status's text -----------------------------------------------------------------------
def test_render_job_lines() -> None:
    text = "\n".join(render_job(snapshot(), JOB, 160))
    # 2 live, one of them silent past the timeout: 1 heartbeating
    assert f"job {JOB!r} (running): membership generation 7, 1 live of 3 workers; epoch 2" in text
    assert "1 training, 0 checkpointing, 0 idle; 1 failed and 0 left in the last 10 min" in text
    assert "1 silent past the job's 10s timeout" in text
    assert "p50 1.50 ms, p99 4.25 ms, max 5.00 ms (newest 10 releases)" in text
    assert "lease grants so far: 321; Redis: 1234 commands/s" in text
    assert "training: 250.5 samples/s, epoch 2 ETA 12s (3000 samples left); slowest w1" in text
    assert "aborted by w1: rank 1 could not save its parts" in text
    assert "2/2" in text and "2.5 MB" in text
    assert "(stale: no heartbeat" in text


@pytest.mark.parametrize("width", [40, 60, 80, 120, 160])
def test_render_fits_its_width(width: int) -> None:
    for line in render(snapshot(), width).splitlines():
        assert len(line) <= width, line


def test_a_narrow_table_drops_the_least_needed_columns_first() -> None:
    lines = render_job(snapshot(), JOB, 60)
    header = next(line for line in lines if line.startswith("WORKER"))
    assert "ADDRESS" not in header and "STATUS" in header


def test_render_escapes_control_characters() -> None:
    snap = snapshot()
    w0, w1 = snap.jobs[0].workers
    snap = snapshot(workers=(dataclasses.replace(w0, host="evil\x1b[2Jhost"), w1))
    text = render(snap, 160)
    assert "\x1b" not in text and "evil\\x1b[2Jhost" in text


def test_render_of_no_jobs() -> None:
    assert render(dataclasses.replace(snapshot(), jobs=()), 80) == "no strata jobs in this Redis"


def test_render_of_a_job_without_datasets_or_checkpoints() -> None:
    snap = snapshot()
    barrier = dataclasses.replace(snap.jobs[0].barrier, releases=0)
    text = render(snapshot(datasets=(), checkpoints=(), barrier=barrier), 100)
    assert "no datasets registered" in text and "no checkpoints recorded" in text
    assert "barrier release latency: no releases recorded" in text


def test_more_workers_than_the_page_is_said() -> None:
    snap = dataclasses.replace(snapshot(), page=Page(0, 50, 7))
    assert "… 5 more workers not shown" in render(snap, 120)


def test_table_cuts_cells_and_marks_them() -> None:
    cols = [Column("A", 4, 2), Column("B", 0, 1, least=3)]
    assert table(cols, [["abcdefg", "xyz"]], 20) == ["A    B", "abc… xyz"]
    # an id keeps its end, what tells it apart
    cols = [Column("A", 6, 2, keep_end=True), Column("B", 0, 1, least=3)]
    assert table(cols, [["node-7-rank-3", "x"]], 20)[1] == "…ank-3 x"
    # too narrow for both: the column kept least goes
    assert table([Column("A", 10, 1), Column("B", 10, 2)], [["a", "b"]], 12) == ["B", "b"]


@pytest.mark.parametrize(
    ("seconds", "words"), [(600, "10 min"), (90, "90 s"), (7200, "2 h"), (3600, "1 h"),
                           (61, "61 s"), (0.5, "0.5 s")],
)  # fmt: skip
def test_window_words(seconds: float, words: str) -> None:
    assert window_words(seconds) == words


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (59.4, "59s"), (119.6, "2m00s"), (3599, "59m59s"),
                          (3600, "1h00m"), (5400, "1h30m")],
)  # fmt: skip
def test_durations(seconds: float, text: str) -> None:
    assert _duration(seconds) == text


def test_plain_keeps_line_breaks() -> None:
    assert plain("a\nb") == "a\nb" and plain("a\tb") == "a\\tb"


# -- strata status fitted to a terminal's height ---------------------------------------------
def _many_workers(n: int) -> tuple[Any, ...]:
    w0 = snapshot().jobs[0].workers[0]
    return tuple(
        dataclasses.replace(w0, worker_id=f"gpu-node-{i:02d}-rank-{i}", shards=(
            HeldShard("imagenet_train_full", 2, 100 + i, 5, 9.5),))
        for i in range(n)
    )  # fmt: skip


def _many_checkpoints(n: int) -> tuple[Any, ...]:
    c = snapshot().jobs[0].checkpoints[0]
    return tuple(dataclasses.replace(c, id=CheckpointId(100 * (n - i), 2)) for i in range(n))


def test_at_80x24_the_header_stays_and_the_worker_table_gives_way_first() -> None:
    workers = _many_workers(30)
    snap = dataclasses.replace(snapshot(workers=workers), page=Page(0, 1000, 30))
    lines = render(snap, 80, 23).splitlines()  # 24 lines, less --watch's footer
    assert len(lines) <= 23 and max(map(len, lines)) <= 80, lines
    # the header whole, first
    full = render(snap, 80).splitlines()
    header = full[: full.index("")]
    assert lines[: len(header)] == header and lines[0].startswith(f"job {JOB!r} (running)")
    # the datasets and both checkpoints kept; the workers cut, the rest counted
    assert any(line.startswith("tokens") for line in lines)
    assert sum(line.split()[:2] in (["2", "400"], ["2", "500"]) for line in lines) == 2
    shown = [line for line in lines if line.startswith("gpu-node-")]
    assert 0 < len(shown) < 30 and lines[-1] == f"… {30 - len(shown)} more workers not shown"
    assert shown[0].startswith("gpu-node-00-rank-0 ")  # the first rows kept


def test_a_shorter_terminal_cuts_the_checkpoints_next_and_never_the_header() -> None:
    snap = snapshot(workers=_many_workers(30), checkpoints=_many_checkpoints(8))
    snap = dataclasses.replace(snap, page=Page(0, 1000, 30))
    full = render(snap, 80).splitlines()
    header = full[: full.index("")]
    lines = render(snap, 80, len(header) + 10).splitlines()
    assert lines[: len(header)] == header, lines
    assert "… 30 workers not shown" in lines, lines  # no worker row left
    kept = [line for line in lines if line.split()[:1] == ["2"]]
    assert kept and kept[0].split()[1] == "800"  # the newest checkpoint first
    assert f"… {8 - len(kept)} more checkpoints not shown" in lines, lines
    assert len(lines) <= len(header) + 10


def test_every_job_shares_the_height() -> None:
    one = snapshot(workers=_many_workers(30)).jobs[0]
    two = dataclasses.replace(one, job_id="job-b")
    snap = dataclasses.replace(snapshot(), jobs=(one, two), page=Page(0, 1000, 60))
    lines = render(snap, 80, 40).splitlines()
    assert len(lines) <= 40 and lines[0].startswith("job 'job-a'"), lines
    assert any(line.startswith("job 'job-b'") for line in lines), lines


def test_a_cut_shard_cell_keeps_its_shard_number() -> None:
    """The shard column keeps the end of a cell too long: ``…_full#117``, never
    ``imagenet_t~``, which drops the shard number."""
    snap = snapshot(workers=_many_workers(20))
    row = next(line for line in render(snap, 80).splitlines() if "rank-17" in line)
    shard = row.split()[-1]
    assert shard.startswith("…") and shard.endswith("_full#117"), row

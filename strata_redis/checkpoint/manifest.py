"""A checkpoint's layout in storage and its metadata.json: what was committed, sizes, checksums.

Layout, under the storage root (``{label}`` is the checkpoint's label, ``ids.py``:
``step_{S}``, ``epoch_{E}_step_{S}``, ``run_{R}_epoch_{E}_step_{S}``: the loop's numbers)::

    {job_id}/checkpoints/{label}/metadata.json        written last, by one leader
    {job_id}/checkpoints/{label}/model.bin            world_size 1: parts by name
    {job_id}/checkpoints/{label}/rank_{r}/model.bin   world_size > 1: parts per rank

A checkpoint is committed exactly when its ``metadata.json`` exists; it records the step,
epoch and run apart, and lists every file with its size and CRC-32, so a reader can verify
what it reads without Redis.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import orjson

from ..storage.base import check_path
from .ids import CheckpointId

if TYPE_CHECKING:
    from ..storage import Storage

__all__ = [
    "FORMAT",
    "METADATA",
    "CheckpointInfo",
    "FileEntry",
    "check_part_name",
    "checkpoint_dir",
    "checkpoints_prefix",
    "decode_metadata",
    "encode_metadata",
    "id_of",
    "part_path",
    "scan",
]

FORMAT = "strata-checkpoint/1"
METADATA = "metadata.json"
_RANK_DIR = re.compile(r"rank_[0-9]+")


@dataclass(frozen=True)
class FileEntry:
    """One committed file of a step.

    Attributes:
        path: its path inside the step directory (``model.bin``, ``rank_3/model.bin``).
        name: the part name the saving worker gave (``model.bin``).
        rank: the rank that saved it.
        size: its size in bytes.
        checksum: ``"crc32:<8 hex digits>"``.
    """

    path: str
    name: str
    rank: int
    size: int
    checksum: str


@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint, as its metadata.json describes it.

    Attributes:
        job_id: the job that saved it.
        step: the loop's step passed to ``save``.
        epoch: the epoch passed to ``save`` (None if none was).
        world_size: how many ranks saved parts of it.
        workers: rank -> the worker id that saved it.
        files: path inside the checkpoint directory -> the file's entry.
        acked_ms: when the last rank acked, ms on Redis' clock.
        run: the job's launch that saved it (0: the first; see ``ids.py``).
        era, clock: the job's era and clock when its last rank acked (``era.py``): a resume
            in the same era that finds Redis' clock below it knows Redis went back. ("", 0:
            saved before the clock existed.)
        location: where it lives (``s3://bucket/prefix/job/checkpoints/epoch_2_step_5000``).
    """

    job_id: str
    step: int
    epoch: int | None
    world_size: int
    workers: dict[int, str]
    files: dict[str, FileEntry]
    acked_ms: int
    run: int = 0
    era: str = ""
    clock: int = 0
    location: str = field(default="", compare=False)

    @property
    def id(self) -> CheckpointId:
        """Its identity: (run, epoch, step)."""
        return CheckpointId(self.step, self.epoch, self.run)

    @property
    def label(self) -> str:
        """Its label: the name of its directory (``epoch_2_step_5000``)."""
        return self.id.label

    @property
    def nbytes(self) -> int:
        """The total size of the step's files."""
        return sum(f.size for f in self.files.values())

    def entry(self, name: str, rank: int) -> FileEntry | None:
        """The entry of part ``name`` of ``rank``, or None."""
        for entry in self.files.values():
            if entry.name == name and entry.rank == rank:
                return entry
        return None

    def part_names(self) -> list[str]:
        """Every part name of the step, sorted."""
        return sorted({f.name for f in self.files.values()})


def checkpoints_prefix(job_id: str) -> str:
    """``{job_id}/checkpoints/``: where a job's steps live."""
    return f"{job_id}/checkpoints/"


def checkpoint_dir(job_id: str, cid: CheckpointId) -> str:
    """``{job_id}/checkpoints/{label}``: where checkpoint ``cid`` lives."""
    return f"{job_id}/checkpoints/{cid.label}"


def located(info: CheckpointInfo, storage: Storage) -> CheckpointInfo:
    """``info`` with its ``location`` filled in: where it lives in ``storage``."""
    return replace(info, location=f"{storage.describe()}/{checkpoint_dir(info.job_id, info.id)}")


def part_path(name: str, rank: int, world_size: int) -> str:
    """A part's path inside its step directory: ``name``, or ``rank_{r}/name`` with ranks."""
    return name if world_size == 1 else f"rank_{rank}/{name}"


def id_of(relative: str) -> tuple[CheckpointId, str] | None:
    """``(id, rest)`` for ``{label}/rest`` (a path under the checkpoints prefix), else None."""
    head, sep, rest = relative.partition("/")
    cid = CheckpointId.from_label(head)
    if cid is None or not sep:
        return None
    return cid, rest


def scan(storage: Storage, job_id: str) -> dict[CheckpointId, list[str]]:
    """Every checkpoint directory of ``job_id`` in storage: id -> its files (paths inside it)."""
    prefix = checkpoints_prefix(job_id)
    found: dict[CheckpointId, list[str]] = {}
    for path in storage.list(prefix):
        parsed = id_of(path[len(prefix) :])
        if parsed is not None:
            found.setdefault(parsed[0], []).append(parsed[1])
    return found


def check_part_name(name: object, *, arg: str = "name") -> str:
    """Return ``name`` if it can name a part of a checkpoint, else raise naming ``arg``.

    A part name is a valid storage path (``model.bin``, ``optim/adam.bin``) other than
    ``metadata.json`` and not starting with a ``rank_<N>`` directory (those hold ranks' parts).

    Raises:
        TypeError: not a ``str``.
        ValueError: an invalid path or a reserved name.
    """
    name = check_path(name, arg=arg)
    if name == METADATA:
        raise ValueError(f"{arg} {name!r} is reserved for the step's metadata")
    if _RANK_DIR.fullmatch(name.split("/", 1)[0]):
        raise ValueError(f"{arg} {name!r} must not start with a rank_<N> directory (reserved)")
    return name


def encode_metadata(info: CheckpointInfo) -> bytes:
    """metadata.json's bytes: sorted keys, so every leader writes the same bytes."""
    doc = {
        "format": FORMAT,
        "job_id": info.job_id,
        "run": info.run,
        "step": info.step,
        "epoch": info.epoch,
        "world_size": info.world_size,
        "acked_ms": info.acked_ms,
        "era": info.era,
        "clock": info.clock,
        "workers": {str(rank): worker for rank, worker in sorted(info.workers.items())},
        "files": {
            path: {"name": f.name, "rank": f.rank, "size": f.size, "checksum": f.checksum}
            for path, f in sorted(info.files.items())
        },
    }
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)


def decode_metadata(raw: bytes | str, job_id: str, cid: CheckpointId) -> CheckpointInfo:
    """Parse and check a metadata.json read for ``job_id``'s checkpoint ``cid``.

    A metadata.json without ``run`` (written before runs existed) is of run 0.

    Raises:
        ValueError: not valid metadata of that job and checkpoint (the message says why).
    """
    try:
        doc = orjson.loads(raw)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} document")
        found = (doc["job_id"], doc["step"], doc["epoch"], doc.get("run", 0))
        if found != (job_id, cid.step, cid.epoch, cid.run):
            described = CheckpointId(_int(found[1], 0), found[2], _int(found[3], 0))
            raise ValueError(
                f"it describes job {doc['job_id']!r} checkpoint {described}, not job "
                f"{job_id!r} checkpoint {cid}"
            )
        world_size = _int(doc["world_size"], 1)
        files = {}
        for path, f in doc["files"].items():
            check_path(path, arg="file path")
            files[path] = FileEntry(
                path, str(f["name"]), _int(f["rank"], 0), _int(f["size"], 0), str(f["checksum"])
            )
        if not files:
            raise ValueError("it lists no files")
        return CheckpointInfo(
            job_id=job_id,
            step=cid.step,
            epoch=cid.epoch,
            world_size=world_size,
            workers={int(r): str(w) for r, w in doc["workers"].items()},
            files=files,
            acked_ms=_int(doc["acked_ms"], 0),
            run=cid.run,
            era=str(doc.get("era", "")),
            clock=_int(doc.get("clock", 0), 0),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed metadata ({type(exc).__name__}: {exc})") from None


def _int(value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"expected an int >= {low}, got {value!r}")
    return value

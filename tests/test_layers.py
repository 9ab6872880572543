"""The house's shape: the layer contract holds, every module has a layer, public names pinned."""

from __future__ import annotations

import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

import pytest

import strata_redis
from strata_redis import status
from strata_redis.scripts import PRELUDE, compiled, library, sources

ROOT = Path(__file__).resolve().parent.parent

#: what ``import strata_redis`` offers; a change here is a change of the public API
PUBLIC = {
    "LIVE", "Barrier", "BarrierBrokenError", "BarrierError", "BarrierLatency", "BarrierState",
    "BarrierTimeoutError", "CheckpointAbortedError", "CheckpointError", "CheckpointId",
    "CheckpointInfo", "CheckpointManager", "CheckpointNotFoundError", "CheckpointSkippedWarning",
    "DatasetConflictError", "DatasetError", "DatasetNotFoundError", "DatasetParams",
    "EpochProgress", "EpochUnfinishedError", "FileEntry", "Job", "JobContext", "JobLayoutError",
    "Keys", "Lease",
    "LeaseError",
    "LeaseLostError", "LoadedCheckpoint", "LocalStorage", "NotReplicatedError", "RedisConfigError",
    "RedisMemoryFullError", "RedisUnavailableError", "Release", "Rendezvous",
    "RendezvousEndedError",
    "RendezvousError", "RendezvousTimeoutError", "RestartLimitError", "Round", "RoundBrokenError",
    "S3Storage", "SaveFuture", "ShardStream", "TrainingOrchestrator",
    "SaveRecord", "Shard", "ShardLeases", "ShardManager", "StateLostError",
    "StateRolledBackError", "StepNotForwardError",
    "Storage",
    "StorageError", "StorageExistsError", "StorageNotFoundError", "StrataError", "Worker",
    "WorkerError", "WorkerExistsError", "WorkerFailedError", "WorkerInfo", "WorkerLeftError",
    "WorkerNotRegisteredError", "WorkerReplacedError", "__version__", "connect", "open_storage",
    "storage_from_env", "storage_from_url",
}  # fmt: skip

#: the submodules users may import from (docs/design/architecture.md's layout table lists them)
SUPPORTED = [
    "checkpoint.ids", "checkpoint.manager", "checkpoint.manifest", "checkpoint.reader", "cli",
    "connection",
    "context", "coordination.barrier", "coordination.epochs", "coordination.registry",
    "coordination.rendezvous", "coordination.workers", "data.leases", "data.position",
    "data.sharding", "durability", "era", "errors", "identity", "job", "keys", "orchestrator",
    "outage",
    "scripts", "server", "shard_manager", "status", "storage", "testing", "validate",
    "dashboard", "torch",
]  # fmt: skip


#: packages that are one layer as a whole (their modules import each other freely)
WHOLE = ("storage", "dashboard", "torch", "chaos")


def _modules() -> set[str]:
    """Every module of the package, relative to it (subpackages' ``__init__`` excluded)."""
    found = set()
    for info in pkgutil.walk_packages(strata_redis.__path__, "strata_redis."):
        name = info.name.removeprefix("strata_redis.")
        if not info.ispkg or name in WHOLE:
            found.add(name)
    return {m for m in found if m.split(".")[0] not in WHOLE or m in WHOLE}


def _contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _layers() -> list[list[str]]:
    (contract,) = [c for c in _contracts() if c["type"] == "layers"]
    return [[m.strip() for m in layer.split("|")] for layer in contract["layers"]]


def test_the_layer_contract_holds() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is not installed (pip install -e '.[dev]')"
    run = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{len(_contracts())} kept, 0 broken" in run.stdout


def test_tools_and_facades_never_touch_the_key_schema() -> None:
    """Tools and facades read through the owners (the dashboard through their queue/take
    pairs): the key schema is not theirs. (``torch/distributed.py`` owns its store's hash.)"""
    (contract,) = [
        c for c in _contracts()
        if c["type"] == "forbidden" and "strata_redis.keys" in c["forbidden_modules"]
    ]  # fmt: skip
    tools = ["orchestrator", "torch", "dashboard", "demo", "cli"]
    assert set(contract["source_modules"]) == {f"strata_redis.{m}" for m in tools}
    pkg = ROOT / "strata_redis"
    paths = [*(pkg / "dashboard").rglob("*.py"), *(pkg / "torch").rglob("*.py")]
    paths += [pkg / "orchestrator.py", pkg / "demo.py", pkg / "cli.py"]
    for path in paths:
        text = path.read_text()
        assert not re.search(r"\bKeys\b|strata_redis\.keys|from \.+keys import", text), path
        assert "strata:{{" not in text, f"{path} builds a key"
        assert path.parent.name != "dashboard" or "strata:{" not in text, path
        if path.name != "distributed.py":
            assert not re.search(r"\.keys\.[a-z]", text), f"{path} reaches into the key schema"


def test_every_module_has_exactly_one_layer() -> None:
    listed = [m for layer in _layers() for m in layer]
    assert len(listed) == len(set(listed)), "a module is in two layers"
    assert set(listed) == _modules(), "add new modules to the layers in pyproject.toml"


def test_public_names_are_pinned() -> None:
    assert set(strata_redis.__all__) == PUBLIC
    for name in PUBLIC:
        assert hasattr(strata_redis, name), name


def test_supported_submodules_import_and_are_documented() -> None:
    table = (ROOT / "docs" / "design" / "architecture.md").read_text()
    for name in SUPPORTED:
        __import__(f"strata_redis.{name}")
        path = name.replace(".", "/") + ("/" if name in WHOLE else ".py")
        assert f"`{path}`" in table, f"the layout table (docs/design/architecture.md) lacks {path}"


def test_no_bare_status_codes_in_python_or_lua() -> None:
    # every refusal a script returns is named through the prelude (S.*, A.*)
    for name, src in sources().items():
        code = "\n".join(line.split("--")[0] for line in src.splitlines())
        bare = re.findall(r"(?:return|answer\()\s*\{\s*-?\d", code)
        assert not bare, f"{name}.lua returns a bare status code: {bare}"
        assert compiled()[name].startswith(status.prelude())
        assert compiled()[name].count("\n") == src.count("\n"), "the prelude must keep line numbers"
    for path in (ROOT / "strata_redis").rglob("*.py"):
        text = path.read_text()
        # a reply's flags (0/1) are not statuses; any other number compared with it is
        bare = re.search(r"reply\[0\]\)? *[=!<>]=? *(-\d|[2-9]|\d\d)", text)
        assert not bare, f"{path}: bare status code {bare.group(0)!r}"


def test_status_codes_are_written_as_numbers_when_scripts_load() -> None:
    # no Lua table of codes is built per call: each name is its number in the loaded script
    assert status.inline("return {S.LEASE_LOST, A.NOTHING}") == "return {20, (-1)}"
    with pytest.raises(ValueError, match=r"'S\.NO_SUCH_CODE': no such Status"):
        status.inline("return {S.NO_SUCH_CODE}")
    for name, code in compiled().items():
        left = re.search(r"\b[SA]\.[A-Z_]+", code)
        assert not left, f"{name}: {left.group(0) if left else ''} not inlined"


def test_the_clock_comes_from_the_shared_prelude() -> None:
    # lua/lib/prelude.lua is joined onto every script's first line: it alone reads TIME
    shared = library(PRELUDE)
    assert "--" not in shared, "a comment after code in the prelude would swallow line 1"
    for name, src in sources().items():
        code = "\n".join(line.split("--")[0] for line in src.splitlines())
        assert "redis.call('TIME')" not in code, f"{name}.lua reads TIME: use NOW_MS()/NOW_US()"
        assert compiled()[name].startswith(status.prelude() + status.inline(shared)), name

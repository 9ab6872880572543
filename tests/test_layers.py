"""The house's shape: the layer contract holds, every module has a layer, public names pinned."""

from __future__ import annotations

import ast
import importlib
import importlib.util
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

#: the import paths users may rely on (docs/design/architecture.md marks the rest internal);
#: ``strata_redis`` itself is pinned by tests/unit/test_public_names.py
SUPPORTED = [
    "checkpoint", "context", "coordination", "data", "dashboard", "errors", "storage",
    "testing", "torch", "lightning", "accelerate", "shards",
]  # fmt: skip
#: supported modules needing an optional framework (imported when it is installed)
OPTIONAL = {"torch": "torch", "lightning": "lightning", "accelerate": "accelerate"}

#: packages that are one layer as a whole (their modules import each other freely)
WHOLE = ("storage", "dashboard", "torch", "chaos", "cli")
#: packages whose modules are ordered by a layers contract of their own
FEATURES = ("checkpoint", "data", "coordination", "shards", "orchestrator")


def _modules() -> set[str]:
    """Every module of the package, relative to it (packages' ``__init__`` excluded)."""
    found = set()
    for info in pkgutil.walk_packages(strata_redis.__path__, "strata_redis."):
        if not info.ispkg:
            found.add(info.name.removeprefix("strata_redis."))
    return found


def _contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _layers() -> dict[str, list[list[str]]]:
    """Each layers contract's container, and its layers (each a list of its modules)."""
    found: dict[str, list[list[str]]] = {}
    for c in _contracts():
        if c["type"] == "layers":
            (container,) = c["containers"]
            layers = [[m.strip() for m in re.split(r"[|:]", layer)] for layer in c["layers"]]
            found[container.removeprefix("strata_redis").lstrip(".")] = layers
    return found


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
    tools = ["orchestrator", "torch", "shards", "lightning", "accelerate", "dashboard", "demo",
             "cli"]  # fmt: skip
    assert set(contract["source_modules"]) == {f"strata_redis.{m}" for m in tools}
    pkg = ROOT / "strata_redis"
    paths = [*(pkg / "dashboard").rglob("*.py"), *(pkg / "torch").rglob("*.py")]
    paths += [*(pkg / "cli").rglob("*.py"), *(pkg / "shards").rglob("*.py")]
    paths += [*(pkg / "orchestrator").rglob("*.py")]
    paths += [pkg / m for m in ("demo.py", "lightning.py", "accelerate.py")]
    for path in paths:
        text = path.read_text()
        assert not re.search(r"\bKeys\b|strata_redis\.keys|from \.+keys import", text), path
        assert "strata:{{" not in text, f"{path} builds a key"
        assert path.parent.name != "dashboard" or "strata:{" not in text, path
        if path.name != "distributed.py":
            assert not re.search(r"\.keys\.[a-z]", text), f"{path} reaches into the key schema"


def test_every_module_has_exactly_one_layer() -> None:
    """The root's contract orders its modules and subpackages (each one unit); each feature
    package's contract orders its own modules."""
    layers = _layers()
    assert set(layers) == {"", *FEATURES}, "one layers contract for the root and per feature"
    modules = _modules()
    for container, levels in layers.items():
        listed = [m for level in levels for m in level]
        assert len(listed) == len(set(listed)), f"{container or 'root'}: a module in two layers"
        prefix = f"{container}." if container else ""
        if container:
            want = {m.removeprefix(prefix) for m in modules if m.startswith(prefix)}
        else:
            want = {m.split(".")[0] for m in modules}
        assert set(listed) == want, (
            f"add new modules to the layers of {container or 'the root'} in pyproject.toml"
        )


def test_other_packages_import_a_feature_package_through_its_all() -> None:
    """``<package>.__all__`` is what other packages may import from it: a class or function
    it names, or an owner module it names (``from ..coordination import registry``)."""
    for path in (ROOT / "strata_redis").rglob("*.py"):
        here = path.relative_to(ROOT / "strata_redis").with_suffix("").parts
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = list(here[: len(here) - node.level])
            target = [*base, *(node.module or "").split(".")] if node.module else base
            target = [part for part in target if part]
            if not target or target[0] not in (*FEATURES, "storage") or target[0] == here[0]:
                continue
            public = importlib.import_module(f"strata_redis.{target[0]}").__all__
            for alias in node.names:
                module = target[1] if len(target) > 1 else alias.name
                assert module in public or alias.name in public, (
                    f"{path.name} imports {alias.name} from strata_redis.{'.'.join(target)}: "
                    f"not in strata_redis.{target[0]}.__all__"
                )


def test_supported_submodules_import_and_are_documented() -> None:
    """The layout table names every module of the root and every subpackage; the supported
    import paths (``SUPPORTED``) are marked public there, every other one internal."""
    table = (ROOT / "docs" / "design" / "architecture.md").read_text()
    rows = [line.split("|") for line in table.splitlines() if line.startswith("| ")]
    for name in SUPPORTED:
        if name not in OPTIONAL or importlib.util.find_spec(OPTIONAL[name]) is not None:
            importlib.import_module(f"strata_redis.{name}")
    for unit in sorted({m.split(".")[0] for m in _modules()} - {"__main__"}):
        path = f"`{unit}/`" if (ROOT / "strata_redis" / unit).is_dir() else f"`{unit}.py`"
        marks = [row[3].strip() for row in rows if path in row[2]]
        assert marks, f"the layout table (docs/design/architecture.md) lacks {path}"
        want = "public" if unit in SUPPORTED else "internal"
        assert marks == [want], f"{path} is {want}: its row says {marks}"


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

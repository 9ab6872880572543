"""The built wheel carries every Lua script and works installed outside the source tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent

CHECK = """
import json, sys, strata_redis
from strata_redis.scripts import lua_dir, sources
job = strata_redis.connect(sys.argv[1], "wheel-check")
job.register_worker("w", heartbeat_interval=None).heartbeat()
print(json.dumps({"module": strata_redis.__file__, "lua": str(lua_dir()),
                  "scripts": sorted(sources()), "live": job.live_workers()}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (path,) = out.glob("strata_redis-*.whl")
    return path


def test_wheel_carries_every_lua_script(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n.removeprefix("strata_redis/lua/") for n in names
                     if n.startswith("strata_redis/lua/"))  # fmt: skip
    lua = ROOT / "lua"
    assert shipped == sorted(str(p.relative_to(lua)) for p in lua.rglob("*.lua"))
    assert "lib/barrier.lua" in shipped  # the shared pieces the scripts name
    assert "strata_redis/py.typed" in names


def test_installed_wheel_loads_scripts_outside_the_source_tree(
    wheel: Path, tmp_path: Path, redis_url: str
) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # The dependencies (redis, orjson, numpy) come from this interpreter's site-packages via a
    # .pth file; strata_redis itself only from the wheel (the source tree is not on the path).
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    deps = {str(Path(m.__file__).resolve().parent.parent) for m in (redis,)}
    deps.add(sysconfig.get_path("purelib"))
    Path(site, "deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [str(py), "-c", CHECK, redis_url],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["module"].startswith(str(env_dir)), got
    assert got["lua"].startswith(str(env_dir)), got
    assert got["scripts"] == sorted(p.stem for p in (ROOT / "lua").glob("*.lua"))
    assert got["live"] == ["w"]
    cli = subprocess.run(
        [str(env_dir / "bin" / "strata"), "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0 and "demo" in cli.stdout

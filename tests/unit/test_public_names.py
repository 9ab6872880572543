"""The public surface: ``strata_redis.__all__`` is small, pinned and documented; a name that
left it still imports from the root, with a warning naming its new path."""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest

import strata_redis
from strata_redis import errors

ROOT = Path(strata_redis.__file__).resolve().parent.parent
API = ROOT / "docs" / "reference" / "api"

#: what ``import strata_redis`` offers; a change here is a change of the public API
PUBLIC = {
    "TrainingOrchestrator", "ShardStream", "connect", "Job", "ShardManager", "DatasetParams",
    "Shard", "Lease", "CheckpointManager", "SaveFuture", "CheckpointInfo", "LoadedCheckpoint",
    "CheckpointSkippedWarning", "Storage", "LocalStorage", "S3Storage", "open_storage",
    "storage_from_url", "storage_from_env", "StrataError", "WorkerError", "BarrierError",
    "RendezvousError", "DatasetError", "LeaseError", "LeaseLostError", "CheckpointError",
    "CheckpointNotFoundError", "StorageError", "StateLostError", "StateRolledBackError",
    "RedisUnavailableError", "RedisMemoryFullError", "NotReplicatedError", "__version__",
}  # fmt: skip

#: the subpackages, each with an ``__all__`` of its own (``torch``'s is left out: importing torch
#: takes the unit tier's whole budget)
PACKAGES = ("checkpoint", "coordination", "data", "storage", "dashboard", "chaos")


def test_the_root_offers_at_most_40_names_and_they_are_pinned() -> None:
    assert len(strata_redis.__all__) <= 40
    assert len(set(strata_redis.__all__)) == len(strata_redis.__all__)
    assert set(strata_redis.__all__) == PUBLIC
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of them is a moved name
        for name in PUBLIC:
            assert getattr(strata_redis, name) is not None, name


def test_every_public_name_is_in_the_api_reference() -> None:
    index = (API / "index.md").read_text()
    rendered = {
        m for page in API.glob("*.md") for m in re.findall(r"^::: (\S+)", page.read_text(), re.M)
    }
    errors_page = (ROOT / "docs" / "reference" / "errors.md").read_text()
    for name in PUBLIC:
        assert f"`{name}`" in index, f"docs/reference/api/index.md does not list {name}"
        if name == "__version__":
            continue
        if name in errors.__all__:  # the errors page renders strata_redis.errors whole
            assert "::: strata_redis.errors" in errors_page
        else:
            assert f"strata_redis.{name}" in rendered, f"no page renders strata_redis.{name}"


def test_every_error_imports_from_errors() -> None:
    classes = {
        name for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.StrataError)
    }  # fmt: skip
    assert classes == set(errors.__all__)
    public_errors = {name for name in PUBLIC if name.endswith("Error")}
    assert public_errors <= classes


@pytest.mark.parametrize("name", sorted(strata_redis._MOVED))
def test_a_moved_name_still_imports_from_the_root_with_a_warning(name: str) -> None:
    module = strata_redis._MOVED[name]
    with pytest.warns(DeprecationWarning, match=rf"import it from {re.escape(module)} "):
        value = getattr(strata_redis, name)
    assert value is getattr(importlib.import_module(module), name)
    assert name not in strata_redis.__all__


def test_an_unknown_name_is_no_attribute() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        strata_redis.nope  # noqa: B018
    from strata_redis import scripts  # a submodule still imports (no attribute first)

    assert scripts.__name__ == "strata_redis.scripts"


@pytest.mark.parametrize("package", PACKAGES)
def test_each_subpackage_says_what_it_is_and_what_it_offers(package: str) -> None:
    module = importlib.import_module(f"strata_redis.{package}")
    assert module.__doc__ and len(module.__doc__.strip()) > 40, package
    assert isinstance(module.__all__, list)
    for name in module.__all__:
        assert hasattr(module, name), f"strata_redis.{package}.__all__ names {name}"

"""The Lua scripts: found on disk, registered once per client, status codes mapped to errors.

Every script lives in ``lua/<name>.lua`` (the wheel carries them as ``strata_redis/lua``)
and returns a table whose first element is a status code: 0 for success, else a code from
``STATUS`` below, the one table that turns codes into exceptions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from . import errors

Context = dict[str, Any]
#: one script call: (script name, keys, args)
Call = tuple[str, Sequence[str], Sequence[Any]]


def _worker(cls: type[errors.WorkerError], what: str) -> Callable[[Context], errors.StrataError]:
    def make(c: Context) -> errors.StrataError:
        return cls(
            f"worker {c['worker_id']!r} of job {c['job_id']!r} {what}",
            job_id=c["job_id"],
            worker_id=c["worker_id"],
        )

    return make


#: the status of a refused lease (a stale fencing token), also raised from a hand-off's reply
LEASE_LOST = 20

#: status code -> a factory building the exception from the caller's context.
STATUS: dict[int, Callable[[Context], errors.StrataError]] = {
    1: _worker(errors.WorkerNotRegisteredError, "is not registered"),
    3: _worker(errors.WorkerFailedError, "was declared failed; register it again to rejoin"),
    4: _worker(errors.WorkerLeftError, "has left; register it again to rejoin"),
    5: _worker(
        errors.WorkerExistsError, "is already registered and alive (pass replace=True to take it)"
    ),
    6: _worker(errors.WorkerReplacedError, "was replaced by a newer registration of the same id"),
    # 10-19: barriers (payload: the script's reply after the code)
    10: lambda c: errors.BarrierError(
        f"barrier {c['barrier']!r} of job {c['job_id']!r} moved to generation "
        f"{c['payload'][0]} while worker {c['worker_id']!r} was arriving (retry the call)",
        job_id=c["job_id"],
        barrier=c["barrier"],
    ),
    11: lambda c: errors.BarrierError(
        f"barrier {c['barrier']!r} of job {c['job_id']!r} generation {c['payload'][0]} was "
        f"opened with expected={c['payload'][1]!r}; worker {c['worker_id']!r} passed "
        f"expected={c['expected']!r} (every participant must pass the same)",
        job_id=c["job_id"],
        barrier=c["barrier"],
    ),
    # 20-29: shard leases
    LEASE_LOST: lambda c: errors.LeaseLostError(
        f"lease on shard {c['shard_id']} of dataset {c['dataset']!r} epoch {c['epoch']} "
        f"(token {c['token']}) was lost: it expired and was taken back, or was re-granted",
        job_id=c["job_id"],
        dataset=c["dataset"],
        epoch=c["epoch"],
        shard_id=c["shard_id"],
    ),
    22: lambda c: errors.DatasetConflictError(
        f"epoch {c['epoch']} of dataset {c['dataset']!r} in job {c['job_id']!r} was started "
        f"with a different number of shards than the dataset has now",
        job_id=c["job_id"],
        dataset=c["dataset"],
    ),
    # 30-39: datasets
    30: lambda c: errors.DatasetConflictError(
        f"dataset {c['dataset']!r} of job {c['job_id']!r} is registered with other parameters "
        f"(pass replace=True to replace them)",
        job_id=c["job_id"],
        dataset=c["dataset"],
    ),
    # 40-49: checkpoints (payload: the script's reply after the code)
    40: lambda c: errors.CheckpointError(
        f"step {c['step']} of job {c['job_id']!r} is not after the newest committed step "
        f"{c['payload'][0]}: steps must go forward",
        job_id=c["job_id"],
        step=c["step"],
    ),
    41: lambda c: errors.CheckpointAbortedError(
        f"step {c['step']} of job {c['job_id']!r} was aborted by worker {c['payload'][0]!r}: "
        f"{c['payload'][1]}",
        job_id=c["job_id"],
        step=c["step"],
    ),
    42: lambda c: errors.CheckpointError(
        f"step {c['step']} of job {c['job_id']!r} was opened with world_size="
        f"{c['payload'][0]} and epoch={c['payload'][1] or None}; worker {c['worker_id']!r} "
        f"passed world_size={c['world_size']} and epoch={c['epoch']} (all must pass the same)",
        job_id=c["job_id"],
        step=c["step"],
    ),
    43: lambda c: errors.CheckpointError(
        f"rank {c['rank']} of step {c['step']} of job {c['job_id']!r} is not worker "
        f"{c['worker_id']!r}'s: it is held by {c['payload'][0] or 'nobody (the step expired)'!r}",
        job_id=c["job_id"],
        step=c["step"],
    ),
    44: lambda c: errors.CheckpointError(
        f"step {c['step']} of job {c['job_id']!r} is already committed",
        job_id=c["job_id"],
        step=c["step"],
    ),
    45: lambda c: errors.CheckpointError(
        f"step {c['step']} of job {c['job_id']!r} is being committed by leader "
        f"{c['payload'][0]!r}; worker {c['worker_id']!r} cannot abort or commit it",
        job_id=c["job_id"],
        step=c["step"],
    ),
}


def lua_dir() -> Path:
    """The folder holding the ``.lua`` files: inside the installed package, else the source tree."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "lua", here.parent / "lua"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"no lua/ folder beside {here}: the installation is incomplete")


@cache
def sources() -> dict[str, str]:
    """Every script's source, by name (the file name without ``.lua``)."""
    return {path.stem: path.read_text(encoding="utf-8") for path in sorted(lua_dir().glob("*.lua"))}


def check(reply: Sequence[Any], context: Context | Callable[[], Context]) -> list[Any]:
    """Raise the exception for a non-zero status code; return the rest of the reply.

    ``context`` (a dict of ids, or a function returning one) fills the exception, with the
    reply after the code added as ``payload``.

    Raises:
        StrataError: the mapped exception.
        RuntimeError: an unknown status code (a script and this table disagree).
    """
    code = int(reply[0])
    if code == 0:
        return list(reply[1:])
    factory = STATUS.get(code)
    if factory is None:
        raise RuntimeError(f"unknown status code {code} from a strata_redis script: {reply!r}")
    ids = context() if callable(context) else context
    raise factory({**ids, "payload": list(reply[1:])})


class Scripts:
    """The scripts registered on one client (EVALSHA, reloaded after NOSCRIPT by redis-py)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._scripts: dict[str, Script] = {
            name: client.register_script(src) for name, src in sources().items()
        }

    def __getitem__(self, name: str) -> Script:
        return self._scripts[name]

    def names(self) -> list[str]:
        """The names of every registered script."""
        return list(self._scripts)

    def run(
        self,
        name: str,
        keys: Sequence[str],
        args: Sequence[Any],
        context: Context | Callable[[], Context],
    ) -> list[Any]:
        """Run one script, map its status code, return the payload after the code.

        ``context`` (the ids for an error message) may be a function, called only on error.
        """
        return check(self.call(name, keys, args), context)

    def call(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run one script and return its raw reply (the status code unchecked).

        EVALSHA is sent directly (cheaper than ``Script.__call__`` on hot paths); after a
        ``SCRIPT FLUSH`` the script is loaded and sent once more.
        """
        script = self._scripts[name]
        try:
            return self._client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            self._client.script_load(script.script)
            return self._client.evalsha(script.sha, len(keys), *keys, *args)

    def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """Run several scripts in one round trip; return their raw replies (codes unchecked).

        Uses EVALSHA directly: redis-py's pipeline would first send SCRIPT EXISTS, a second
        round trip. After a ``SCRIPT FLUSH`` (NOSCRIPT), the scripts are loaded and the batch
        is sent again; scripts must therefore be safe to repeat (ours are).
        """
        for attempt in range(2):
            with self._client.pipeline(transaction=False) as pipe:
                for name, keys, args in calls:
                    pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)
                replies = pipe.execute(raise_on_error=False)
            if attempt == 0 and any(isinstance(r, NoScriptError) for r in replies):
                for name, _, _ in calls:
                    self._client.script_load(self._scripts[name].script)
                continue
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return list(replies)
        raise AssertionError("unreachable")  # pragma: no cover

"""The Lua scripts: found on disk, registered once per client, status codes mapped to errors.

Every script lives in ``lua/<name>.lua`` (the wheel carries them as ``strata_redis/lua``)
and returns a table whose first element is a ``Status`` code: 0 for success, else a refusal
that ``errors.from_status`` turns into its exception. Each script is loaded with the status
prelude (``status.prelude()``) in front of its first line and the codes it names (``S.X``,
``A.X``) written as numbers (``status.inline``), so scripts name codes, not numbers; then
the shared prelude every script gets (``lua/lib/prelude.lua``: Redis' clock as ``NOW_MS()``
and ``NOW_US()``) and the shared pieces of Lua it names (``lua/lib/``, one line each).
Everything in front of a script's first line is on that line, so the line numbers in a Lua
error (``user_script:<line>:``) are the file's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError, ResponseError

from .errors import Context, from_status
from .status import EPILOGUE, Status, inline, prelude

#: one script call: (script name, keys, args)
Call = tuple[str, Sequence[str], Sequence[Any]]

#: a script's line naming a shared piece of Lua it needs
USES = re.compile(r"^-- uses: lib/(\w+)\.lua", re.MULTILINE)
#: the shared piece every script gets without naming it (``lua/lib/prelude.lua``)
PRELUDE = "prelude"


def lua_dir() -> Path:
    """The folder holding the ``.lua`` files: inside the installed package, else the source tree."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "lua", here.parent / "lua"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"no lua/ folder beside {here}: the installation is incomplete")


@cache
def sources() -> dict[str, str]:
    """Every script's file, by name (the file name without ``.lua``)."""
    return {path.stem: path.read_text(encoding="utf-8") for path in sorted(lua_dir().glob("*.lua"))}


@cache
def library(name: str) -> str:
    """A shared piece of Lua (``lua/lib/<name>.lua``) as one line: comments dropped."""
    text = (lua_dir() / "lib" / f"{name}.lua").read_text(encoding="utf-8")
    lines = (line.strip() for line in text.splitlines())
    return " ".join(line for line in lines if line and not line.startswith("--")) + " "


def body(name: str, *, inlined: bool = True) -> str:
    """Script ``name`` as it runs inside the era check (``compose`` of its file)."""
    return compose(sources()[name], inlined=inlined)


def compose(src: str, *, inlined: bool = True) -> str:
    """A script's file as it runs inside the era check: the shared prelude and the pieces of
    ``lua/lib/`` it names, on its first line, then the file; codes written as numbers unless
    ``inlined`` is false (for a benchmark that builds a variant of its own).

    Raises:
        ValueError: the script names a shared piece twice, or names the prelude (every
            script has it).
    """
    uses = USES.findall(src)
    if PRELUDE in uses or len(set(uses)) != len(uses):
        raise ValueError(f"a script names a lib/ piece twice, or the prelude: {uses}")
    text = "".join(library(lib) for lib in (PRELUDE, *uses)) + src
    return inline(text) if inlined else text


@cache
def compiled() -> dict[str, str]:
    """Every script as Redis runs it: the era prelude (``status.prelude``), then ``body``
    (the shared prelude and the pieces it names on a ``-- uses: lib/<name>.lua`` line, then
    the file: all in front of its first line, so line numbers are kept), then the epilogue
    after its last line (the reply with the job's clock: ``status.py``); status codes
    written as numbers (``status.inline``)."""
    head = prelude()
    return {
        name: head + body(name) + ("" if src.endswith("\n") else "\n") + EPILOGUE
        for name, src in sources().items()
    }


def _read(conn: Any) -> Any:
    """One reply from a connection; an error reply returned, not raised (the replies after it
    are still to be read)."""
    try:
        return conn.read_response()
    except ResponseError as exc:
        return exc


def check(reply: Sequence[Any], context: Context | Callable[[], Context]) -> list[Any]:
    """Raise the exception for a non-zero status code; return the rest of the reply.

    ``context`` (a dict of ids, or a function returning one) fills the exception, with the
    reply after the code added as ``payload``.

    Raises:
        StrataError: the mapped exception.
        RuntimeError: an unknown status code (a script and ``Status`` disagree).
    """
    try:
        status = Status(int(reply[0]))
    except ValueError:
        raise RuntimeError(f"unknown status code from a strata_redis script: {reply!r}") from None
    if status is Status.OK:
        return list(reply[1:])
    ids = context() if callable(context) else context
    raise from_status(status, {**ids, "payload": list(reply[1:])})


class Scripts:
    """The scripts registered on one client (EVALSHA, reloaded after NOSCRIPT by redis-py)."""

    def __init__(self, client: redis.Redis | RedisCluster) -> None:
        self._client = client
        self._scripts: dict[str, Script] = {
            name: client.register_script(src) for name, src in compiled().items()
        }

    @property
    def client(self) -> redis.Redis | RedisCluster:
        """The client the scripts are registered on."""
        return self._client

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

    def call_and_wait(
        self,
        name: str,
        keys: Sequence[str],
        args: Sequence[Any],
        waits: Sequence[Sequence[Any]],
        again: Callable[[Any, list[Any]], Sequence[Sequence[Any]] | None] | None = None,
    ) -> tuple[Any, list[Any]]:
        """Run one script, then the ``waits`` (``WAIT``, ``WAITAOF``) on the same connection,
        in one round trip; while ``again`` (given the script's reply and the waits' replies)
        returns commands, send
        those on that connection too (a ``WAIT`` counts the writes of its own connection only,
        so a second ask must use the first one's).

        Returns:
            The script's raw reply, and the last waits' replies (an error reply among them is
            returned, not raised: ``again`` or the caller judges it).
        """
        script = self._scripts[name]
        call = ("EVALSHA", script.sha, len(keys), *keys, *args)
        # (a context refuses waits with a Redis Cluster client: one node, one connection)
        pool = self._client.connection_pool  # type: ignore[union-attr]
        conn = pool.get_connection()
        in_flight = False  # a reply not read yet: the connection cannot be reused
        try:
            for attempt in range(2):
                in_flight = True
                conn.send_packed_command(conn.pack_commands([call, *waits]))
                reply, *replies = [_read(conn) for _ in range(1 + len(waits))]
                in_flight = False
                if attempt == 0 and isinstance(reply, NoScriptError):
                    self._client.script_load(script.script)
                    continue
                break
            if isinstance(reply, Exception):
                raise reply
            while again is not None and (more := again(reply, replies)):
                in_flight = True
                conn.send_packed_command(conn.pack_commands(list(more)))
                replies = [_read(conn) for _ in more]
                in_flight = False
            return reply, replies
        finally:
            if in_flight:
                conn.disconnect()
            pool.release(conn)

    def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """Run several scripts in one round trip; return their raw replies (codes unchecked).

        Uses EVALSHA directly: redis-py's pipeline would first send SCRIPT EXISTS, a second
        round trip. After a ``SCRIPT FLUSH`` (NOSCRIPT), the scripts are loaded and the batch
        is sent again; scripts must therefore be safe to repeat (ours are). With Redis
        Cluster (redis-py refuses EVALSHA in a cluster pipeline) they go one after another.
        """
        if isinstance(self._client, RedisCluster):
            return [self.call(name, keys, args) for name, keys, args in calls]
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

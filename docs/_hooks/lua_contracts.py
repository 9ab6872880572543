"""MkDocs hook: the Lua scripts' contracts, read from lua/ at build time.

`docs/reference/lua.md` holds the marker `<!-- lua-contracts -->`; this hook replaces it with
one section per script in `lua/` (and `lua/lib/`): its name and its opening comment block,
the contract (`-- KEYS[1] = ...`, `-- ARGV[1] = ...`, `-- returns ...`). The page can never
drift from the scripts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MARKER = "<!-- lua-contracts -->"
LUA = Path(__file__).resolve().parents[2] / "lua"


def contract(path: Path) -> str:
    """The script's opening comment block, without the comment dashes."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("--"):
            break
        lines.append(line[2:].removeprefix(" "))
    return "\n".join(lines)


def section(path: Path, level: str) -> str:
    name = path.relative_to(LUA).as_posix()
    return f"{level} `{name}`\n\n```text\n{contract(path)}\n```\n"


def render() -> str:
    parts = [section(p, "###") for p in sorted(LUA.glob("*.lua"))]
    parts.append("## Shared fragments (`lua/lib/`)\n")
    parts += [section(p, "###") for p in sorted((LUA / "lib").glob("*.lua"))]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())

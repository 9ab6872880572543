"""The run's history: every process appends what it did, one JSON object a line, to a file of
its own (a process killed with -9 loses at most the line it was writing)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["History", "read_history"]


class History:
    """Appends events to ``path`` (created), each with the process (``who``), its pid and
    the wall time."""

    def __init__(self, path: Path, who: str) -> None:
        self.who = who
        self._file = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        self._pid = os.getpid()

    def add(self, event: str, **fields: Any) -> None:
        """Append one event (``fields``: JSON values)."""
        line = {"ev": event, "who": self.who, "pid": self._pid, "t": time.time(), **fields}
        self._file.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self._file.close()


def read_history(folder: Path) -> list[dict[str, Any]]:
    """Every event of every file in ``folder``, in time order (a torn last line skipped)."""
    events: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # the line a killed process was writing
    events.sort(key=lambda e: float(e["t"]))
    return events

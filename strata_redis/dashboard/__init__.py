"""The status dashboard: a Flask page, ``GET /api/dashboard``, ``/metrics``; read-only.

``DashboardState.read`` returns a typed ``Snapshot`` of a job (or of every job);
``document.document`` shapes it into the JSON of ``GET /api/dashboard`` and ``strata status --json``
(``schema.json``). ``create_app`` and ``serve`` need the ``dashboard`` extra (``pip install
'strata-redis[dashboard]'``: Flask, waitress, prometheus-client); the rest needs nothing
more than the core.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from strata_redis.errors import JobNotFoundError

from .snapshot import Snapshot
from .state import DashboardState

if TYPE_CHECKING:
    from .app import create_app
    from .serving import serve

__all__ = ["DashboardState", "JobNotFoundError", "Snapshot", "create_app", "serve"]

_LAZY = {"create_app": ".app", "serve": ".serving"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(_LAZY[name], __name__)
    except ImportError as exc:
        raise ImportError(
            f"strata_redis.dashboard.{name} needs the dashboard extra: "
            f"pip install 'strata-redis[dashboard]' ({exc})"
        ) from exc
    return getattr(module, name)

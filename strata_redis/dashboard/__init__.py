"""The status dashboard: a Flask page, ``GET /api/dashboard``, ``/metrics``; read-only.

``create_app`` and ``serve`` need the ``dashboard`` extra (``pip install
'strata-redis[dashboard]'``: Flask, waitress, prometheus-client); ``state`` (the document
itself, also behind ``strata status --json``) needs nothing more than the core.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .state import DashboardState, JobNotFoundError

if TYPE_CHECKING:
    from .app import create_app
    from .serving import serve

__all__ = ["DashboardState", "JobNotFoundError", "create_app", "serve"]

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

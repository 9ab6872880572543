"""The ``strata`` command (``python -m strata_redis``): ``demo``, ``status``, ``jobs``,
``events``, ``doctor``, ``dashboard``.

``main.py`` parses the arguments and turns errors into exit codes, ``commands.py`` runs
each command, ``views.py`` and ``feed.py`` are the terminal views of ``strata status`` (the
dashboard's snapshot as text) and ``strata events`` (a job's event feed).
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]

"""``python -m strata_redis`` is the ``strata`` command."""

from .cli import main

raise SystemExit(main())

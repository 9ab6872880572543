"""The fault checker: real worker processes under a fault schedule drawn from a seed, a
recorded history, and a checker of the whole history (``python -m strata_redis.chaos``).

A tool, run as a command: it offers no names to import (``__all__`` is empty); its modules
(``run``, ``schedule``, ``topology``, ``worker``, ``history``, ``checker``, ``proxy``) are its
own.
"""

__all__: list[str] = []

"""Coordination: the worker registry and heartbeats, named barriers, the elastic rendezvous,
epochs, and a job's lifecycle in Redis.

``__all__`` is what other packages and users may import from here: the classes a ``Job``
hands out (``Worker``, ``Barrier``, ``Rendezvous``, ...), and the owner modules other
packages call or read through with their ``queue_x``/``take_x`` pairs (``epochs``,
``heartbeats``, ``latency``, ``lifecycle``, ``registry``, ``rendezvous``, ``workers``).
``waiters`` (the barrier's wake-ups) is this package's own.
"""

from . import epochs, heartbeats, latency, lifecycle, registry, rendezvous, workers
from .barrier import LIVE, Barrier, BarrierState, Release
from .latency import BarrierLatency
from .registry import WorkerInfo
from .rendezvous import Rendezvous, Round
from .workers import Worker

__all__ = [
    "LIVE",
    "Barrier",
    "BarrierLatency",
    "BarrierState",
    "Release",
    "Rendezvous",
    "Round",
    "Worker",
    "WorkerInfo",
    "epochs",
    "heartbeats",
    "latency",
    "lifecycle",
    "registry",
    "rendezvous",
    "workers",
]

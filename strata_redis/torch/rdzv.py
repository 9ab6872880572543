"""A ``torchrun`` rendezvous backend over strata's Redis rendezvous: ``--rdzv-backend strata``.

::

    torchrun --nnodes 1:4 --nproc-per-node 8 --rdzv-backend strata \\
        --rdzv-endpoint redis://redis-host:6379/0 --rdzv-id my-job train.py

Each torchrun agent is one strata worker of the job ``<--rdzv-id>.agents``
(``identity.agents_job``: a job of the agents' own, so trainers whose orchestrators take the
default job, torchrun's run id, never join the agents' rendezvous; registered with
``replace=True``, heartbeating from the agent); ``next_rendezvous`` joins the next strata round
(``Rendezvous.join``, leaving the previous round when called again after a failure or to admit
waiting agents). The round's ``RedisStore`` (one hash of the job) is the agents' store, so no
store server is needed for the rendezvous itself. The trainers get ``MASTER_ADDR``/``MASTER_PORT``
of a TCPStore that their global rank 0 starts (``use_agent_store`` is False: the agents' store
is in Redis, which ``env://`` cannot reach): ``MASTER_ADDR`` is ``--local-addr`` of the
agent of round rank 0 (default: its FQDN), the port a free one on that host.

``--rdzv-conf`` keys: ``last_call_timeout`` (s, default 30), ``join_timeout`` (s, default 600),
``keep_alive_interval`` (s between heartbeats, default 2), ``keep_alive_max_attempt``
(missed heartbeats before the agent is declared failed, default 5), ``store_timeout``
(s the agents' store waits for a key, default 300), ``worker_id`` (this agent's strata worker
id; default ``<hostname>-pid-<pid>``, ``identity.worker_id``; give a stable one so a restarted
agent replaces its previous incarnation at once instead of after the heartbeat timeout).
``--rdzv-id`` is required: torchrun's default (``none``) would be one job shared by every
launch that omits it.

What torchrun's own (c10d) handler promises and this one keeps: an agent beyond max nodes
while a round runs at max nodes is a spare: it waits (with no ``join_timeout``) uncounted by
``num_nodes_waiting``, and takes the place of a member that is lost; ``shutdown`` (torchrun
calls it when a run ends) ends the rendezvous, so a spare still waiting exits quietly
(``RendezvousGracefulExitError``) and an agent started later with the same ``--rdzv-id``
gets ``RendezvousClosedError``; ``set_closed``/``is_closed`` set and read that same state.

Registered for torchrun by the ``torchrun.handlers`` entry point ``strata``: torch loads
``handler_creator`` and calls it with no arguments to get ``create_handler``.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any, Final

import redis as redis_py
from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)

from .. import identity
from ..context import JobContext
from ..coordination.rendezvous import Rendezvous, Round
from ..coordination.workers import Worker, register_worker
from ..errors import RendezvousEndedError, StrataError
from ..errors import RendezvousTimeoutError as StrataRendezvousTimeoutError
from .distributed import RedisStore

__all__ = ["BACKEND", "StrataRendezvousHandler", "create_handler", "handler_creator"]

log = logging.getLogger(__name__)

#: the name torchrun knows this backend by (``--rdzv-backend strata``)
BACKEND: Final = "strata"


def _float(params: RendezvousParameters, key: str, default: float) -> float:
    value = params.get(key, None)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"--rdzv-conf {key} must be a number of seconds, got {value!r}") from None
    if not number > 0:
        raise ValueError(f"--rdzv-conf {key} must be positive, got {value!r}")
    return number


def _context(params: RendezvousParameters, heartbeat_timeout: float) -> JobContext:
    endpoint = (params.endpoint or "").strip()
    if not endpoint:
        raise ValueError(
            "--rdzv-backend strata needs --rdzv-endpoint: a Redis URL (redis://host:6379/0) "
            "or host:port"
        )
    if params.run_id in ("", identity.TORCHRUN_DEFAULT_RUN_ID):
        raise ValueError(
            "--rdzv-backend strata needs --rdzv-id (the job id): torchrun's default "
            f"{params.run_id!r} would be one job shared by every launch that omits it"
        )
    try:
        job = identity.agents_job(params.run_id)
        ctx = JobContext(endpoint, job, heartbeat_timeout=heartbeat_timeout)
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"--rdzv-backend strata: bad --rdzv-endpoint or --rdzv-id: {exc}"
        ) from None
    try:
        ctx.client.ping()
    except redis_py.RedisError as exc:
        raise RendezvousConnectionError(
            f"--rdzv-backend strata: cannot reach Redis at --rdzv-endpoint {endpoint!r}: {exc}"
        ) from exc
    return ctx


class StrataRendezvousHandler(RendezvousHandler):  # type: ignore[misc]
    """One torchrun agent's view of a strata rendezvous (see the module doc).

    Args:
        ctx: the agents' job (``<--rdzv-id>.agents``) on the Redis of ``--rdzv-endpoint``.
        rendezvous: the job's rendezvous with this agent's limits.
        worker_id: this agent's strata worker id.
        local_addr: the address trainers reach this host at, if it hosts rank 0
            (None: its FQDN).
        heartbeat_interval: seconds between the agent's heartbeats.
        store_timeout: seconds the round's store waits for a key.
    """

    def __init__(
        self,
        ctx: JobContext,
        rendezvous: Rendezvous,
        worker_id: str,
        *,
        local_addr: str | None = None,
        heartbeat_interval: float = 2.0,
        store_timeout: float = 300.0,
    ) -> None:
        self.context = ctx
        self.rendezvous = rendezvous
        self.worker_id = worker_id
        self.local_addr = local_addr
        self.heartbeat_interval = heartbeat_interval
        self.store_timeout = store_timeout
        self.worker: Worker | None = None
        self.round: Round | None = None

    def __repr__(self) -> str:
        return (
            f"StrataRendezvousHandler(job={self.context.job_id!r}, worker={self.worker_id!r}, "
            f"round={self.round.number if self.round else 0})"
        )

    # -- the RendezvousHandler interface ----------------------------------------------------
    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        # the agents' store is a Redis hash: trainers' env:// cannot reach it, so the
        # trainers' rank 0 hosts a TCPStore at MASTER_ADDR/MASTER_PORT
        return False

    def get_run_id(self) -> str:
        # torchrun's run id (--rdzv-id), not the agents' job it names
        return self.context.job_id.removesuffix(identity.AGENTS_SUFFIX)

    def next_rendezvous(self) -> RendezvousInfo:
        if self.is_closed():
            raise RendezvousClosedError(
                f"the strata rendezvous of job {self.context.job_id!r} is closed"
            )
        worker = self._live_worker()
        leaving = self.round.number if self.round is not None else 0
        try:
            round_ = self.rendezvous.join(
                self.worker_id, worker.incarnation, leaving=leaving, spare_waits=True
            )
        except RendezvousEndedError as exc:
            if exc.spare:  # the job finished without this spare: torchrun exits quietly
                raise RendezvousGracefulExitError(str(exc)) from exc
            raise RendezvousClosedError(str(exc)) from exc
        except StrataRendezvousTimeoutError as exc:
            raise RendezvousTimeoutError(str(exc)) from exc
        except (StrataError, redis_py.RedisError) as exc:
            raise RendezvousError(
                f"strata rendezvous of job {self.context.job_id!r}: {exc}"
            ) from exc
        self.round = round_
        log.info(
            "strata rendezvous: job %r, worker %r: round %d, rank %d of %d",
            self.context.job_id, self.worker_id, round_.number, round_.rank, round_.world_size,
        )  # fmt: skip
        store = RedisStore(self.context, round_.number, timeout=self.store_timeout)
        bootstrap = RendezvousStoreInfo.build(round_.rank, store, self.local_addr)
        return RendezvousInfo(store, round_.rank, round_.world_size, bootstrap)

    def is_closed(self) -> bool:
        return self.rendezvous.ended()

    def set_closed(self) -> None:
        self.rendezvous.end()

    def num_nodes_waiting(self) -> int:
        """Agents that could join a round after ours: arrived while it ran and it is below
        max nodes, or in a newer round that is collecting members (opened by an agent that
        re-joined after a failure). Spares behind a round at max nodes are not counted
        (torch's redundancy list): counting them would restart the members' workers over and
        over for a round that cannot admit them. Nor is an agent that died while it waited:
        its place goes stale after the heartbeat timeout (``Rendezvous.waiting``)."""
        return self.rendezvous.waiting(self.round.number if self.round is not None else 0)

    def shutdown(self) -> bool:
        """The run is over: end the rendezvous for good (a later agent with this run id gets
        ``RendezvousClosedError``, a waiting spare exits), and this agent's worker leaves the
        job. False if Redis could not be told (as torch's handlers, it does not raise)."""
        worker, self.worker = self.worker, None
        try:
            self.rendezvous.end()
        except redis_py.RedisError as exc:
            log.warning("strata rendezvous: job %r: could not end the rendezvous: %s",
                        self.context.job_id, exc)  # fmt: skip
            return False
        finally:
            if worker is not None:
                worker.leave()
        return True

    # -- plumbing ---------------------------------------------------------------------------
    def _live_worker(self) -> Worker:
        worker = self.worker
        if worker is not None and worker.lost is None and worker.heartbeating:
            return worker
        if worker is not None:  # declared failed (a long pause?): come back as a new incarnation
            log.warning("strata rendezvous: worker %r lost (%s); registering again",
                        self.worker_id, worker.lost)  # fmt: skip
            worker.stop_heartbeat()
            self.round = None
        try:
            self.worker = register_worker(
                self.context, self.worker_id, host=socket.gethostname(), address=self.local_addr,
                replace=True, heartbeat_interval=self.heartbeat_interval,
            )  # fmt: skip
        except (StrataError, redis_py.RedisError) as exc:
            raise RendezvousConnectionError(
                f"strata rendezvous: cannot register worker {self.worker_id!r} in job "
                f"{self.context.job_id!r}: {exc}"
            ) from exc
        return self.worker


def create_handler(params: RendezvousParameters) -> StrataRendezvousHandler:
    """The torchrun handler for ``params`` (``--rdzv-endpoint``: Redis, ``--rdzv-id``: job).

    Raises:
        ValueError: no or a malformed endpoint, a bad job id or ``--rdzv-conf`` value.
        RendezvousConnectionError: Redis does not answer at the endpoint.
    """
    interval = _float(params, "keep_alive_interval", 2.0)
    attempts = params.get_as_int("keep_alive_max_attempt", 5)
    if attempts is None or attempts < 1:
        raise ValueError(f"--rdzv-conf keep_alive_max_attempt must be >= 1, got {attempts!r}")
    ctx = _context(params, heartbeat_timeout=interval * (attempts + 0.5))
    # an agent is no rank (an outer launcher's RANK is not its own): host name and pid
    worker_id = params.get("worker_id", None) or identity.worker_id({})
    rendezvous = Rendezvous(
        ctx, min_workers=params.min_nodes, max_workers=params.max_nodes,
        last_call=_float(params, "last_call_timeout", 30.0),
        timeout=_float(params, "join_timeout", 600.0),
    )  # fmt: skip
    return StrataRendezvousHandler(
        ctx, rendezvous, str(worker_id), local_addr=params.local_addr,
        heartbeat_interval=interval, store_timeout=_float(params, "store_timeout", 300.0),
    )  # fmt: skip


def handler_creator() -> Callable[[RendezvousParameters], Any]:
    """The ``torchrun.handlers`` entry point: torch calls it with no arguments and registers
    what it returns as the creator of ``--rdzv-backend strata`` handlers."""
    return create_handler

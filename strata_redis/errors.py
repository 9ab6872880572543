"""Every exception strata_redis raises, under one root.

The tree::

    StrataError                     root: catch this to catch everything of ours
    ├── WorkerError                 .job_id, .worker_id
    │   ├── WorkerNotRegisteredError    the id was never registered (or its record was deleted)
    │   ├── WorkerExistsError           .holder_host, .holder_pid: held alive; replace=True takes it
    │   ├── WorkerFailedError           declared failed by the reaper: re-register to come back
    │   ├── WorkerLeftError             deregistered: re-register to come back
    │   └── WorkerReplacedError         a newer registration of the same id took over
    ├── BarrierError                .job_id, .barrier
    │   ├── BarrierTimeoutError         .missing: the workers that did not arrive
    │   └── BarrierBrokenError          .culprit, .reason: a member failed or aborted
    ├── RendezvousError             .job_id, .round
    │   ├── RoundBrokenError            .culprit, .reason: a member failed or left; rejoin
    │   ├── RoundRestartedError         .worker_id: the rejoined round is fresh (no member
    │   │                                   holds the state): restart the process
    │   ├── RendezvousTimeoutError      .joined, .needed: too few workers joined in time
    │   ├── RendezvousEndedError        .spare: the rendezvous was ended for good (``end``)
    │   └── RestartLimitError           .restarts: more failure restarts than max_restarts
    ├── DatasetError                .job_id, .dataset
    │   ├── DatasetNotFoundError
    │   ├── DatasetConflictError        same name registered with other parameters
    │   └── EpochUnfinishedError        .epoch, .remaining: shards left undone at an epoch's end
    ├── LeaseError                  .job_id, .dataset, .epoch, .shard_id
    │   └── LeaseLostError              the lease expired, was taken over, or its token is stale
    ├── RedisUnavailableError       .job_id, .seconds: unreachable past ``redis_retry``
    │                                   (also a ``redis.ConnectionError``)
    ├── RedisMemoryFullError        .job_id, .seconds: Redis is at ``maxmemory`` and evicts
    │                                   nothing, past ``redis_retry`` (also a
    │                                   ``redis.exceptions.OutOfMemoryError``)
    ├── StateLostError              .job_id, .era, .found: the job's state in Redis was lost
    │   ├── StateRolledBackError        .clock, .seen: it went back (failover, older snapshot)
    │   └── JobLayoutError              .layout, .expected: written in another layout (version)
    ├── PoolExhaustedError          every pooled connection of this process stayed busy: a
    │                                   limit of the process, not of Redis (also a
    │                                   ``redis.exceptions.MaxConnectionsError``)
    ├── RedisConfigError            Redis is set up so that it could break a guarantee
    ├── NotReplicatedError          .job_id, .operation, .acked, .needed: applied, but no
    │                                   replica confirmed it (``durability="replicated"``)
    ├── StorageError                .backend, .path (never credentials)
    │   ├── StorageNotFoundError        the object does not exist
    │   └── StorageExistsError          a create-only write found the object already there
    ├── ShardError                  .dataset, .path: a dataset's shard object is not as indexed
    │   ├── ShardChecksumError          its bytes' checksum is not the index's
    │   ├── ShardFormatError            not the tar its index says (truncated, no header there)
    │   └── ShardManifestError          the manifest and the shard objects in storage disagree
    ├── CheckpointError             .job_id, .step, .epoch
    │   ├── CheckpointAbortedError      a participant's upload failed: it never commits
    │   ├── CheckpointNotFoundError     no committed checkpoint verifies
    │   └── StepNotForwardError         not after the newest checkpoint (also a ValueError)
    ├── PortError                   .host, .port, .in_use: the dashboard cannot listen there
    └── JobNotFoundError            .job_id: the dashboard or the CLI was given no such job
                                        (also an ``OSError``)

    Preempted                       outside the tree, a ``SystemExit``: the loop was preempted
                                        and left (.code 0, or 75 past its budget), so an
                                        uncaught one ends the process with that code

A refusal from a Lua script is a ``Status`` code; ``from_status`` turns it into the
exception, each class building its own message from the caller's ids (``refused``). This
module only formats what it is given: what a value in Redis means (the era key's marks of a
rolled-back or partly lost state) is read by that value's owner (``era.py``), which hands the
pieces to the class.

Bad arguments raise the builtin ``ValueError``/``TypeError`` naming the argument and the
value, and errors from redis-py (``redis.exceptions.RedisError``) pass through unwrapped,
but for two faults of Redis itself that every caller must tell apart: an outage that
outlasted the retry budget and a full memory. Each of their classes also subclasses the
redis-py error it replaces, so handlers written for redis-py's classes still catch them.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError, OutOfMemoryError

from .status import Status

#: the ids of a failed call (job_id, worker_id, step, ...) plus ``payload``: the reply after
#: the status code
Context = dict[str, Any]

__all__ = [
    "BarrierBrokenError",
    "BarrierError",
    "BarrierTimeoutError",
    "CheckpointAbortedError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "DatasetConflictError",
    "DatasetError",
    "DatasetNotFoundError",
    "EpochUnfinishedError",
    "JobLayoutError",
    "JobNotFoundError",
    "LeaseError",
    "LeaseLostError",
    "NotReplicatedError",
    "PoolExhaustedError",
    "PortError",
    "RedisConfigError",
    "RedisMemoryFullError",
    "RedisUnavailableError",
    "RendezvousEndedError",
    "RendezvousError",
    "RendezvousTimeoutError",
    "RestartLimitError",
    "RoundBrokenError",
    "RoundRestartedError",
    "ShardChecksumError",
    "ShardError",
    "ShardFormatError",
    "ShardManifestError",
    "StateLostError",
    "StateRolledBackError",
    "StepNotForwardError",
    "StorageError",
    "StorageExistsError",
    "StorageNotFoundError",
    "StrataError",
    "WorkerError",
    "WorkerExistsError",
    "WorkerFailedError",
    "WorkerLeftError",
    "WorkerNotRegisteredError",
    "WorkerReplacedError",
]


class StrataError(Exception):
    """Root of every strata_redis error."""


class WorkerError(StrataError):
    """A worker-registry error about one worker of one job."""

    #: what the message says happened to the worker (each subclass its own)
    what = "was refused"

    def __init__(self, message: str, *, job_id: str, worker_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.worker_id = worker_id

    @classmethod
    def refused(cls, c: Context) -> WorkerError:
        """The error for a script's refusal, from the caller's ids."""
        return cls(
            f"worker {c['worker_id']!r} of job {c['job_id']!r} {cls.what}",
            job_id=c["job_id"],
            worker_id=c["worker_id"],
        )


class WorkerNotRegisteredError(WorkerError):
    """The worker id is not registered in this job."""

    what = "is not registered"


class WorkerExistsError(WorkerError):
    """The worker id is registered and its holder alive; ``replace=True`` takes it over.

    A holder that is stale (silent past the heartbeat timeout, or its process gone on the
    registering process's host) is taken over without it: this error means the holder
    looked alive.

    Attributes:
        holder_host, holder_pid: where the live registration was made (None if unknown:
            made before pids were recorded, or the context did not say).
        last_seen_s: seconds since the holder's last heartbeat, on Redis' clock (None if
            the context did not say).
    """

    what = "is already registered and alive (pass replace=True to take it)"

    def __init__(
        self,
        message: str,
        *,
        job_id: str,
        worker_id: str,
        holder_host: str | None = None,
        holder_pid: int | None = None,
        last_seen_s: float | None = None,
    ) -> None:
        super().__init__(message, job_id=job_id, worker_id=worker_id)
        self.holder_host = holder_host
        self.holder_pid = holder_pid
        self.last_seen_s = last_seen_s

    @classmethod
    def refused(cls, c: Context) -> WorkerExistsError:
        """The id is live (``WORKER_EXISTS``); ``c['holder']``: the holder's (host, pid);
        ``c['last_seen_s']``, ``c['timeout_s']``: its heartbeat's age and the timeout it is
        within; ``c['process']``: what this host knows of its process (a phrase)."""
        host, pid = c.get("holder") or (None, None)
        where = f"on host {host!r}" if host is not None else "on an unknown host"
        who = f"process {pid}" if pid is not None else "a process of unknown pid"
        seen, timeout = c.get("last_seen_s"), c.get("timeout_s")
        why = []
        if seen is not None:
            why.append(f"its last heartbeat {seen:.3g} s ago" + (
                f", within the heartbeat timeout of {timeout:g} s" if timeout is not None else ""
            ))  # fmt: skip
        if c.get("process"):
            why.append(str(c["process"]))
        return cls(
            f"worker {c['worker_id']!r} of job {c['job_id']!r} is already registered and alive, "
            f"held by {who} {where}" + (f" ({'; '.join(why)})" if why else "") + "; that "
            "worker is untouched. A relaunch takes the id over by itself once its holder is "
            "stale (silent past the heartbeat timeout, or its process gone on the relaunch's "
            "host). Choose another worker_id (or none: one is derived per process), or pass "
            "replace=True to take the id over now (a restart of that worker; the holder is "
            "refused at its next heartbeat)",
            job_id=c["job_id"],
            worker_id=c["worker_id"],
            holder_host=host,
            holder_pid=pid,
            last_seen_s=seen,
        )


class WorkerFailedError(WorkerError):
    """The reaper declared this worker failed; it must re-register to take part again."""

    what = "was declared failed; register it again to rejoin"


class WorkerLeftError(WorkerError):
    """The worker deregistered; it must re-register to take part again."""

    what = "has left; register it again to rejoin"


class WorkerReplacedError(WorkerError):
    """A newer registration of the same worker id superseded this handle."""

    what = "was replaced by a newer registration of the same id"


class BarrierError(StrataError):
    """A barrier error about one barrier of one job."""

    def __init__(self, message: str, *, job_id: str, barrier: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.barrier = barrier

    @classmethod
    def moved(cls, c: Context) -> BarrierError:
        """The barrier went to another generation during the arrival (``BARRIER_MOVED``)."""
        return cls(
            f"barrier {c['barrier']!r} of job {c['job_id']!r} moved to generation "
            f"{c['payload'][0]} while worker {c['worker_id']!r} was arriving (retry the call)",
            job_id=c["job_id"],
            barrier=c["barrier"],
        )

    @classmethod
    def mismatch(cls, c: Context) -> BarrierError:
        """The arrival's ``expected`` differs from the generation's (``BARRIER_MISMATCH``)."""
        return cls(
            f"barrier {c['barrier']!r} of job {c['job_id']!r} generation {c['payload'][0]} was "
            f"opened with expected={c['payload'][1]!r}; worker {c['worker_id']!r} passed "
            f"expected={c['expected']!r} (every participant must pass the same)",
            job_id=c["job_id"],
            barrier=c["barrier"],
        )


class BarrierTimeoutError(BarrierError):
    """The barrier did not release within the timeout.

    Attributes:
        missing: ids of the live workers that had not arrived (up to 100 of them).
        missing_count: how many arrivals were missing (a count barrier may miss workers
            that are not registered yet, so this can exceed ``len(missing)``).
        generation: the barrier generation that timed out (pass it to ``reset``).
    """

    def __init__(
        self,
        message: str,
        *,
        job_id: str,
        barrier: str,
        missing: list[str],
        generation: int,
        missing_count: int | None = None,
    ) -> None:
        super().__init__(message, job_id=job_id, barrier=barrier)
        self.missing = missing
        self.generation = generation
        self.missing_count = len(missing) if missing_count is None else missing_count


class BarrierBrokenError(BarrierError):
    """A member of the barrier failed or aborted, so this generation can never release.

    Attributes:
        culprit: the worker that failed or aborted.
        reason: why (``"failed"`` for a worker the reaper declared failed, else the abort reason).
        generation: the barrier generation that broke (pass it to ``reset``).
    """

    def __init__(
        self, message: str, *, job_id: str, barrier: str, culprit: str, reason: str, generation: int
    ) -> None:
        super().__init__(message, job_id=job_id, barrier=barrier)
        self.culprit = culprit
        self.reason = reason
        self.generation = generation


class RendezvousError(StrataError):
    """An elastic-rendezvous error about one round of one job."""

    def __init__(self, message: str, *, job_id: str, round: int) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.round = round

    @classmethod
    def moved(cls, c: Context) -> RendezvousError:
        """The rendezvous is at another round than the caller named (``ROUND_MOVED``)."""
        return cls(
            f"the rendezvous of job {c['job_id']!r} moved from round {c['round']} to round "
            f"{c['payload'][0]} (join again)",
            job_id=c["job_id"],
            round=int(c["payload"][0]),
        )


class RoundBrokenError(RendezvousError):
    """A member of this round failed, left or was replaced, or the round was superseded:
    the round is over for everyone in it, and its members rendezvous again.

    Attributes:
        culprit: the member that failed or left ("" when the round was superseded).
        reason: ``failed``, ``left``, ``replaced`` or ``superseded`` (a newer round opened,
            e.g. to admit workers that arrived late).
    """

    def __init__(self, message: str, *, job_id: str, round: int, culprit: str, reason: str) -> None:
        super().__init__(message, job_id=job_id, round=round)
        self.culprit = culprit
        self.reason = reason

    @classmethod
    def because(cls, job_id: str, round: int, culprit: str, reason: str) -> RoundBrokenError:
        """Round ``round`` ended because ``culprit`` ``reason`` (failed, left, ...)."""
        if reason == "superseded":
            what = "was superseded by a newer round"
        else:
            what = f"ended: member {culprit!r} {reason}"
        return cls(
            f"rendezvous round {round} of job {job_id!r} {what}; its members must rendezvous "
            "again (the orchestrator does so by itself when elastic=True)",
            job_id=job_id,
            round=round,
            culprit=culprit,
            reason=reason,
        )

    @classmethod
    def refused(cls, c: Context) -> RoundBrokenError:
        """The round is over (``ROUND_BROKEN``; payload: culprit, reason)."""
        return cls.because(c["job_id"], int(c["round"]), str(c["payload"][0]), c["payload"][1])


class RoundRestartedError(RendezvousError):
    """The round this worker rejoined, after its last one broke, is fresh: no member holds
    the job's state. Every member that held it was lost before this worker passed an epoch
    barrier with them (it joined the running job, and may never have got the state from
    them), so the job restarts from its newest checkpoint, as a relaunch does; a loop cannot
    put its model back in place. Let the process exit (``close()`` the orchestrator, or leave
    its ``with`` block): relaunched, it resumes from that checkpoint (``resumed``).

    Attributes:
        worker_id: this worker.
    """

    def __init__(self, message: str, *, job_id: str, round: int, worker_id: str) -> None:
        super().__init__(message, job_id=job_id, round=round)
        self.worker_id = worker_id

    @classmethod
    def rejoined(cls, job_id: str, round: int, worker_id: str, left: int) -> RoundRestartedError:
        """``worker_id`` left round ``left`` and got round ``round``, a fresh one."""
        return cls(
            f"worker {worker_id!r} of job {job_id!r}: round {round} restarts the job from its "
            f"newest checkpoint: the members of round {left} that held the job's state were "
            "lost before this worker passed an epoch barrier with them, so it may not hold "
            "the state; restart this process to resume from the checkpoint",
            job_id=job_id,
            round=round,
            worker_id=worker_id,
        )


class RendezvousTimeoutError(RendezvousError):
    """Too few workers joined a round within the rendezvous timeout.

    Attributes:
        joined: the workers that had joined.
        needed: ``min_workers``.
    """

    def __init__(
        self, message: str, *, job_id: str, round: int, joined: list[str], needed: int
    ) -> None:
        super().__init__(message, job_id=job_id, round=round)
        self.joined = joined
        self.needed = needed

    @classmethod
    def after(
        cls,
        job_id: str,
        round: int,
        joined: list[str],
        needed: int,
        timeout: float,
        count: int | None = None,
    ) -> RendezvousTimeoutError:
        """Round ``round`` did not close within ``timeout`` seconds; ``joined`` names the
        joiners (or the first of ``count``)."""
        count = len(joined) if count is None else count
        names = f"{joined}" if count == len(joined) else f"first {len(joined)}: {joined}"
        return cls(
            f"rendezvous round {round} of job {job_id!r} did not close within {timeout}s: "
            f"{count} of the min_workers={needed} joined ({names})",
            job_id=job_id,
            round=round,
            joined=joined,
            needed=needed,
        )


class RendezvousEndedError(RendezvousError):
    """The rendezvous was ended for good (``Rendezvous.end``, torchrun's ``shutdown`` when a
    run is over): no round forms any more, so a late or leftover joiner stops.

    Attributes:
        spare: the joiner had been waiting as a spare (the running round was at
            ``max_workers``) when the rendezvous ended: its job finished without it.
    """

    def __init__(self, message: str, *, job_id: str, round: int, spare: bool) -> None:
        super().__init__(message, job_id=job_id, round=round)
        self.spare = spare

    @classmethod
    def refused(cls, c: Context) -> RendezvousEndedError:
        """The rendezvous is ended (``RENDEZVOUS_ENDED``); ``c['spare']``: the joiner waited
        as a spare."""
        spare = bool(c.get("spare", False))
        who = f"worker {c.get('worker_id', '?')!r}"
        what = f"{who} waited as a spare, its job is over" if spare else f"{who} cannot join"
        return cls(
            f"the rendezvous of job {c['job_id']!r} was ended for good at round {c['round']}: "
            f"{what} (a new run needs a new job id)",
            job_id=c["job_id"],
            round=int(c["round"]),
            spare=spare,
        )


class RestartLimitError(RendezvousError):
    """More rounds were restarted by failures than ``max_restarts`` allows.

    Attributes:
        restarts: the failure restarts so far (growth restarts are not counted).
    """

    def __init__(self, message: str, *, job_id: str, round: int, restarts: int) -> None:
        super().__init__(message, job_id=job_id, round=round)
        self.restarts = restarts

    @classmethod
    def over(cls, job_id: str, round: int, restarts: int, limit: int) -> RestartLimitError:
        """``restarts`` failure restarts exceed ``limit``."""
        return cls(
            f"job {job_id!r} restarted {restarts} rounds after member failures (round {round}), "
            f"more than max_restarts={limit}; rounds restarted to admit new workers do not count",
            job_id=job_id,
            round=round,
            restarts=restarts,
        )


class DatasetError(StrataError):
    """A dataset-registry error about one dataset of one job."""

    def __init__(self, message: str, *, job_id: str, dataset: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.dataset = dataset


class DatasetNotFoundError(DatasetError):
    """No dataset of that name is registered in this job."""

    @classmethod
    def missing(cls, job_id: str, dataset: str) -> DatasetNotFoundError:
        """``dataset`` is not registered; the message says how to register it."""
        return cls(
            f"dataset {dataset!r} is not registered in job {job_id!r}; register it once "
            f"(a launcher or rank 0) before the workers ask for it: "
            f"strata_redis.ShardManager(redis_url, job_id={job_id!r}).register_dataset_params("
            f"{dataset!r}, total_samples, samples_per_shard, shuffle=True, seed=0)",
            job_id=job_id,
            dataset=dataset,
        )


class DatasetConflictError(DatasetError):
    """A dataset of that name is registered with different parameters."""

    @classmethod
    def refused(cls, c: Context) -> DatasetConflictError:
        """Registered with other parameters (``DATASET_CONFLICT``)."""
        return cls(
            f"dataset {c['dataset']!r} of job {c['job_id']!r} is registered with other "
            f"parameters (pass replace=True to replace them)",
            job_id=c["job_id"],
            dataset=c["dataset"],
        )

    @classmethod
    def epoch_mismatch(cls, c: Context) -> DatasetConflictError:
        """The epoch's pool has another shard count (``EPOCH_MISMATCH``)."""
        return cls(
            f"epoch {c['epoch']} of dataset {c['dataset']!r} in job {c['job_id']!r} was started "
            f"with a different number of shards than the dataset has now",
            job_id=c["job_id"],
            dataset=c["dataset"],
        )


class EpochUnfinishedError(DatasetError):
    """An epoch barrier was reached with shards of the epoch neither done nor held by a live
    member of the round (a member that held them died at the epoch's end)."""

    def __init__(
        self, message: str, *, job_id: str, dataset: str, epoch: int, remaining: int
    ) -> None:
        super().__init__(message, job_id=job_id, dataset=dataset)
        self.epoch = epoch
        self.remaining = remaining

    @classmethod
    def at_barrier(
        cls, job_id: str, dataset: str, epoch: int, remaining: int
    ) -> EpochUnfinishedError:
        """``remaining`` shards of ``epoch`` are undone and this worker's walk had ended."""
        return cls(
            f"epoch {epoch} of dataset {dataset!r} in job {job_id!r} has {remaining} shards not "
            "done, and the round changed at the epoch barrier (a member holding them died): "
            "iterate the epoch again (it walks what is left), then call advance_epoch()",
            job_id=job_id, dataset=dataset, epoch=epoch, remaining=remaining,
        )  # fmt: skip


class LeaseError(StrataError):
    """A shard-lease error about one shard of one dataset epoch."""

    def __init__(
        self, message: str, *, job_id: str, dataset: str, epoch: int, shard_id: int
    ) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.dataset = dataset
        self.epoch = epoch
        self.shard_id = shard_id


class LeaseLostError(LeaseError):
    """The lease expired, was granted to another worker, or the fencing token is stale."""

    @classmethod
    def refused(cls, c: Context) -> LeaseLostError:
        """A stale fencing token (``LEASE_LOST``)."""
        return cls(
            f"lease on shard {c['shard_id']} of dataset {c['dataset']!r} epoch {c['epoch']} "
            f"(token {c['token']}) was lost: it expired and was taken back, or was re-granted",
            job_id=c["job_id"],
            dataset=c["dataset"],
            epoch=c["epoch"],
            shard_id=c["shard_id"],
        )


class RedisUnavailableError(StrataError, RedisConnectionError):
    """Redis stayed unreachable (refused, closed, timed out, loading) past the retry budget.

    Blocking calls (barrier and epoch waits, rendezvous, checkpoint waits) and the training
    loop ride out a Redis restart or failover shorter than the job's ``redis_retry``
    seconds, re-issuing what they were doing; this is raised when the budget is spent.
    Also a ``redis.ConnectionError``.

    Attributes:
        job_id: the job.
        seconds: how long the call kept trying.
        what: the call that gave up.
    """

    def __init__(self, message: str, *, job_id: str, seconds: float, what: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.seconds = seconds
        self.what = what

    @classmethod
    def after(
        cls, job_id: str, what: str, seconds: float, cause: BaseException
    ) -> RedisUnavailableError:
        """``what`` of job ``job_id`` gave up after ``seconds`` of ``cause``."""
        return cls(
            f"Redis stayed unreachable for {seconds:.3g}s (the redis_retry budget) while job "
            f"{job_id!r} was in {what}: {type(cause).__name__}: {cause}. Nothing after the "
            "last answered call was done; check that Redis is up and reachable, or raise "
            "redis_retry to ride out longer outages",
            job_id=job_id, seconds=seconds, what=what,
        )  # fmt: skip


class RedisMemoryFullError(StrataError, OutOfMemoryError):
    """Redis refused a write: it is at its ``maxmemory`` limit and evicts nothing.

    With ``maxmemory-policy noeviction`` (the only policy under which a job's state is
    safe) a full Redis refuses every command that would grow it. Scripts check before they
    write, so nothing was half-applied: the call can be repeated once memory is freed (or
    ``maxmemory`` raised). The library's calls wait for that themselves, up to the job's
    ``redis_retry`` seconds (``outage.Outage``), and raise this past it. Also a
    ``redis.exceptions.OutOfMemoryError``.

    Attributes:
        job_id: the job.
        seconds: how long the call waited for memory before giving up (None: it did not
            wait: the refusal itself).
    """

    def __init__(self, message: str, *, job_id: str, seconds: float | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.seconds = seconds

    @classmethod
    def at(
        cls, job_id: str, cause: BaseException, seconds: float | None = None
    ) -> RedisMemoryFullError:
        """The error for redis-py's ``OutOfMemoryError`` ``cause`` in a call of ``job_id``
        (``seconds``: how long the call waited for memory first, if it did)."""
        waited = (
            "" if seconds is None
            else f" for {seconds:.3g}s (the redis_retry budget the call waited)"
        )  # fmt: skip
        return cls(
            f"Redis is at its memory limit (maxmemory, with nothing it may evict){waited}: a "
            f"write of job {job_id!r} was refused and not applied ({cause}). Free memory or "
            "raise maxmemory (CONFIG SET maxmemory), then retry",
            job_id=job_id, seconds=seconds,
        )  # fmt: skip


class StateLostError(StrataError):
    """The job's state in Redis is not the one this process worked in (``era.py``).

    Redis restarted without persistence, was flushed, failed over to a replica that had
    not synced, or the job was started again meanwhile: its workers, leases, barriers,
    rounds and checkpoint steps as this process knew them are gone. Nothing is retried
    and no state is made up: stop this process; a new one joins the job's new era
    (``TrainingOrchestrator`` resumes from the newest checkpoint in storage, or from the
    start of epoch 0 if there is none).

    Attributes:
        era: the era this process worked in.
        found: the era Redis holds now (None: none, the state is gone).
    """

    def __init__(self, message: str, *, job_id: str, era: str, found: str | None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.era = era
        self.found = found

    @classmethod
    def because(cls, job_id: str, era: str, found: str | None) -> StateLostError:
        """The state of ``job_id`` is not era ``era``: Redis holds ``found`` (None: none)."""
        what = (
            "Redis holds no state for it now (restarted without persistence, flushed, or "
            "failed over to a replica that had not synced)"
            if found is None
            else f"Redis holds era {found!r} now: the job was started again meanwhile"
        )
        return cls(
            f"the state of job {job_id!r} in Redis was lost: this process worked in era "
            f"{era!r}, and {what}. Its workers, leases, barriers, rounds and checkpoint steps "
            "are gone; nothing was retried. Stop this process and start the job's processes "
            "again: they resume from the newest checkpoint in storage (from epoch 0 if none)",
            job_id=job_id, era=era, found=found,
        )  # fmt: skip

    @classmethod
    def partly(cls, job_id: str, era: str, found: str, key: str) -> StateLostError:
        """Part of the state of ``job_id`` is gone: ``found`` is the era key's value, marked
        lost naming ``key`` (an anchor of ``status.ANCHORS``, or a key of a structure: its
        part after the job's tag; ``era.lost_error`` reads it from the mark)."""
        return cls(
            f"part of the state of job {job_id!r} in Redis was lost: its {key} key "
            f"(strata:{{{job_id}}}:{key}) is gone while its era stands (evicted by a "
            "maxmemory-policy, expired, or deleted by hand). "
            + _ROLLBACK_REMEDY.format(job=job_id),
            job_id=job_id, era=era, found=found,
        )  # fmt: skip

    @classmethod
    def refused(cls, c: Context) -> StateLostError:
        """A ``STATE_LOST`` reply seen without the era at hand (the era's owner,
        ``era.EraScripts``, reads the reply's mark first: this only says what Redis holds)."""
        found = str(c["payload"][0]) if c.get("payload") else ""
        return cls.because(c.get("job_id", "?"), "?", found or None)


#: what to do after a rollback, for the messages
_ROLLBACK_REMEDY = (
    "Leases, completions, epochs and checkpoint steps recorded since may be gone, so going "
    "on could train samples twice: nothing more is done on this state, and every process of "
    "the job stops with this error. Stop the job's processes, remove its state from Redis "
    "with `strata jobs rm {job} --yes --force` (checkpoints in storage are kept), and start "
    "the job again: it resumes from the newest checkpoint in storage"
)


class StateRolledBackError(StateLostError):
    """The job's state in Redis went back: Redis holds less than a process had seen.

    Every script call ticks the job's clock (``strata:{<job>}:clock``) and every process
    remembers the highest tick it saw (checkpoints record it too); a clock below that means
    Redis lost recent writes while keeping older ones: a failover to a replica that lagged,
    a restart from an older snapshot, an evicted key. The first process to see it marks the
    era rolled back, so every other process of the job (and any new one) stops too.

    Attributes:
        clock: the clock Redis held (None: not known to this process).
        seen: the highest clock a process (or a checkpoint) had seen (None: not known).
    """

    def __init__(
        self, message: str, *, job_id: str, era: str, found: str | None,
        clock: int | None, seen: int | None,
    ) -> None:  # fmt: skip
        super().__init__(message, job_id=job_id, era=era, found=found)
        self.clock = clock
        self.seen = seen

    @classmethod
    def detected(
        cls, job_id: str, era: str, clock: int | None, seen: int | None, *, by: str = "",
        found: str | None = None, diverged: bool = False,
    ) -> StateRolledBackError:  # fmt: skip
        """The state of ``job_id`` went back to ``clock`` after ``seen`` had been seen
        (``diverged``: the clock was raised again since, but Redis' history at ``seen`` is
        not the one seen)."""
        if clock is not None and seen is not None and diverged:
            what = (
                f"Redis' history at tick {seen}, which {by or 'another process of the job'} "
                f"had seen, is another call's: its state went back and later calls raised "
                f"the clock again (to {clock})"
            )
        elif clock is not None and seen is not None:
            what = (
                f"Redis holds its clock at {clock}, {seen - clock} script calls behind the "
                f"{seen} {by or 'another process of the job'} had seen"
            )
        else:
            what = "another process of the job found Redis behind what it had seen"
        return cls(
            f"the state of job {job_id!r} in Redis went back (a failover to a replica that "
            f"lagged, a restart from an older snapshot, or evicted keys): {what}. "
            + _ROLLBACK_REMEDY.format(job=job_id),
            job_id=job_id, era=era, found=found, clock=clock, seen=seen,
        )  # fmt: skip

    @classmethod
    def refused(cls, c: Context) -> StateRolledBackError:
        """A ``STATE_ROLLED_BACK`` reply seen without the era at hand."""
        clock = int(c["payload"][0]) if c.get("payload") else None
        return cls.detected(c.get("job_id", "?"), "?", clock, None)


class JobLayoutError(StateLostError):
    """The job's state in Redis is in another layout than this code reads (``keys.LAYOUT``):
    made by an older strata_redis (an epoch of older code would read as every shard free,
    and be trained again) or a newer one. Nothing is read or written; every call of the job
    refuses the same way. Checked once per process, at the job's first script call.

    Attributes:
        layout: the layout the job's state was made with (None: older code, from before
            layouts were recorded).
        expected: the layout this code reads.
    """

    def __init__(
        self, message: str, *, job_id: str, era: str, found: str | None,
        layout: int | None, expected: int,
    ) -> None:  # fmt: skip
        super().__init__(message, job_id=job_id, era=era, found=found)
        self.layout = layout
        self.expected = expected

    @classmethod
    def made(cls, job_id: str, found: str, layout: int | None, expected: int) -> JobLayoutError:
        """Job ``job_id``'s era ``found`` records ``layout``; this code reads ``expected``."""
        made = (
            "an older strata_redis, from before layouts were recorded" if layout is None
            else f"a {'newer' if layout > expected else 'older'} strata_redis (layout {layout})"
        )  # fmt: skip
        return cls(
            f"the state of job {job_id!r} in Redis was made by {made}; this strata_redis "
            f"reads layout {expected} only, and reading it could train samples twice, so "
            "nothing was read or written. Finish the job with the strata_redis version that "
            f"started it, or stop its processes and remove its state from Redis with "
            f"`strata jobs rm {job_id} --yes` (its checkpoints in storage are kept: the job "
            "started again resumes from them)",
            job_id=job_id, era="", found=found, layout=layout, expected=expected,
        )  # fmt: skip


class PoolExhaustedError(StrataError, MaxConnectionsError):
    """Every connection of a pool stayed busy for ``connection.POOL_TIMEOUT``: a limit of this
    process.

    Redis itself may be fine; raise ``max_connections`` (or wait in fewer threads at once).
    Subclasses ``redis.exceptions.MaxConnectionsError`` (a ``redis.ConnectionError``).
    """

    @classmethod
    def after(cls, limit: int, pool: str, where: str, timeout: float) -> PoolExhaustedError:
        """All ``limit`` connections of the process's ``pool`` pool to ``where`` (redacted)
        stayed busy for ``timeout`` seconds."""
        return cls(
            f"connection pool limit reached: all {limit} connections of this process's "
            f"strata_redis {pool} pool to {where} stayed busy for {timeout:g}s (each caller "
            "blocked in a barrier or checkpoint wait holds one); raise max_connections"
        )


class RedisConfigError(StrataError):
    """Redis is configured so that it could break a guarantee (for example a
    ``maxmemory-policy`` that evicts keys: an evicted lease record trains a shard twice).

    Attributes:
        setting: the Redis setting, e.g. ``"maxmemory-policy"``.
        value: its value.
    """

    def __init__(self, message: str, *, setting: str, value: str) -> None:
        super().__init__(message)
        self.setting = setting
        self.value = value


class NotReplicatedError(StrataError):
    """A call of ``durability="replicated"`` was applied on the primary, but too few replicas
    confirmed it within the job's ``redis_retry`` budget: it is **not acknowledged**.

    The write stands on the primary, and a failover now may lose it. What that means for
    the caller, by operation: a lease grant (``acquire``) is not used (it expires after its
    ttl); a completion (``complete``) is not done: the shard's lease is still held (call
    ``complete()`` again to have it acknowledged once a replica is back, or let it expire:
    whoever is granted it next trains it, from the lease's position) and the training loop
    does not count it; a renewal leaves the lease as it was; a release leaves the shard as
    the pool has it; a checkpoint commit is not reported committed (the save raises this).

    Attributes:
        job_id: the job.
        operation: the script (``acquire_shard``, ``commit_checkpoint``, ...).
        acked: replicas that confirmed it.
        needed: replicas the job asks for (``min_replicas``).
        fsynced: whether the primary confirmed its own AOF fsync (True when not asked).
        seconds: how long the call waited for them.
    """

    def __init__(
        self, message: str, *, job_id: str, operation: str, acked: int, needed: int,
        fsynced: bool, seconds: float,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.job_id = job_id
        self.operation = operation
        self.acked = acked
        self.needed = needed
        self.fsynced = fsynced
        self.seconds = seconds

    @classmethod
    def after(
        cls, job_id: str, operation: str, acked: int, needed: int, fsynced: bool, seconds: float
    ) -> NotReplicatedError:
        """``operation`` of ``job_id``: ``acked`` of ``needed`` replicas after ``seconds``."""
        disk = "" if fsynced else ", and the primary did not confirm its AOF fsync"
        return cls(
            f"job {job_id!r}: {operation} was applied on the primary, but {acked} of {needed} "
            f"replica(s) confirmed it within {seconds:.3g}s{disk} (durability='replicated'): "
            "it is not acknowledged, and a failover now could lose it. Check the replicas "
            "(`strata doctor`, INFO replication), or raise redis_retry to wait longer for a "
            "replica that lags",
            job_id=job_id, operation=operation, acked=acked, needed=needed, fsynced=fsynced,
            seconds=seconds,
        )  # fmt: skip


class _Portable:
    """An error that crosses processes as itself: made from its message alone (torch's
    ``DataLoader`` re-raises a worker's error as ``type(error)(text)``, its ids then only in
    the text: where the ids are mandatory, that call fails and the loop gets a
    ``RuntimeError`` instead), and pickled with its ids (``__reduce__``: the class, its
    message, its attributes)."""

    args: tuple[Any, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self.args[:1], dict(self.__dict__))


class StorageError(_Portable, StrataError):
    """A storage backend could not complete an operation.

    Made from a message alone (as a ``DataLoader`` worker's error is re-raised), ``backend``
    is ``""``.

    Attributes:
        backend: a short description such as ``"s3://bucket"`` or ``"file:///root"``.
        path: the object path inside the backend, if any.
    """

    def __init__(self, message: str, *, backend: str = "", path: str | None = None) -> None:
        super().__init__(message)
        self.backend = backend
        self.path = path


class StorageNotFoundError(StorageError):
    """The object does not exist."""


class StorageExistsError(StorageError):
    """A create-only write (``write_if_absent``) found the object already there."""


class ShardError(_Portable, StrataError):
    """A shard object of a dataset in storage is not what its index says: never trained from,
    never recorded done (``strata_redis.shards``).

    The message names the object (``backend: 'path': message``). Made from a message alone
    (as a ``DataLoader`` worker's error is re-raised: the text names it already), the ids
    are ``""``.

    Attributes:
        dataset: the dataset id.
        path: the object's path in its storage (the shard, its index or the manifest).
        backend: the storage's description (``s3://bucket``, ``file:///root``).
    """

    def __init__(
        self, message: str, *, dataset: str = "", path: str = "", backend: str = ""
    ) -> None:
        super().__init__(f"{backend}: {path!r}: {message}" if path or backend else message)
        self.dataset = dataset
        self.path = path
        self.backend = backend


class ShardChecksumError(ShardError):
    """The shard's bytes do not have the checksum its index records (read twice, the same)."""


class ShardFormatError(ShardError):
    """The object is not the tar its index describes: truncated, or no member header where
    the index puts one."""


class ShardManifestError(ShardError):
    """The dataset's manifest names shards the storage does not have, or the storage holds
    shards the manifest does not name."""


class CheckpointError(StrataError):
    """A checkpoint error about one checkpoint of one job.

    Attributes:
        job_id: the job.
        step, epoch: the loop's step and epoch of the checkpoint, when known.
    """

    def __init__(
        self, message: str, *, job_id: str, step: int | None = None, epoch: int | None = None
    ) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.step = step
        self.epoch = epoch

    @classmethod
    def about(cls, c: Context, what: str) -> CheckpointError:
        """``checkpoint {checkpoint} of job {job_id!r} {what}``."""
        return cls(
            f"checkpoint {c['checkpoint']} of job {c['job_id']!r} {what}",
            job_id=c["job_id"], step=c["step"], epoch=c.get("epoch"),
        )  # fmt: skip

    @classmethod
    def mismatch(cls, c: Context) -> CheckpointError:
        """The checkpoint was opened with another world size (``STEP_MISMATCH``)."""
        return cls.about(
            c,
            f"was opened with world_size={c['payload'][0]} and epoch={c['payload'][1] or None}; "
            f"worker {c['worker_id']!r} passed world_size={c['world_size']} and "
            f"epoch={c['epoch']} (all must pass the same)",
        )

    @classmethod
    def rank_not_held(cls, c: Context) -> CheckpointError:
        """The rank is another worker's (``RANK_NOT_HELD``)."""
        holder = c["payload"][0] or "nobody (the checkpoint expired)"
        return cls(
            f"rank {c['rank']} of checkpoint {c['checkpoint']} of job {c['job_id']!r} is not "
            f"worker {c['worker_id']!r}'s: it is held by {holder!r}",
            job_id=c["job_id"], step=c["step"], epoch=c.get("epoch"),
        )  # fmt: skip

    @classmethod
    def committed(cls, c: Context) -> CheckpointError:
        """The checkpoint is committed already (``STEP_COMMITTED``)."""
        return cls.about(c, "is already committed")

    @classmethod
    def committing(cls, c: Context) -> CheckpointError:
        """A leader is committing the checkpoint (``STEP_COMMITTING``)."""
        return cls.about(
            c,
            f"is being committed by leader {c['payload'][0]!r}; worker {c['worker_id']!r} "
            "cannot abort or commit it",
        )


class CheckpointAbortedError(CheckpointError):
    """A participant aborted this checkpoint (its upload failed); it never becomes visible."""

    @classmethod
    def by(
        cls, job_id: str, checkpoint: Any, worker_id: str, reason: str
    ) -> CheckpointAbortedError:
        """``checkpoint`` (a ``CheckpointId``) was aborted by ``worker_id`` for ``reason``."""
        return cls(
            f"checkpoint {checkpoint} of job {job_id!r} was aborted by worker {worker_id!r}: "
            f"{reason}",
            job_id=job_id, step=checkpoint.step, epoch=checkpoint.epoch,
        )  # fmt: skip

    @classmethod
    def refused(cls, c: Context) -> CheckpointAbortedError:
        """The checkpoint was aborted (``STEP_ABORTED``; payload: culprit, reason)."""
        return cls.by(c["job_id"], c["checkpoint"], c["payload"][0], c["payload"][1])


class CheckpointNotFoundError(CheckpointError):
    """No committed checkpoint verifies."""


class StepNotForwardError(CheckpointError, ValueError):
    """A save's checkpoint is not after the newest one: checkpoints must go forward in
    (run, epoch, step) order.

    Raised by whichever check finds it first (this manager's own last save, the Redis index,
    or the commit script), always as this type; it is also a ``ValueError`` (a bad argument).

    Attributes:
        newest: the checkpoint (a ``CheckpointId``) it had to be after.
    """

    def __init__(
        self, message: str, *, job_id: str, step: int | None, epoch: int | None, newest: Any
    ) -> None:
        super().__init__(message, job_id=job_id, step=step, epoch=epoch)
        self.newest = newest

    @classmethod
    def after(cls, job_id: str, checkpoint: Any, newest: Any, by: str) -> StepNotForwardError:
        """``checkpoint`` is not after ``newest``, which ``by`` (who saved or committed it)
        holds (both ``CheckpointId``\\ s)."""
        return cls(
            f"checkpoints must go forward: got {checkpoint}, but {by} {newest}",
            job_id=job_id, step=checkpoint.step, epoch=checkpoint.epoch, newest=newest,
        )  # fmt: skip

    @classmethod
    def refused(cls, c: Context) -> StepNotForwardError:
        """The commit protocol found a newer committed checkpoint (``STEP_NOT_FORWARD``;
        payload: its index member, which the context's ``parse`` turns into its id)."""
        newest = c["parse"](c["payload"][0])
        return cls(
            f"checkpoint {c['checkpoint']} of job {c['job_id']!r} is not after the newest "
            f"committed checkpoint {newest}: checkpoints must go forward",
            job_id=c["job_id"], step=c["step"], epoch=c.get("epoch"), newest=newest,
        )  # fmt: skip


class PortError(StrataError, OSError):
    """The dashboard cannot listen on ``host:port`` (in use, or not allowed).

    Attributes:
        host, port: where it tried to listen.
        in_use: the address is already in use (by another server).
    """

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        self.host = host
        self.port = port
        self.in_use = cause.errno == errno.EADDRINUSE
        shown = f"[{host}]" if ":" in host else host
        why = "is already in use" if self.in_use else f"cannot be used: {cause.strerror or cause}"
        super().__init__(cause.errno, f"{shown}:{port} {why}")

    def __str__(self) -> str:
        return str(self.strerror)


#: each refusal a script can return, and the exception it becomes
_BY_STATUS: dict[Status, Callable[[Context], StrataError]] = {
    Status.WORKER_NOT_REGISTERED: WorkerNotRegisteredError.refused,
    Status.WORKER_FAILED: WorkerFailedError.refused,
    Status.WORKER_LEFT: WorkerLeftError.refused,
    Status.WORKER_EXISTS: WorkerExistsError.refused,
    Status.WORKER_REPLACED: WorkerReplacedError.refused,
    Status.BARRIER_MOVED: BarrierError.moved,
    Status.BARRIER_MISMATCH: BarrierError.mismatch,
    Status.LEASE_LOST: LeaseLostError.refused,
    Status.EPOCH_MISMATCH: DatasetConflictError.epoch_mismatch,
    Status.DATASET_CONFLICT: DatasetConflictError.refused,
    Status.STEP_NOT_FORWARD: StepNotForwardError.refused,
    Status.STEP_ABORTED: CheckpointAbortedError.refused,
    Status.STEP_MISMATCH: CheckpointError.mismatch,
    Status.RANK_NOT_HELD: CheckpointError.rank_not_held,
    Status.STEP_COMMITTED: CheckpointError.committed,
    Status.STEP_COMMITTING: CheckpointError.committing,
    Status.ROUND_MOVED: RendezvousError.moved,
    Status.ROUND_BROKEN: RoundBrokenError.refused,
    Status.RENDEZVOUS_ENDED: RendezvousEndedError.refused,
    Status.STATE_LOST: StateLostError.refused,
    Status.STATE_ROLLED_BACK: StateRolledBackError.refused,
}


def from_status(status: Status, context: Context) -> StrataError:
    """The exception for a script's refusal; ``context`` holds the ids and ``payload``."""
    return _BY_STATUS[status](context)


class JobNotFoundError(StrataError, LookupError):
    """A job id that is malformed or has no state in this Redis (the dashboard's HTTP 404;
    ``strata status`` exits 1, listing the jobs that exist); also a ``LookupError``.

    Attributes:
        job_id: the id asked for.
    """

    def __init__(self, message: str, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


# not in ``__all__``, which lists the ``StrataError`` tree: ``preemption.py`` exports it
class Preempted(SystemExit):
    """The loop was preempted (``preemption.py``): it saved (or ran out of budget), released
    its leases, left its round and deregistered.

    A ``SystemExit``, not a ``StrataError``: left uncaught, the process exits with ``code``
    (0: the checkpoint committed; 75, ``EXIT_BUDGET_EXCEEDED``: it did not within the budget,
    and a relaunch resumes from the one before), and ``except Exception`` in a user's loop does
    not swallow it. Catch it by name to run something before exiting.

    Attributes:
        job_id, worker_id: who was preempted.
        signal: the signal's name (``"request"`` when asked for without one).
        checkpoint: the label of the checkpoint it saved (None: none).
        committed: whether that checkpoint committed within the budget.
        seconds: from the signal to the end of the save (or of the wait for it).
    """

    def __init__(
        self,
        code: int,
        *,
        job_id: str,
        worker_id: str,
        signal: str,
        checkpoint: str | None,
        committed: bool,
        seconds: float,
    ) -> None:
        super().__init__(code)
        self.job_id, self.worker_id, self.signal = job_id, worker_id, signal
        self.checkpoint, self.committed, self.seconds = checkpoint, committed, seconds

    def __str__(self) -> str:
        what = (
            f"checkpoint {self.checkpoint} committed" if self.committed
            else f"checkpoint {self.checkpoint} did not commit within the budget"
            if self.checkpoint else "no checkpoint"
        )  # fmt: skip
        return (
            f"worker {self.worker_id!r} of job {self.job_id!r} preempted by {self.signal}: "
            f"{what} ({self.seconds:.1f}s); exit code {self.code}"
        )

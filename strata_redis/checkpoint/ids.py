"""A checkpoint's identity: the loop's (epoch, step) and the job's run; its label and its order.

A checkpoint is named by the numbers the training loop passed, never by an internal number:

- ``step``: the loop's step (it may restart every epoch, and after a relaunch);
- ``epoch``: the loop's epoch, or None when the caller passed none;
- ``run``: which launch of the job saved it: 0 for the job's first launch, and when the
  whole job is relaunched and resumes from a checkpoint, that checkpoint's run + 1
  (``TrainingOrchestrator`` keeps it; ``CheckpointManager`` users pass ``run=``, default 0).

Checkpoints are ordered by ``(run, epoch, step)``, an epoch of None coming before epoch 0:
the seeds' loop restarts ``step`` every epoch and after a relaunch, so (epoch, step) alone
would neither order nor tell apart the checkpoints of two launches.

Every number is an int in ``[0, 2**53]`` (exact in a JSON number and a Lua number).

The **label** names the checkpoint's storage directory and its per-checkpoint Redis keys::

    step_{S}                       epoch None, run 0 (the seeds' layout)
    epoch_{E}_step_{S}             run 0
    run_{R}_step_{S}               epoch None, run R > 0
    run_{R}_epoch_{E}_step_{S}     run R > 0

The **member** is the checkpoint in the Redis index (``keys.checkpoints``, every score 0,
so Redis sorts it by member bytes): ``{run}:{epoch}:{step}``, each zero-padded to 16 digits,
the epoch ``-`` when None (``-`` sorts before every digit), e.g.
``0000000000000001:0000000000000003:0000000000000200`` for run 1, epoch 3, step 200.
``ZRANGE key 0 0 REV`` is the newest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..validate import check_int

__all__ = ["MAX_NUMBER", "CheckpointId"]

#: the largest step, epoch or run (2**53: exact in JSON numbers, doubles and Lua numbers)
MAX_NUMBER = 2**53
_WIDTH = 16  # digits of MAX_NUMBER
_NUM = r"(0|[1-9][0-9]{0,15})"
_LABEL = re.compile(rf"(?:run_([1-9][0-9]{{0,15}})_)?(?:epoch_{_NUM}_)?step_{_NUM}")
_MEMBER = re.compile(r"([0-9]{16}):([0-9]{16}|-):([0-9]{16})")


@dataclass(frozen=True)
class CheckpointId:
    """Which checkpoint: the loop's (epoch, step) and the job's run; ordered by (run, epoch, step).

    Attributes:
        step: the loop's step.
        epoch: the loop's epoch (None if the caller passed none).
        run: the job's launch that saved it (0: the first).
    """

    step: int
    epoch: int | None = None
    run: int = 0

    def __post_init__(self) -> None:
        check_int("step", self.step, low=0, high=MAX_NUMBER)
        if self.epoch is not None:
            check_int("epoch", self.epoch, low=0, high=MAX_NUMBER)
        check_int("run", self.run, low=0, high=MAX_NUMBER)

    @property
    def order(self) -> tuple[int, int, int]:
        """The sort key ``(run, epoch, step)``, an epoch of None as -1."""
        return (self.run, -1 if self.epoch is None else self.epoch, self.step)

    def __lt__(self, other: CheckpointId) -> bool:
        return self.order < other.order

    def __le__(self, other: CheckpointId) -> bool:
        return self.order <= other.order

    def __gt__(self, other: CheckpointId) -> bool:
        return self.order > other.order

    def __ge__(self, other: CheckpointId) -> bool:
        return self.order >= other.order

    @property
    def label(self) -> str:
        """The name of its storage directory and Redis keys (``epoch_1_step_200``)."""
        name = f"step_{self.step}"
        if self.epoch is not None:
            name = f"epoch_{self.epoch}_{name}"
        return name if self.run == 0 else f"run_{self.run}_{name}"

    @property
    def member(self) -> str:
        """Its member in the Redis index: ``{run}:{epoch}:{step}``, fixed width (see above)."""
        epoch = "-" if self.epoch is None else f"{self.epoch:0{_WIDTH}d}"
        return f"{self.run:0{_WIDTH}d}:{epoch}:{self.step:0{_WIDTH}d}"

    def matches(self, step: int | None, epoch: int | None, run: int | None = None) -> bool:
        """Whether it has this step, epoch and run (None: any)."""
        return (
            (step is None or self.step == step)
            and (epoch is None or self.epoch == epoch)
            and (run is None or self.run == run)
        )

    def as_dict(self) -> dict[str, Any]:
        """``{"run", "epoch", "step", "label"}``, for JSON documents."""
        return {"run": self.run, "epoch": self.epoch, "step": self.step, "label": self.label}

    def __str__(self) -> str:
        where = (
            f"step {self.step}" if self.epoch is None else f"epoch {self.epoch}, step {self.step}"
        )
        return f"({where})" if self.run == 0 else f"(run {self.run}, {where})"

    @classmethod
    def from_label(cls, label: str) -> CheckpointId | None:
        """The id a label names (``run_2_epoch_1_step_200``), or None if it is not a label."""
        match = _LABEL.fullmatch(label)
        if match is None:
            return None
        run, epoch, step = match.groups()
        try:
            return cls(int(step), None if epoch is None else int(epoch), int(run or 0))
        except ValueError:  # a number past MAX_NUMBER
            return None

    @classmethod
    def from_member(cls, member: str) -> CheckpointId:
        """The id of an index member (see ``member``).

        Raises:
            ValueError: not a member of the index.
        """
        match = _MEMBER.fullmatch(member)
        if match is None:
            raise ValueError(f"not a checkpoint index member: {member!r}")
        run, epoch, step = match.groups()
        return cls(int(step), None if epoch == "-" else int(epoch), int(run))

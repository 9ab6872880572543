"""``TrainingOrchestrator``: the training loop's one handle (rendezvous, batches, checkpoints).

The seeds' loop runs as written::

    orchestrator = strata_redis.TrainingOrchestrator(coordinator_url="localhost:6379",
                                                     worker_id="worker-01")
    shard_info = orchestrator.get_shards("imagenet_total")
    for epoch in range(2):
        for step, batch in enumerate(shard_info):
            ...                                   # train on batch (numpy sample indices)
            if step % 100 == 0:
                orchestrator.save_checkpoint(step=step, epoch=epoch)
        orchestrator.advance_epoch()

``for epoch in orchestrator.epochs(2):`` is the resume-correct form of its outer loop (the
job's epochs from where the job is; ``range(2)`` relaunched after a resume trains two more).
The constructor logs one line saying who the loop is (``launch.start_line``).

It registers the worker (heartbeats in the background), joins the elastic rendezvous, and,
in a round where every member is new (a whole-job start or restart), puts the data position
back to the newest verified checkpoint. Its batches come from fenced shard leases, one Redis
round trip per shard and none per batch; each batch checks, with no round trip, whether the
heartbeat thread found the round broken (a member died or left), and if so the worker
rendezvouses again (``elastic=True``) or raises ``RoundBrokenError``.

The loop's parts are this package's modules (``loop.py`` composes them); they all log to the
``strata_redis.orchestrator`` logger.
"""

from __future__ import annotations

from .loop import TrainingOrchestrator

__all__ = ["TrainingOrchestrator"]

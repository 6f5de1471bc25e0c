"""Celery interfaces to training services (queue ``training``): ids in, one call each.

None retries itself: each is idempotent, and what a failed or lost one leaves behind is
driven again by the sweeper (apps.training.sweeper.training_sweep).
"""

from __future__ import annotations

from celery import shared_task


@shared_task(name="training.start", acks_late=True, soft_time_limit=300, time_limit=360)
def training_start_task(run_id: str) -> None:
    # Idempotent: the trainer row is made once, under the run's lock. Then, on this queue's
    # worker (where the groups' forward/backward will run), the training client is made
    # while the first batch samples.
    from apps.training.clients import client_warm
    from apps.training.services import training_start

    training_start(run_id=run_id)
    client_warm(run_id=run_id)


# Routed to the evidence queue (synth_project.queues): it reads a group's published evidence
# and stores its packed datums, work kept out of the training worker's process. Nothing
# depends on it (the training worker records a group it finds without a contribution), so
# a lost or failed one is not retried.
@shared_task(name="training.contribution_prepare", acks_late=True, soft_time_limit=600, time_limit=660)
def contribution_prepare_task(run_id: str, group_id: str) -> None:
    from apps.training.pipeline import contribution_prepare

    contribution_prepare(run_id=run_id, group_id=group_id)


# A group's forward/backward runs here (on the run's training client in this process), so
# the limits are an update's; a lost or failed one leaves its work to the update itself.
@shared_task(name="training.group_settled", acks_late=True, soft_time_limit=3 * 3600, time_limit=3 * 3600 + 300)
def group_settled_task(run_id: str, step: int) -> None:
    from apps.training.pipeline import step_feed

    step_feed(run_id=run_id, step=step)


# acks_late + reject_on_worker_lost: a lost worker's update is delivered again; the update's
# own state then says whether it can be redone (still gathering) or must block (the
# optimizer step was in flight and the weights are unknown). The process applying it holds
# and heartbeats the update, so a second delivery while it runs returns at once, and the
# sweeper finds a dead holder within a lease TTL (not at the broker's redelivery). The time
# limit stays under the broker's visibility timeout (SYNTH_VISIBILITY_TIMEOUT, 4 h).
@shared_task(
    name="training.update",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=3 * 3600,
    time_limit=3 * 3600 + 300,
)
def update_apply_task(run_id: str, step: int) -> None:
    from apps.training.updates import update_apply

    update_apply(run_id=run_id, step=step)

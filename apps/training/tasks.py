"""Celery interfaces to training services (queue ``training``): ids in, one call each."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="training.start", acks_late=True, max_retries=3, soft_time_limit=300, time_limit=360)
def training_start_task(run_id: str) -> None:
    # Idempotent: the trainer row is made once, under the run's lock.
    from apps.training.services import training_start

    training_start(run_id=run_id)


@shared_task(name="training.group_settled", acks_late=True, max_retries=3, soft_time_limit=60, time_limit=90)
def group_settled_task(run_id: str, step: int) -> None:
    from apps.training.services import step_settled

    step_settled(run_id=run_id, step=step)


# acks_late + reject_on_worker_lost: a lost worker's update is delivered again; the update's
# own state then says whether it can be redone (still gathering) or must block (the
# optimizer step was in flight and the weights are unknown). The time limit stays under the
# broker's visibility timeout (SYNTH_VISIBILITY_TIMEOUT, 4 h): a message unacknowledged for
# longer would be delivered to a second worker while the first still applies the update.
@shared_task(
    name="training.update",
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=0,
    soft_time_limit=3 * 3600,
    time_limit=3 * 3600 + 300,
)
def update_apply_task(run_id: str, step: int) -> None:
    from apps.training.services import update_apply

    update_apply(run_id=run_id, step=step)

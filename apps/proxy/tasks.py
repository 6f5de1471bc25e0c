"""Celery interfaces of the proxy: evidence publication (evidence queue)."""

from __future__ import annotations

import logging

from celery import shared_task

logger = logging.getLogger(__name__)


# Idempotent (content-addressed create-only upload, conditional state updates), hence
# acks_late: a worker lost mid-upload gets the message redelivered and finishes the job.
# Bounded: the evidence worker's concurrency bounds uploads in flight; retries back off.
# The one task that retries itself: its failures are the object store's, often transient.
@shared_task(
    name="evidence.publish",
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(Exception,),
    retry_backoff=2,
    retry_backoff_max=300,
    max_retries=8,
    soft_time_limit=120,
    time_limit=180,
)
def evidence_publish_task(interaction_id: str) -> None:
    from apps.proxy.capture import interaction_publish

    interaction_publish(interaction_id=interaction_id)


# The proxy's batches (apps.proxy.publish_batch): each id as "evidence.publish" would, in
# turn; an id that fails goes on as a task of its own, which retries itself, so one bad
# row neither holds back nor repeats the others. Redelivered if the worker is lost:
# publishing is idempotent.
@shared_task(
    name="evidence.publish_many",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=600,
    time_limit=660,
)
def evidence_publish_many_task(interaction_ids: list[str]) -> None:
    from apps.proxy.capture import interaction_publish

    for interaction_id in interaction_ids:
        try:
            interaction_publish(interaction_id=interaction_id)
        except Exception:  # noqa: BLE001 - retried on its own, with backoff
            logger.warning("evidence.publish of %s failed in a batch; retrying it alone", interaction_id, exc_info=True)
            evidence_publish_task.apply_async(args=[interaction_id], countdown=2)


# Scheduled by beat (settings.CELERY_BEAT_SCHEDULE); it does not retry: the next tick is its retry.
@shared_task(name="evidence.sweep", acks_late=True, soft_time_limit=60, time_limit=90)
def evidence_sweep_task() -> None:
    """Re-enqueue staged interactions whose publication was lost."""
    from apps.proxy.capture import staged_sweep

    staged_sweep()

"""Celery interfaces of the proxy: evidence publication (evidence queue)."""

from __future__ import annotations

from celery import shared_task


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


# Scheduled by beat (settings.CELERY_BEAT_SCHEDULE); it does not retry: the next tick is its retry.
@shared_task(name="evidence.sweep", acks_late=True, soft_time_limit=60, time_limit=90)
def evidence_sweep_task() -> None:
    """Re-enqueue staged interactions whose publication was lost."""
    from apps.proxy.capture import staged_sweep

    staged_sweep()

"""Celery interfaces to runs services: ids in, one service call, nothing returned."""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import worker_ready

logger = logging.getLogger(__name__)


@shared_task(
    name="runs.schedule",
    acks_late=True,
    max_retries=3,
    soft_time_limit=30,
    time_limit=60,
)
def run_schedule_task(run_id: str) -> None:
    # Idempotent (state-guarded in the service), hence acks_late.
    from apps.runs.services import run_schedule

    run_schedule(run_id=run_id)


@shared_task(
    name="runs.lease_reap",
    acks_late=True,
    max_retries=0,
    soft_time_limit=60,
    time_limit=90,
)
def lease_reap_task() -> None:
    from apps.runs.services import lease_reap

    lease_reap()


@shared_task(name="runs.dispatch", acks_late=True, max_retries=3, soft_time_limit=120, time_limit=180)
def run_dispatch_task(run_id: str) -> None:
    # Idempotent: expansion happens once, guarded by the run's status.
    from apps.runs.execution import run_dispatch

    run_dispatch(run_id=run_id)


# One sandboxed attempt. acks_late + reject_on_worker_lost: a worker killed mid-trial
# gets the message redelivered; the trial lease (fenced) makes a second start harmless.
@shared_task(
    name="trials.execute",
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=0,
    soft_time_limit=24 * 3600,
    time_limit=24 * 3600 + 120,
)
def trial_execute_task(trial_id: str) -> None:
    from apps.runs.worker import trial_execute

    trial_execute(trial_id=trial_id)


@worker_ready.connect
def _sandboxes_reap_stale(**_: object) -> None:
    """A worker that died (SIGKILL, OOM, host reboot) leaves sandboxes behind: clean them
    when a worker starts on this host."""
    from apps.runs.sandbox.environment import default_sandbox_root
    from apps.runs.sandbox.sandbox import reap_stale_sandboxes

    removed = reap_stale_sandboxes(default_sandbox_root())
    if removed:
        logger.warning("removed %d stale sandboxes: %s", len(removed), ", ".join(removed[:10]))

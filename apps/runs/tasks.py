"""Celery interfaces to runs services: ids in, one service call, nothing returned.

Retries: none of these tasks retries itself. Each is idempotent (state-guarded in its
service), and what a failed or lost one leaves behind is found from the database by the
sweeper (`runs.sweep`, every SYNTH_SWEEP_INTERVAL seconds) and driven again; a retry
policy per task would be a second, weaker copy of that.
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import worker_process_init, worker_ready

logger = logging.getLogger(__name__)


@shared_task(name="runs.schedule", acks_late=True, soft_time_limit=30, time_limit=60)
def run_schedule_task(run_id: str) -> None:
    # Idempotent (state-guarded in the service), hence acks_late.
    from apps.runs.services import run_schedule

    run_schedule(run_id=run_id)


@shared_task(name="runs.dispatch", acks_late=True, soft_time_limit=120, time_limit=180)
def run_dispatch_task(run_id: str) -> None:
    # Idempotent: expansion happens once, guarded by the run's status.
    from apps.runs.execution import run_dispatch

    run_dispatch(run_id=run_id)


# Settles a cancelled run's not-started trials in short batches; hands itself the rest so
# that one message stays bounded. Idempotent: only pending trials are settled.
@shared_task(name="runs.cancel_settle", acks_late=True, soft_time_limit=120, time_limit=180)
def run_cancel_settle_task(run_id: str) -> None:
    from apps.runs.execution import run_cancel_settle

    if not run_cancel_settle(run_id=run_id, max_batches=50):
        run_cancel_settle_task.delay(run_id)


# The one beat task: the lease reaper and every re-drive of what a lost message or a dead
# process left behind (apps.runs.sweeper). Bounded work per tick; a tick that finds nothing
# does nothing, so overlapping ticks are harmless.
@shared_task(name="runs.sweep", acks_late=True, soft_time_limit=120, time_limit=180)
def sweep_task() -> None:
    from apps.runs.sweeper import sweep_tick

    sweep_tick()


# One sandboxed attempt. acks_late + reject_on_worker_lost: a worker killed mid-trial
# gets the message redelivered; the trial lease (fenced) makes a second start harmless.
@shared_task(
    name="trials.execute",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=24 * 3600,
    time_limit=24 * 3600 + 120,
)
def trial_execute_task(trial_id: str) -> None:
    from apps.runs.worker import trial_execute

    trial_execute(trial_id=trial_id)


@worker_ready.connect
@worker_process_init.connect
def _sandboxes_reap_stale(**_: object) -> None:
    """A worker that died (SIGKILL, OOM, host reboot) leaves sandboxes and work dirs behind:
    clean them when a worker starts on this host, and when a pool process starts (the
    replacement of a killed one), so a killed child's are gone without a restart."""
    from django.conf import settings

    from apps.runs.workdirs import host_reap

    try:
        host_reap(work_root=settings.SYNTH_WORK_DIR)
    except Exception:  # a cleanup problem must not keep the worker (or its pool) from starting
        logger.exception("reaping what dead trial processes left failed")


@worker_ready.connect
def _reservations_release_orphaned(**_: object) -> None:
    """The same dead worker left this node's admission reservations held: release those
    whose holding process is gone, so that the next trials on this host do not wait on them."""
    from django.conf import settings
    from django.db import connections

    from apps.runs.admission import node_orphans_release

    try:
        node_orphans_release(node_name=settings.SYNTH_WORKER_NAME)
    except Exception:  # a database outage at start must not stop the worker; the reaper covers it
        logger.exception("could not release orphaned reservations of %s", settings.SYNTH_WORKER_NAME)
    finally:
        connections.close_all()  # the worker's main process keeps no connection of its own

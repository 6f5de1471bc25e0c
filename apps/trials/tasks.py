"""Celery interfaces of the trial host: one sandboxed attempt per message, and the clean-up a
worker does when it (or one of its pool processes) starts on a host where another died.

Routed to the trials queue by name (`trials.*`, synth_project/queues.py).
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import worker_process_init, worker_ready

logger = logging.getLogger(__name__)


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
    from apps.trials.pipeline import trial_execute

    trial_execute(trial_id=trial_id)


@worker_ready.connect
@worker_process_init.connect
def _sandboxes_reap_stale(**_: object) -> None:
    """A worker that died (SIGKILL, OOM, host reboot) leaves sandboxes and work dirs behind:
    clean them when a worker starts on this host, and when a pool process starts (the
    replacement of a killed one), so a killed child's are gone without a restart."""
    from django.conf import settings

    from apps.trials.workdirs import host_reap

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

    from apps.trials.admission import node_orphans_release

    try:
        node_orphans_release(node_name=settings.SYNTH_WORKER_NAME)
    except Exception:  # a database outage at start must not stop the worker; the reaper covers it
        logger.exception("could not release orphaned reservations of %s", settings.SYNTH_WORKER_NAME)
    finally:
        connections.close_all()  # the worker's main process keeps no connection of its own

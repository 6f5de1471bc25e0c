"""The one Celery app; all CELERY_* settings live in settings.py."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun
from kombu import Queue as KombuQueue

from synth_project.queues import TASK_ROUTES, Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")

app = Celery("synth")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_routes = TASK_ROUTES
app.conf.task_queues = [KombuQueue(q.value, routing_key=q.value) for q in Queue]
app.conf.task_default_queue = Queue.CONTROL.value
app.autodiscover_tasks()


@task_prerun.connect
@task_postrun.connect
def _db_connections_checked(*, sender: Any = None, **_: object) -> None:
    """A worker's kept connections are checked around each task as a request's are: closed
    once past SYNTH_DB_CONN_MAX_AGE or broken (Django's health check), so the next query
    opens a live one. Celery's fixup leaves them open (CELERY_DB_REUSE_MAX in settings.py).
    Not around an eager task: it runs inside its caller, maybe in the caller's transaction."""
    from django.db import close_old_connections

    if getattr(getattr(sender, "request", None), "is_eager", False):
        return
    close_old_connections()

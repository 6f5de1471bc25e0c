"""The one Celery app; all CELERY_* settings live in settings.py."""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue as KombuQueue

from synth_project.queues import TASK_ROUTES, Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")

app = Celery("synth")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_routes = TASK_ROUTES
app.conf.task_queues = [KombuQueue(q.value, routing_key=q.value) for q in Queue]
app.conf.task_default_queue = Queue.CONTROL.value
app.autodiscover_tasks()

"""A Celery worker's tasks reuse its kept database connection (SYNTH_DB_CONN_MAX_AGE), as
requests do: Celery's own Django fixup, installed as a worker installs it, would otherwise
close it before and after every task, and each task would start a PostgreSQL backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]

# Three tasks' worth of Celery's task signals around a query each, with Celery's fixup for
# Django installed: the backend each query ran on.
TASKS = """
import json
import django
django.setup()
from celery.fixups.django import DjangoWorkerFixup
from celery.signals import task_postrun, task_prerun
from django.db import connection
from synth_project.celery import app

app.loader.import_default_modules()  # the tasks, as a worker imports them
fixup = DjangoWorkerFixup(app).install()  # kept: signals hold their receivers weakly
task = app.tasks["runs.sweep"]  # any task: its request is not an eager one
backends = []
for _ in range(3):
    task_prerun.send(sender=task, task_id="t", task=task, args=(), kwargs={})
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backends.append(cursor.fetchone()[0])
    task_postrun.send(sender=task, task_id="t", task=task, args=(), kwargs={}, retval=None, state="SUCCESS")
print(json.dumps(backends))
"""


def _backends(*, max_age: str) -> list[int]:
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "synth_project.settings",
        "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "SYNTH_DB_CONN_MAX_AGE": max_age,
        # A worker's settings, even when this test process imported the proxy's app before
        # (it marks the environment: its connections come from a pool).
        "SYNTH_PROXY_PROCESS": "false",
    }
    out = subprocess.run([sys.executable, "-c", TASKS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.django_db
def test_tasks_reuse_a_kept_connection_and_close_one_that_is_not_kept():
    if connection.vendor != "postgresql":
        pytest.skip("backend ids are PostgreSQL's")
    kept = _backends(max_age="60")
    assert len(set(kept)) == 1, kept
    not_kept = _backends(max_age="0")
    assert len(set(not_kept)) == 3, not_kept

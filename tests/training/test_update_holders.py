"""A learning update is held by the process applying it, which heartbeats it: a second
delivery returns at once, and a holder killed with its optimizer step in flight blocks the
run at the sweeper's next tick, with the reason, not when the broker redelivers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.runs.models import GroupStatus, Run, RunEvent, RunStatus, SamplingGroup, Trial, TrialStatus
from apps.runs.sweeper import sweep_tick
from apps.training.models import LearningUpdate, Trainer, TrainerStatus, UpdateStatus
from apps.training.services import training_start
from apps.training.updates import update_apply
from tests.factories import make_train_run

ROOT = Path(__file__).resolve().parents[2]

# What update_apply does up to its optimizer step, in a process of its own; then it waits.
HOLDER = """
import sys, time, django
django.setup()
from apps.core.process import process_identity
from apps.training.models import LearningUpdate
from apps.training.transitions import update_transition
from apps.training.updates import UpdateKeeper, _update_take
update = LearningUpdate.objects.get(pk=sys.argv[1])
holder = process_identity()
assert _update_take(update=update, holder=holder)
UpdateKeeper(update_id=update.id, holder=holder).start()
assert update_transition(update=update, to="unresolved", event="training.update_submitted", holder=holder)
print(holder, flush=True)
time.sleep(600)
"""


def updating(member) -> tuple[Run, LearningUpdate]:
    run = make_train_run(org=member.org, tasks=2)
    training_start(run_id=run.id)
    Trial.objects.filter(run=run).update(status=TrialStatus.SUCCEEDED, reward=1.0, queued_at=timezone.now())
    SamplingGroup.objects.filter(run=run).update(status=GroupStatus.SETTLED)
    Trainer.objects.filter(run=run).update(status=TrainerStatus.UPDATING)
    return Run.objects.get(pk=run.pk), LearningUpdate.objects.create(run=run, step=0, sampler={})


@pytest.mark.django_db
def test_a_second_delivery_of_a_held_update_returns_at_once(alice):
    run, update = updating(alice)
    LearningUpdate.objects.filter(pk=update.pk).update(holder="elsewhere/b/1/1", heartbeat_at=timezone.now())
    assert update_apply(run_id=run.id, step=0) is None
    LearningUpdate.objects.filter(pk=update.pk).update(status=UpdateStatus.UNRESOLVED)
    assert update_apply(run_id=run.id, step=0) is None  # in flight elsewhere: not blocked
    update.refresh_from_db()
    assert update.status == UpdateStatus.UNRESOLVED and update.holder == "elsewhere/b/1/1"
    assert Trainer.objects.get(run=run).status == TrainerStatus.UPDATING


@pytest.mark.django_db(transaction=True)
def test_a_training_worker_killed_mid_update_blocks_the_run_at_the_next_tick(alice):
    run, update = updating(alice)
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "synth_project.settings",
        "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "SYNTH_VAR_DIR": str(settings.VAR_DIR),
        "SYNTH_LEASE_TTL_SECONDS": "3",  # it heartbeats every second
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, update.id], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        holder = proc.stdout.readline().strip()
        assert holder, "the holder process did not start"
        update.refresh_from_db()
        assert update.status == UpdateStatus.UNRESOLVED and update.holder == holder
        taken = update.heartbeat_at
        deadline = time.monotonic() + 60
        while LearningUpdate.objects.get(pk=update.pk).heartbeat_at == taken:
            assert time.monotonic() < deadline, "the holder never heartbeated"
            time.sleep(0.2)
        assert "updates_blocked" not in sweep_tick()  # alive, optimizer step in flight
        assert update_apply(run_id=run.id, step=0) is None  # a redelivery leaves it alone
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    counts = sweep_tick()
    assert counts["updates_blocked"] == 1
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert holder in run.error and "weights are unknown" in run.error
    assert Trainer.objects.get(run=run).status == TrainerStatus.BLOCKED
    types = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert types[-3:] == ["sweep.redriven", "training.blocked", "run.failed"]

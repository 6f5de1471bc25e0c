"""Celery queues, one per resource class, and the routing table in one place.

Import-light on purpose: settings, workers and deploy scripts read it. Each worker
consumes one queue (`celery -A synth_project worker -Q trials`) so that each class
scales and is configured on its own (concurrency, prefetch, time limits).
"""

from __future__ import annotations

from enum import StrEnum


class Queue(StrEnum):
    CONTROL = "control"  # admission, scheduling, transitions, the lease reaper: short, DB-bound
    TRIALS = "trials"  # one sandboxed attempt per task: long, CPU/memory-bound
    TRAINING = "training"  # forward/backward, optimizer step, checkpoint save: ordered per trainer
    # publication of captured interactions and artifacts (IO-bound), and each settled train
    # group's datums built from them
    EVIDENCE = "evidence"


# Task name prefix -> queue. Task names are explicit (`<app>.<verb>`), never module paths.
TASK_ROUTES = {
    "runs.*": {"queue": Queue.CONTROL.value},
    "datasets.*": {"queue": Queue.CONTROL.value},
    "trials.*": {"queue": Queue.TRIALS.value},
    # Reads a group's evidence and stores its datums: kept off the training worker (exact
    # names are matched before patterns).
    "training.contribution_prepare": {"queue": Queue.EVIDENCE.value},
    "training.*": {"queue": Queue.TRAINING.value},
    "evidence.*": {"queue": Queue.EVIDENCE.value},
}

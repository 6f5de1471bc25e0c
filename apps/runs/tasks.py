"""Celery interfaces to runs services: ids in, one service call, nothing returned.

Retries: none of these tasks retries itself. Each is idempotent (state-guarded in its
service), and what a failed or lost one leaves behind is found from the database by the
sweeper (`runs.sweep`, every SYNTH_SWEEP_INTERVAL seconds) and driven again; a retry
policy per task would be a second, weaker copy of that.
"""

from __future__ import annotations

from celery import shared_task


@shared_task(name="runs.schedule", acks_late=True, soft_time_limit=30, time_limit=60)
def run_schedule_task(run_id: str) -> None:
    # Idempotent (state-guarded in the service), hence acks_late.
    from apps.runs.services import run_schedule

    run_schedule(run_id=run_id)


# The gateway's batches (apps.runs.services.run_schedule_enqueue): each run as "runs.schedule"
# would, in turn. Idempotent, as that one is.
@shared_task(name="runs.schedule_many", acks_late=True, soft_time_limit=120, time_limit=180)
def run_schedule_many_task(run_ids: list[str]) -> None:
    from apps.runs.services import run_schedule_many

    run_schedule_many(run_ids=run_ids)


@shared_task(name="runs.dispatch", acks_late=True, soft_time_limit=120, time_limit=180)
def run_dispatch_task(run_id: str) -> None:
    # Idempotent: expansion happens once, guarded by the run's status.
    from apps.runs.dispatch import run_dispatch

    run_dispatch(run_id=run_id)


# Settles a cancelled run's not-started trials in short batches; hands itself the rest so
# that one message stays bounded. Idempotent: only pending trials are settled.
@shared_task(name="runs.cancel_settle", acks_late=True, soft_time_limit=120, time_limit=180)
def run_cancel_settle_task(run_id: str) -> None:
    from apps.runs.settlement import run_cancel_settle

    if not run_cancel_settle(run_id=run_id, max_batches=50):
        run_cancel_settle_task.delay(run_id)


# The one beat task: the lease reaper and every re-drive of what a lost message or a dead
# process left behind (apps.runs.sweeper). Bounded work per tick; a tick that finds nothing
# does nothing, so overlapping ticks are harmless.
@shared_task(name="runs.sweep", acks_late=True, soft_time_limit=120, time_limit=180)
def sweep_task() -> None:
    from apps.runs.sweeper import sweep_tick

    sweep_tick()

"""Cancel at scale on PostgreSQL: a 10,000-trial run whose running trials heartbeat through it.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/synth_bench .venv/bin/python bench/cancel.py \\
        [--tasks 2500] [--attempts 4] [--running 8] [--ttl 10] [--beat 0.5] [--stop 5]

Makes the run directly through the services (submit, schedule, dispatch: tasks x attempts
trials), claims and starts ``--running`` of them as trials workers do, each with a thread
that heartbeats its lease every ``--beat`` seconds under a lease TTL of ``--ttl`` seconds.
Then cancels the run as the API does and settles the rest as the control queue does with
the cancel's message (the task ``runs.cancel_settle``, called here; the broker is in
memory). Each "worker", once its heartbeat answers cancel_requested, stops its sandbox
(``--stop`` seconds, heartbeating meanwhile) and completes its trial as cancelled, as
apps.trials.pipeline does; the run ends cancelled with the last one.

Prints the time from the cancel request to the run's `cancelled`, the time the request
itself took, the longest hold of the run row's lock and the longest single transaction
(each measured on its connection from the statement that took the lock, or from its first
statement, to its commit), and the heartbeats sent and failed and leases lost. Asserts
nothing; the last line is one JSON object of the figures. The database named in
DATABASE_URL is created if missing and migrated; rows are left behind for inspection.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/synth_bench")
os.environ["CELERY_BROKER_URL"] = "memory://localhost/"  # nothing leaves the process: no worker takes the trials
os.environ.setdefault("SYNTH_VAR_DIR", tempfile.mkdtemp(prefix="synth-bench-cancel-"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")

RUN_LOCK = re.compile(r'^UPDATE "runs_run"|FROM "runs_run" .*FOR UPDATE', re.S)


def ensure_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


class TransactionClock:
    """An execute wrapper: per connection, when its transaction began and when it first
    held the run row's lock (once the locking statement returned: waiting for the lock is
    not holding it); both closed by the commit (an on-commit hook)."""

    def __init__(self) -> None:
        self.longest: dict[str, float] = {"transaction": 0.0, "run_lock": 0.0}
        self._mutex = threading.Lock()
        self._local = threading.local()

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        conn = context["connection"]
        if not conn.in_atomic_block:
            return execute(sql, params, many, context)
        if getattr(self._local, "began", None) is None:
            self._local.began = time.perf_counter()
            self._local.locked = None
            conn.on_commit(self._committed)
        result = execute(sql, params, many, context)
        if self._local.locked is None and RUN_LOCK.search(sql):
            self._local.locked = time.perf_counter()
        return result

    def _committed(self) -> None:
        now = time.perf_counter()
        with self._mutex:
            self.longest["transaction"] = max(self.longest["transaction"], now - self._local.began)
            if self._local.locked is not None:
                self.longest["run_lock"] = max(self.longest["run_lock"], now - self._local.locked)
        self._local.began = self._local.locked = None


class Worker(threading.Thread):
    """A trials worker's part: heartbeat the lease; on cancel, stop and complete as cancelled."""

    def __init__(self, *, clock: TransactionClock, worker: Any, lease: Any, trial_id: str, beat: float, stop: float):
        super().__init__(daemon=True)
        self.clock, self.worker, self.lease, self.trial_id = clock, worker, lease, trial_id
        self.beat, self.stop_seconds = beat, stop
        self.sent = self.failed = 0
        self.errors: list[str] = []

    def run(self) -> None:
        from django.db import connection, connections

        from apps.runs.leases import lease_heartbeat, trial_complete
        from apps.runs.settlement import TrialOutcome

        try:
            with connection.execute_wrapper(self.clock):
                stopping_until = None
                while stopping_until is None or time.monotonic() < stopping_until:
                    try:
                        result = lease_heartbeat(worker=self.worker, lease_id=self.lease.id, fence=self.lease.fence)
                        self.sent += 1
                        if result.cancel_requested and stopping_until is None:
                            stopping_until = time.monotonic() + self.stop_seconds
                    except Exception as exc:  # noqa: BLE001 - counted: a lost lease is the failure measured
                        self.failed += 1
                        self.errors.append(repr(exc))
                    time.sleep(self.beat)
                trial_complete(
                    worker=self.worker,
                    lease=self.lease,
                    trial_id=self.trial_id,
                    outcome=TrialOutcome(
                        status="cancelled", error_type="Cancelled", error_message="the run was cancelled"
                    ),
                )
        except Exception as exc:  # noqa: BLE001
            self.errors.append(repr(exc))
        finally:
            connections.close_all()


def make_run(*, tasks: int, attempts: int, running: int) -> tuple[Any, Any]:
    from apps.accounts.services import membership_set, org_get_or_create
    from apps.runs.dispatch import run_dispatch
    from apps.runs.models import Run
    from apps.runs.services import run_schedule, run_submit
    from tests.factories import make_dataset_version, make_profile_version

    stamp = str(int(time.time()))
    org = org_get_or_create(slug=f"bench-cancel-{stamp}")
    membership_set(org=org, username=f"bench-cancel-{stamp}")
    dataset = make_dataset_version(org=org, name=f"cancel-{stamp}", tasks=tasks)
    actor = make_profile_version(org=org)
    body = {
        "kind": "evaluate",
        "dataset": dataset.reference,
        "actor": {"profile": actor.profile.name, "version": actor.version},
        "plan": {"attempts_per_task": attempts, "max_concurrency": running},
    }
    run, _ = run_submit(org=org, user=None, idempotency_key=stamp, body=body)
    run_schedule(run_id=run.id)
    run_dispatch(run_id=run.id)  # its trials are handed over after commit (to the in-memory broker)
    return org, Run.objects.get(pk=run.pk)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2500)
    parser.add_argument("--attempts", type=int, default=4)
    parser.add_argument("--running", type=int, default=8, help="trials running under live leases")
    parser.add_argument("--ttl", type=int, default=10, help="lease TTL, seconds")
    parser.add_argument("--beat", type=float, default=0.5, help="heartbeat interval, seconds")
    parser.add_argument("--stop", type=float, default=5.0, help="seconds a running trial takes to stop")
    args = parser.parse_args()
    os.environ["SYNTH_LEASE_TTL_SECONDS"] = str(args.ttl)

    ensure_database(os.environ["DATABASE_URL"])
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    from apps.accounts.services import worker_get_or_create
    from apps.runs.leases import trial_claim, trial_mark_running
    from apps.runs.models import Lease, Run, Trial
    from apps.runs.services import run_cancel
    from apps.runs.tasks import run_cancel_settle_task

    t_setup = time.perf_counter()
    org, run = make_run(tasks=args.tasks, attempts=args.attempts, running=args.running)
    trials = run.trials.count()
    clock = TransactionClock()
    worker = worker_get_or_create(name="trials@bench")
    workers = []
    for trial_id in Trial.objects.filter(run=run, queued_at__isnull=False).values_list("pk", flat=True):
        lease = trial_claim(worker=worker, trial_id=trial_id, node_name="bench")
        trial_mark_running(worker=worker, lease=lease, trial_id=trial_id, data={})
        workers.append(
            Worker(clock=clock, worker=worker, lease=lease, trial_id=trial_id, beat=args.beat, stop=args.stop)
        )
    for w in workers:
        w.start()
    print(
        f"run {run.id}: {trials:,} trials ({args.tasks:,} tasks x {args.attempts}), {len(workers)} running under "
        f"leases (TTL {args.ttl} s, heartbeat every {args.beat:g} s); set up in {time.perf_counter() - t_setup:.1f} s"
    )
    time.sleep(args.beat * 2)  # heartbeats flowing before the cancel

    with connection.execute_wrapper(clock):
        t0 = time.perf_counter()
        run_cancel(org=org, run_id=run.id, reason="bench")
        call = time.perf_counter() - t0
        run_cancel_settle_task(run.id)  # the control queue's part of the cancel
        settled = time.perf_counter() - t0
        while Run.objects.filter(pk=run.pk).values_list("status", flat=True).get() != "cancelled":
            if not any(w.is_alive() for w in workers):
                break
            time.sleep(0.01)
        to_cancelled = time.perf_counter() - t0
    for w in workers:
        w.join(60)
    run.refresh_from_db()
    leases = list(Lease.objects.filter(run=run).values_list("status", flat=True))
    lost = sum(1 for s in leases if s != "completed")
    figures = {
        "trials": trials,
        "running": len(workers),
        "status": run.status,
        "time_to_cancelled_s": round(to_cancelled, 3),
        "cancel_call_s": round(call, 3),
        "not_started_settled_s": round(settled, 3),
        "longest_run_lock_ms": round(clock.longest["run_lock"] * 1000, 1),
        "longest_transaction_ms": round(clock.longest["transaction"] * 1000, 1),
        "heartbeats": sum(w.sent for w in workers),
        "heartbeat_failures": sum(w.failed for w in workers),
        "leases_lost": lost,
    }
    print(
        f"cancel request (marked, first batches settled in the caller): {call:.2f} s; every not-started trial "
        f"settled after {settled:.2f} s"
    )
    print(f"time to cancelled: {to_cancelled:.2f} s (run {run.status})")
    print(
        f"longest run-row lock hold: {figures['longest_run_lock_ms']:.0f} ms; longest single transaction: "
        f"{figures['longest_transaction_ms']:.0f} ms"
    )
    print(
        f"heartbeats: {figures['heartbeats']} sent, {figures['heartbeat_failures']} failed; leases lost: {lost}"
        + (f" ({'; '.join(e for w in workers for e in w.errors)[:300]})" if any(w.errors for w in workers) else "")
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

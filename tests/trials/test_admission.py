"""Resource-aware admission: trials wait for what they need, FIFO within what fits."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.runs.dispatch import run_dispatch
from apps.runs.models import Reservation, Trial
from apps.runs.services import run_schedule
from apps.trials.admission import (
    Budget,
    Need,
    NeverFits,
    admission_release,
    admission_request,
    admission_try,
    node_register,
    node_usage,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def trials(alice, inputs):
    body = dict(inputs["body"], plan={"attempts_per_task": 4})
    run_id = alice.client.post("/api/runs", body, format="json").json()["id"]
    run_schedule(run_id=run_id)
    run_dispatch(run_id=run_id)
    return list(Trial.objects.filter(run_id=run_id).order_by("id"))


@pytest.fixture
def node():
    return node_register(name="n1", budget=Budget(slots=4, cpus=8, memory_mb=4096, storage_mb=100_000))


HEAVY = Need(cpus=1, memory_mb=1536, storage_mb=100)
LIGHT = Need(cpus=1, memory_mb=256, storage_mb=100)


def test_memory_fills_while_slots_remain_and_the_next_heavy_trial_waits(trials, node):
    reservations = [admission_request(node=node, trial=t, need=HEAVY) for t in trials[:3]]
    granted = [admission_try(reservation=r) for r in reservations]
    assert granted == [True, True, False]
    usage = node_usage(node=node)
    assert usage["slots"] == 2 < node.slots  # slots remain free...
    assert usage["memory_mb"] == 3072  # ...but memory does not have room for another 1536
    assert usage["waiting"] == 1
    # It waits, it does not fail; once memory is released it gets in.
    admission_release(reservation=reservations[0])
    assert admission_try(reservation=reservations[2]) is True


def test_fifo_within_what_fits_lets_small_trials_pass_then_ages(trials, node):
    big = [admission_request(node=node, trial=t, need=HEAVY) for t in trials[:2]]
    assert all(admission_try(reservation=r) for r in big)
    waiting_big = admission_request(node=node, trial=trials[2], need=HEAVY)
    assert admission_try(reservation=waiting_big) is False
    small = admission_request(node=node, trial=trials[3], need=LIGHT)
    assert admission_try(reservation=small) is True  # fits in what is left: it may pass
    admission_release(reservation=small)
    # Once the big one has waited long enough, nothing behind it may pass any more.
    Reservation.objects.filter(pk=waiting_big.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    other = admission_request(node=node, trial=trials[3], need=LIGHT)
    assert admission_try(reservation=other) is False
    admission_release(reservation=big[0])
    assert admission_try(reservation=waiting_big) is True


def test_slots_bound_light_trials(trials, alice, inputs):
    node = node_register(name="n2", budget=Budget(slots=2, cpus=8, memory_mb=8192, storage_mb=100_000))
    rs = [admission_request(node=node, trial=t, need=LIGHT) for t in trials[:3]]
    assert [admission_try(reservation=r) for r in rs] == [True, True, False]


def test_a_need_beyond_the_whole_budget_is_refused_at_once(trials, node):
    with pytest.raises(NeverFits, match="8192 MB memory"):
        admission_request(node=node, trial=trials[0], need=Need(cpus=1, memory_mb=8192, storage_mb=1))


def test_requests_are_idempotent_per_trial(trials, node):
    a = admission_request(node=node, trial=trials[0], need=LIGHT)
    b = admission_request(node=node, trial=trials[0], need=LIGHT)
    assert a.pk == b.pk


@pytest.mark.django_db(transaction=True)
def test_a_waiting_trial_is_woken_by_a_release_committed_elsewhere(trials, node):
    """The wake comes from the release's commit on another connection, not from a poll: the
    wait's timeout is far longer than the test."""
    import threading

    from django.db import connection, connections, transaction

    from apps.trials.admission import FreedWake

    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; SQLite waits by polling")
    reservations = [admission_request(node=node, trial=t, need=HEAVY) for t in trials[:3]]
    assert [admission_try(reservation=r) for r in reservations] == [True, True, False]
    released = threading.Event()

    def release_elsewhere() -> None:
        try:
            with transaction.atomic():
                admission_release(reservation=reservations[0])
                released.set()  # inside the transaction: nothing is delivered before the commit
        finally:
            connections.close_all()

    with FreedWake(node_name=node.name) as wake:
        assert wake.wait(timeout=0.01) is False  # nothing freed yet
        thread = threading.Thread(target=release_elsewhere)
        thread.start()
        assert wake.wait(timeout=300) is True
        thread.join()
    assert released.is_set()
    assert admission_try(reservation=reservations[2]) is True


@pytest.mark.django_db(transaction=True)
def test_a_release_on_another_node_does_not_wake(trials, node):
    from django.db import connection

    from apps.trials.admission import FreedWake

    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")
    other = node_register(name="n2", budget=Budget(slots=4, cpus=8, memory_mb=4096, storage_mb=100_000))
    reservation = admission_request(node=other, trial=trials[0], need=LIGHT)
    assert admission_try(reservation=reservation) is True
    with FreedWake(node_name=node.name) as wake:
        admission_release(reservation=reservation)
        assert wake.wait(timeout=0.5) is False


@pytest.fixture
def kept_listening(trials, node, monkeypatch):
    """Kept connections (SYNTH_DB_CONN_MAX_AGE > 0, as workers deploy), two heavy trials
    admitted and a third waiting for them; the kept LISTEN connection is closed after."""
    from django.db import connection

    from apps.trials.admission import kept_listener_close

    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)
    reservations = [admission_request(node=node, trial=t, need=HEAVY) for t in trials[:3]]
    assert [admission_try(reservation=r) for r in reservations] == [True, True, False]
    yield reservations
    kept_listener_close()


@pytest.mark.django_db(transaction=True)
def test_a_process_keeps_its_listen_connection_between_waits_and_hears_only_what_is_new(
    kept_listening, node, monkeypatch
):
    """The next waiting trial of the process listens on the same backend, and a release it
    did not wait for (one committed between two waits) does not wake it: the try before its
    wait saw that one."""
    from django.db import connection

    from apps.trials.admission import FreedWake

    with FreedWake(node_name=node.name) as wake:
        backend = wake._conn.info.backend_pid
    admission_release(reservation=kept_listening[0])  # heard by the kept connection, unwaited
    with FreedWake(node_name=node.name) as wake:
        assert wake._conn.info.backend_pid == backend
        assert wake.wait(timeout=0.2) is False  # the earlier release does not wake this wait
        admission_release(reservation=kept_listening[1])
        assert wake.wait(timeout=300) is True
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 0)
    with FreedWake(node_name=node.name) as wake:
        conn = wake._conn
    assert conn.closed and wake._conn is None  # not kept: closed with its wait


@pytest.mark.django_db(transaction=True)
def test_a_kept_listen_connection_the_server_ended_is_replaced(kept_listening, node):
    import psycopg
    from django.db import connection

    from apps.trials.admission import FreedWake

    with FreedWake(node_name=node.name) as wake:
        backend = wake._conn.info.backend_pid
    with connection.cursor() as cursor:  # what a database restart does to it
        cursor.execute("SELECT pg_terminate_backend(%s, 30000)", [backend])  # returns once it is gone
    with FreedWake(node_name=node.name) as wake:
        assert isinstance(wake._conn, psycopg.Connection) and wake._conn.info.backend_pid != backend
        admission_release(reservation=kept_listening[0])
        assert wake.wait(timeout=300) is True


def test_a_worker_process_reads_its_node_and_identity_once_while_fresh(settings, django_assert_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.runs.models import WorkerNode
    from apps.trials.admission import node_current, node_worker

    settings.SYNTH_WORKER_LOOKUP_CHECK_SECONDS = 60  # fresh for the whole test
    settings.SYNTH_WORKER_NAME = "cached-node"
    settings.SYNTH_WORKER_SLOTS = 3
    first = node_current()
    worker = node_worker(node=first)
    with django_assert_num_queries(0):  # each claim read and wrote both before
        assert node_current().pk == first.pk
        assert node_worker(node=first).pk == worker.pk
    settings.SYNTH_WORKER_SLOTS = 5  # another budget is registered at once, not when stale
    assert node_current().slots == 5
    assert WorkerNode.objects.get(pk="cached-node").slots == 5
    settings.SYNTH_WORKER_LOOKUP_CHECK_SECONDS = 0  # off: read and registered every time
    with CaptureQueriesContext(connection) as registered:
        node_current()
    assert any(q["sql"].startswith("UPDATE") for q in registered.captured_queries)


def test_a_grant_runs_its_start_in_its_transaction_and_falls_with_it(trials, node):
    from apps.runs.models import ReservationStatus

    first = admission_request(node=node, trial=trials[0], need=LIGHT)

    def start_fails(usage) -> None:
        raise RuntimeError("the lease was lost meanwhile")

    with pytest.raises(RuntimeError, match="lease was lost"):
        admission_try(reservation=first, on_grant=start_fails)
    first.refresh_from_db()
    assert first.status == ReservationStatus.WAITING  # the grant went with the failed start
    assert node_usage(node=node)["slots"] == 0
    started: list[tuple[str, dict]] = []
    assert admission_try(reservation=first, on_grant=lambda usage: started.append((first.pk, usage))) is True
    # The node's use the grant left, as the grant's event records it: read back, the same.
    assert started == [(first.pk, node_usage(node=node))]
    # A repeat (its acknowledgement lost) finds it granted: the start is not run again.
    assert admission_try(reservation=first, on_grant=lambda usage: started.append((first.pk, usage))) is True
    assert len(started) == 1
    for trial in trials[1:3]:
        assert admission_try(reservation=admission_request(node=node, trial=trial, need=HEAVY)) is True
    last = admission_request(node=node, trial=trials[3], need=HEAVY)  # memory is short now
    assert admission_try(reservation=last, on_grant=lambda usage: started.append((last.pk, usage))) is False
    assert len(started) == 1  # not granted: not started


def _claimed(*, node, trial):
    from apps.runs.leases import trial_claim_read
    from apps.trials.admission import node_worker

    worker = node_worker(node=node)
    lease, claimed = trial_claim_read(worker=worker, trial_id=trial.id, node_name=node.name, related=("task_version",))
    return worker, lease, claimed


# Committed transactions, as the worker makes them (not inside a test's transaction).
@pytest.mark.django_db(transaction=True)
def test_a_grant_and_its_start_lock_the_run_once_and_append_their_events_in_one_statement(trials, node):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.runs.leases import trial_mark_running
    from apps.runs.models import RunEvent, TrialStatus

    worker, lease, trial = _claimed(node=node, trial=trials[0])
    reservation = admission_request(node=node, trial=trial, need=LIGHT, lease=lease)

    def start(usage) -> None:
        granted = [("admission.granted", {"trial": trial.id, "usage": usage})]
        trial_mark_running(
            worker=worker, lease=lease, trial_id=trial.id, data={"need": LIGHT.as_dict()}, events=granted, trial=trial
        )

    with CaptureQueriesContext(connection) as grant:
        assert admission_try(reservation=reservation, on_grant=start) is True
    sql = [q["sql"] for q in grant.captured_queries]
    # Each of these was a round trip of its own, under the run's lock, between a freed slot
    # and the next trial's start: the run's row locked again, the trial read again, a
    # savepoint and its release, the grant's event alone.
    assert sum('FROM "runs_run"' in s and "FOR NO KEY UPDATE" in s for s in sql) == 1
    assert sum('INSERT INTO "runs_runevent"' in s for s in sql) == 1
    assert not any('FROM "runs_trial"' in s for s in sql)
    assert not any(s.startswith("SAVEPOINT") for s in sql)
    events = list(RunEvent.objects.filter(run_id=trial.run_id).order_by("-seq")[:3])[::-1]
    assert [e.type for e in events] == ["reservation.held", "admission.granted", "trial.started"]
    assert [e.seq for e in events] == [events[0].seq, events[0].seq + 1, events[0].seq + 2]
    started = Trial.objects.get(pk=trial.id)
    assert started.status == TrialStatus.RUNNING and started.started_at is not None


# Committed transactions, as the worker makes them (not inside a test's transaction).
@pytest.mark.django_db(transaction=True)
def test_a_start_from_the_claims_reading_is_refused_when_the_trial_moved_meanwhile(trials, node):
    from django.db import transaction

    from apps.core.errors import StaleLease
    from apps.runs.leases import trial_mark_running
    from apps.runs.models import RunEvent, TrialStatus
    from apps.runs.transitions import trial_transition

    worker, lease, trial = _claimed(node=node, trial=trials[0])
    with transaction.atomic():  # cancelled by someone else; the worker's reading still says waiting
        assert trial_transition(trial=Trial.objects.get(pk=trial.id), to=TrialStatus.CANCELLED, event="trial.finished")
    assert trial.status == TrialStatus.WAITING
    with pytest.raises(StaleLease, match="is cancelled, not waiting"):
        trial_mark_running(worker=worker, lease=lease, trial_id=trial.id, data={}, trial=trial)
    assert Trial.objects.get(pk=trial.id).status == TrialStatus.CANCELLED
    assert not RunEvent.objects.filter(run_id=trial.run_id, type="trial.started").exists()

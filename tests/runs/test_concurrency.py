"""Admission under real concurrency, on PostgreSQL."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
from django.db import connection, connections

from apps.runs.models import Run, RunEvent
from tests.conftest import make_client

pytestmark = pytest.mark.django_db(transaction=True)


def test_fifty_concurrent_identical_submissions_make_one_run(alice, inputs):
    assert connection.vendor == "postgresql"
    barrier = threading.Barrier(50)
    results: list[tuple[int, str]] = []
    lock = threading.Lock()

    def submit() -> None:
        client = make_client(alice.secret)
        barrier.wait()
        try:
            resp = client.post("/api/runs", inputs["body"], format="json", HTTP_IDEMPOTENCY_KEY="same-key")
            with lock:
                results.append((resp.status_code, resp.json().get("id", resp.content.decode())))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=submit) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 50
    assert Run.objects.count() == 1
    run = Run.objects.get()
    assert {rid for _, rid in results} == {run.id}
    assert sorted(code for code, _ in results) == [200] * 49 + [201]
    assert RunEvent.objects.filter(run=run, type="run.created").count() == 1


def test_concurrent_event_appends_are_gap_free(alice, inputs):
    from django.db import transaction

    from apps.runs.services import event_append

    run_id = make_client(alice.secret).post("/api/runs", inputs["body"], format="json").json()["id"]

    def append(n: int) -> None:
        try:
            for i in range(n):
                with transaction.atomic():
                    event_append(run_id=run_id, type="progress.tick", data={"i": i})
        finally:
            connections.close_all()

    threads = [threading.Thread(target=append, args=(20,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seqs = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    assert RunEvent.objects.filter(run_id=run_id, type="progress.tick").count() == 160


def test_rows_referring_to_a_locked_run_and_lease_are_inserted_without_waiting(alice, inputs):
    """A trial's writes under its lease lock the run row and the lease row (FOR NO KEY
    UPDATE); meanwhile another worker inserts rows that refer to both (a lease of another
    trial of the run, a write record of the lease): their foreign-key checks take KEY SHARE
    locks, which FOR UPDATE would have made wait for the first transaction's commit (here
    never: a lock timeout error instead)."""
    from django.db import transaction
    from django.utils import timezone

    from apps.runs.leases import _locked_active_lease
    from apps.runs.models import Lease, LeaseWrite
    from tests.runs.test_cancel import big_run, started

    run = big_run(alice, inputs, tasks=2, attempts=1)
    lease, _ = started(run)
    holding, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def hold_run_and_lease() -> None:
        try:
            with transaction.atomic():
                _locked_active_lease(lease_id=lease.id, fence=lease.fence, worker=lease.worker)
                holding.set()
                release.wait(60)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            holding.set()
            connections.close_all()

    holder = threading.Thread(target=hold_run_and_lease)
    holder.start()
    try:
        assert holding.wait(60) and not failures, failures
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '10s'")
        now = timezone.now()
        with transaction.atomic():
            Lease.objects.create(
                run=run, unit="trial:other", worker=lease.worker, fence=1, heartbeat_at=now, expires_at=now
            )
            LeaseWrite.objects.create(lease=lease, local_seq=10_000)
    finally:
        release.set()
        holder.join(60)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    assert not failures, failures


def _holding(hold, holding: threading.Event, release: threading.Event, failures: list[BaseException]) -> None:
    """Run ``hold`` in a transaction of this thread's own connection and keep it open until
    ``release`` is set."""
    from django.db import transaction

    try:
        with transaction.atomic():
            hold()
            holding.set()
            release.wait(60)
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        failures.append(exc)
    finally:
        holding.set()
        connections.close_all()


@contextlib.contextmanager
def _held_open(hold) -> Iterator[None]:
    """``hold`` done in another thread's transaction, kept open for the block."""
    holding, release, failures = threading.Event(), threading.Event(), []
    holder = threading.Thread(target=_holding, args=(hold, holding, release, failures))
    holder.start()
    try:
        assert holding.wait(60) and not failures, failures
        yield
    finally:
        release.set()
        holder.join(60)
    assert not failures, failures


def _enqueue_without_waiting(run_id: str) -> list[str]:
    """trials_enqueue under a lock timeout: a lock it would wait for is an error, not a wait."""
    from django.db import transaction

    from apps.runs.dispatch import trials_enqueue

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '50ms'")
        return trials_enqueue(run_id=run_id)


def test_a_hand_over_does_not_queue_behind_the_run_row_but_behind_another_hand_over(alice, inputs):
    """Every trial transition of a run locks its row; the hand-over of the next trials
    after each trial's end takes a lock of its own instead, which only another hand-over
    of the same run holds."""
    from django.db.utils import OperationalError

    from apps.runs.dispatch import DISPATCH_LOCK_SPACE
    from apps.runs.models import Trial
    from tests.runs.test_cancel import big_run

    run = big_run(alice, inputs, tasks=12, attempts=1)
    Trial.objects.filter(run=run).update(queued_at=None)  # none handed over yet

    def run_row() -> None:
        Run.objects.select_for_update(no_key=True).get(pk=run.pk)

    def hand_over() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [DISPATCH_LOCK_SPACE, run.id])

    # The run's row held by a transition: the hand-over goes ahead.
    with _held_open(run_row):
        ids = _enqueue_without_waiting(run.id)
    assert len(ids) == 8  # the plan's default max_concurrency
    assert Trial.objects.filter(run=run, queued_at__isnull=False).count() == 8

    # Another hand-over of the run in progress: this one waits for it.
    Trial.objects.filter(run=run).update(queued_at=None)
    with _held_open(hand_over), pytest.raises(OperationalError, match="lock timeout"):
        _enqueue_without_waiting(run.id)
    assert Trial.objects.filter(run=run, queued_at__isnull=False).count() == 0  # nothing half done
    assert len(_enqueue_without_waiting(run.id)) == 8


def test_a_hand_over_skips_a_trial_a_cancel_is_ending(alice, inputs):
    """A trial locked by a transaction that ends it (a cancel) is not handed over."""
    from apps.runs.models import Trial, TrialStatus
    from tests.runs.test_cancel import big_run

    run = big_run(alice, inputs, tasks=3, attempts=1)
    Trial.objects.filter(run=run).update(queued_at=None)
    first = Trial.objects.filter(run=run).order_by("pk").first()

    def cancel_first() -> None:
        Trial.objects.filter(pk=first.pk).update(status=TrialStatus.CANCELLED)

    with _held_open(cancel_first):
        ids = _enqueue_without_waiting(run.id)
    assert first.pk not in ids and len(ids) == 2

"""Admission under real concurrency, on PostgreSQL."""

from __future__ import annotations

import threading

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

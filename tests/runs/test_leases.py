from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts.services import worker_get_or_create, worker_token_issue
from apps.runs.leases import lease_reap
from apps.runs.models import Lease, Run, RunEvent
from apps.runs.services import run_schedule
from tests.conftest import make_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued_run(alice, inputs) -> Run:
    run_id = alice.client.post("/api/runs", inputs["body"], format="json").json()["id"]
    return run_schedule(run_id=run_id)


def claim(client):
    resp = client.post("/api/worker/claims", {}, format="json")
    assert resp.status_code in (200, 204), resp.content
    return resp.json()["lease"] if resp.status_code == 200 else None


def types(run_id):
    return list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("type", flat=True))


def test_claim_needs_a_queued_run(alice, inputs, worker_client):
    # Admitted but not yet scheduled (prerequisites unchecked): nothing to claim.
    alice.client.post("/api/runs", inputs["body"], format="json")
    assert claim(worker_client) is None


def test_claim_heartbeat_report_complete(queued_run, worker_client):
    lease = claim(worker_client)
    assert lease["run"] == queued_run.id and lease["fence"] == 1
    assert claim(worker_client) is None  # one holder at a time
    base = f"/api/worker/leases/{lease['id']}"
    hb = worker_client.post(f"{base}/heartbeat", {"fence": 1}, format="json").json()
    assert hb["cancel_requested"] is False
    write = {"fence": 1, "local_seq": 1, "events": [{"type": "progress.note", "data": {"n": 1}}]}
    assert worker_client.post(f"{base}/events", write, format="json").json() == {"applied": True}
    # A retried write is acknowledged once and not applied again.
    assert worker_client.post(f"{base}/events", write, format="json").json() == {"applied": False}
    assert types(queued_run.id).count("progress.note") == 1
    done = worker_client.post(
        f"{base}/complete", {"fence": 1, "outcome": "succeeded", "summary": {"ok": 1}}, format="json"
    )
    assert done.json()["status"] == "succeeded"
    queued_run.refresh_from_db()
    assert queued_run.status == "succeeded" and queued_run.summary == {"ok": 1}
    assert Lease.objects.get(pk=lease["id"]).status == "completed"
    assert types(queued_run.id)[-1] == "run.succeeded"
    # After completion the lease accepts nothing more.
    late = worker_client.post(f"{base}/events", {**write, "local_seq": 2}, format="json")
    assert late.status_code == 409 and late.json()["error"]["type"] == "stale_lease"


def test_workers_may_not_write_lifecycle_events(queued_run, worker_client):
    lease = claim(worker_client)
    resp = worker_client.post(
        f"/api/worker/leases/{lease['id']}/events",
        {"fence": 1, "local_seq": 1, "events": [{"type": "run.succeeded", "data": {}}]},
        format="json",
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["field"] == "events[0].type"


def test_a_stale_holder_is_fenced_off_after_the_reaper(queued_run, worker_client):
    old = claim(worker_client)
    Lease.objects.filter(pk=old["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    # Lapsed but not yet reaped: the holder's writes are already refused.
    resp = worker_client.post(f"/api/worker/leases/{old['id']}/heartbeat", {"fence": 1}, format="json")
    assert resp.status_code == 409
    assert lease_reap() == 1
    queued_run.refresh_from_db()
    assert queued_run.status == "queued"
    assert types(queued_run.id)[-2:] == ["lease.expired", "run.requeued"]

    other = make_client(worker_token_issue(worker=worker_get_or_create(name="second")).secret)
    new = claim(other)
    assert new["fence"] == 2
    for path, body in [
        ("events", {"fence": 1, "local_seq": 5, "events": [{"type": "progress.x"}]}),
        ("complete", {"fence": 1, "outcome": "succeeded"}),
        ("heartbeat", {"fence": 1}),
    ]:
        resp = worker_client.post(f"/api/worker/leases/{old['id']}/{path}", body, format="json")
        assert resp.status_code == 409, path
        assert resp.json()["error"]["type"] == "stale_lease"
    # The old holder cannot use the new lease either: it is not theirs.
    assert (
        worker_client.post(f"/api/worker/leases/{new['id']}/heartbeat", {"fence": 2}, format="json").status_code == 404
    )
    # The new holder completes; the run ends once.
    resp = other.post(
        f"/api/worker/leases/{new['id']}/complete", {"fence": 2, "outcome": "failed", "error": "x"}, format="json"
    )
    assert resp.json()["status"] == "failed"
    assert types(queued_run.id).count("run.failed") == 1


def test_wrong_fence_is_rejected(queued_run, worker_client):
    lease = claim(worker_client)
    resp = worker_client.post(f"/api/worker/leases/{lease['id']}/heartbeat", {"fence": 7}, format="json")
    assert resp.status_code == 409 and resp.json()["error"]["field"] == "fence"


def test_cancellation_reaches_the_holder_through_its_heartbeat(alice, queued_run, worker_client):
    lease = claim(worker_client)
    assert alice.client.post(f"/api/runs/{queued_run.id}/cancel").json()["status"] == "cancelling"
    hb = worker_client.post(f"/api/worker/leases/{lease['id']}/heartbeat", {"fence": 1}, format="json").json()
    assert hb["cancel_requested"] is True
    worker_client.post(
        f"/api/worker/leases/{lease['id']}/complete", {"fence": 1, "outcome": "cancelled"}, format="json"
    )
    queued_run.refresh_from_db()
    assert queued_run.status == "cancelled"


def test_cancelled_run_whose_holder_vanished_ends_at_reap(alice, queued_run, worker_client):
    lease = claim(worker_client)
    alice.client.post(f"/api/runs/{queued_run.id}/cancel")
    Lease.objects.filter(pk=lease["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    lease_reap()
    queued_run.refresh_from_db()
    assert queued_run.status == "cancelled"
    assert claim(worker_client) is None


def test_release_requeues(queued_run, worker_client):
    lease = claim(worker_client)
    worker_client.post(f"/api/worker/leases/{lease['id']}/release", {"fence": 1, "reason": "shutdown"}, format="json")
    queued_run.refresh_from_db()
    assert queued_run.status == "queued"
    assert claim(worker_client)["fence"] == 2


def test_org_bound_worker_only_sees_its_org(queued_run, bob):
    bobs_worker = worker_get_or_create(name="rival-worker", org=bob.org)
    client = make_client(worker_token_issue(worker=bobs_worker).secret)
    assert claim(client) is None


def test_roles_are_separate(alice, queued_run, worker_client):
    assert alice.client.post("/api/worker/claims", {}, format="json").status_code == 403
    assert worker_client.get("/api/runs").status_code == 403
    assert worker_client.get(f"/api/runs/{queued_run.id}").status_code == 403

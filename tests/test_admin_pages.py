"""Every admin page an operator uses renders: changelists and change views of each model."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.urls import reverse

from apps.accounts.services import worker_get_or_create
from apps.runs.dispatch import run_dispatch
from apps.runs.leases import trial_claim
from apps.runs.services import run_schedule
from apps.trials.admission import Budget, Need, admission_request, node_register

pytestmark = pytest.mark.django_db


def test_every_model_admin_renders(admin_client, alice, inputs):
    run_id = alice.client.post("/api/runs", inputs["body"], format="json").json()["id"]
    run_schedule(run_id=run_id)
    run_dispatch(run_id=run_id)
    from apps.runs.models import Trial

    trial = Trial.objects.filter(run_id=run_id).first()
    trial_claim(worker=worker_get_or_create(name="w"), trial_id=trial.id, node_name="n")
    node = node_register(name="n", budget=Budget(slots=2, cpus=2, memory_mb=1024, storage_mb=1024))
    admission_request(node=node, trial=trial, need=Need(cpus=1, memory_mb=256, storage_mb=10))
    checked = 0
    for model in admin.site._registry:
        meta = model._meta
        url = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        resp = admin_client.get(url)
        assert resp.status_code == 200, (url, resp.status_code)
        obj = model._default_manager.first()
        if obj is not None:
            url = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[obj.pk])
            resp = admin_client.get(url)
            assert resp.status_code == 200, (url, resp.status_code)
            checked += 1
    assert checked >= 15
    # The run page links its spec, and shows its events and groups.
    page = admin_client.get(reverse("admin:runs_run_change", args=[run_id])).content.decode()
    assert "run.created" in page and "/admin/runs/runspec/" in page

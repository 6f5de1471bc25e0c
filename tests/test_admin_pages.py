"""Every admin page an operator uses renders: changelists and change views of each model."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils.html import escape

from apps.accounts.services import worker_get_or_create
from apps.runs.dispatch import run_dispatch
from apps.runs.leases import trial_claim
from apps.runs.models import Trial
from apps.runs.services import run_schedule
from apps.trials.admission import Budget, Need, admission_request, node_register
from tests.browser.scenes import LOG_TEXT, make_train_scene
from tests.harness.conftest import tokenizer_dir  # noqa: F401,F811 - fixture

pytestmark = pytest.mark.django_db


def test_every_model_admin_renders(admin_client, alice, inputs):
    run_id = alice.client.post("/api/runs", inputs["body"], format="json").json()["id"]
    run_schedule(run_id=run_id)
    run_dispatch(run_id=run_id)
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
    # The run page links its spec and its events (listed apart, not inline).
    page = admin_client.get(reverse("admin:runs_run_change", args=[run_id])).content.decode()
    assert "/admin/runs/runspec/" in page and f"/admin/runs/runevent/?run__id__exact={run_id}" in page
    assert "run.created" not in page
    events = admin_client.get(reverse("admin:runs_runevent_changelist"), {"run__id__exact": run_id}).content.decode()
    assert "run.created" in events


def test_the_admin_is_branded(admin_client):
    page = admin_client.get(reverse("admin:index")).content.decode()
    assert "Synth operations" in page and "<title>" in page and "Synth admin" in page


def test_a_run_page_shows_progress_tasks_and_the_learning_curve(admin_client, alice):
    scene = make_train_scene(org=alice.org)
    page = admin_client.get(reverse("admin:runs_run_change", args=[scene.run.id])).content.decode()
    # Three of four trials are done: two succeeded, one failed, one running.
    assert '<strong id="run-progress">3 / 4</strong>' in page
    assert "(running 1, succeeded 2, failed 1)" in page
    # The per-task table: task one's two attempts passed 1 of 2 (mean 0.5); task two's
    # timeout counts as an assessed 0 and is listed as an error.
    tasks = page.split('id="run-tasks"')[1].split("</table>")[0]
    assert tasks.count("<tr>") == 3  # header + two tasks
    assert "0.500" in tasks and "@1 0.500" in tasks and "AgentTimeoutError &times;1" in tasks
    # The chart has one point per update for reward and for loss, with their values.
    chart = page.split('<svg class="synth-chart"')[1].split("</svg>")[0]
    assert chart.count('data-series="reward" data-x=') == 3 and chart.count('data-series="loss" data-x=') == 3
    assert 'data-x="2" data-y="0.75"' in chart and 'data-x="1" data-y="1.25"' in chart
    # Links to the learning updates and checkpoints; the trials are inline.
    assert f"/admin/training/learningupdate/?run__id__exact={scene.run.id}" in page
    assert f"/admin/training/checkpoint/?run__id__exact={scene.run.id}" in page
    assert reverse("admin:runs_trial_change", args=[quote(scene.trial.id)]) in page


def test_inlines_are_paged(admin_client, alice, monkeypatch):
    from apps.runs.admin import RunTrialInline

    scene = make_train_scene(org=alice.org)
    monkeypatch.setattr(RunTrialInline, "per_page", 3)
    url = reverse("admin:runs_run_change", args=[scene.run.id])
    first = admin_client.get(url).content.decode()
    second = admin_client.get(url, {"trial-page": 2}).content.decode()
    ids = list(
        Trial.objects.filter(run=scene.run)
        .order_by("group__step", "group__position", "attempt")
        .values_list("id", flat=True)
    )
    assert all(_change_url(i) in first for i in ids[:3])
    assert _change_url(ids[3]) not in first
    assert "1&ndash;3 of 4" in first and "?trial-page=2" in first
    assert _change_url(ids[3]) in second and "4&ndash;4 of 4" in second


def _change_url(trial_id: str) -> str:
    # As the admin writes it in links: primary keys quoted ("_" is "_5F").
    return reverse("admin:runs_trial_change", args=[quote(trial_id)])


def test_a_trial_page_shows_its_log_and_downloads_it(admin_client, alice):
    scene = make_train_scene(org=alice.org)
    page = admin_client.get(reverse("admin:runs_trial_change", args=[scene.trial.id])).content.decode()
    assert "agent/trial.log" in page and escape(LOG_TEXT) in page
    assert "binary content" in page  # the binary artifact is not dumped
    download = reverse("admin:runs_artifact_download", args=[scene.artifact.pk])
    assert download in page
    resp = admin_client.get(download)
    assert resp.status_code == 200 and b"".join(resp.streaming_content) == LOG_TEXT.encode()
    assert 'attachment; filename="trial.log"' in resp["Content-Disposition"]


def test_a_long_artifact_is_shown_only_in_part(alice):
    from apps.runs.admin_selectors import artifact_preview

    scene = make_train_scene(org=alice.org)
    preview = artifact_preview(artifact=scene.artifact, limit=10)
    assert preview.text == LOG_TEXT[:10] and preview.truncated


def test_the_download_needs_a_staff_login(client, alice):
    scene = make_train_scene(org=alice.org)
    resp = client.get(reverse("admin:runs_artifact_download", args=[scene.artifact.pk]))
    assert resp.status_code == 302 and "/admin/login/" in resp["Location"]


def test_an_interaction_page_decodes_the_prompt_and_completion(admin_client, alice, tokenizer_dir, settings):  # noqa: F811
    from apps.proxy.models import Interaction
    from apps.proxy.routes import DEFAULT_ROUTE, route_upsert
    from apps.proxy.tokenizers import tokenizer_load

    settings.SYNTH_TOKENIZER_DIR = tokenizer_dir
    route, _ = route_upsert(**DEFAULT_ROUTE)
    tokenizer = tokenizer_load("qwen3", root=tokenizer_dir)
    prompt = "<|im_start|>user\nWrite hello.txt<|im_end|>\n<|im_start|>assistant\n"
    interaction = Interaction.objects.create(
        org=alice.org,
        principal_kind="attempt",
        route=route,
        model_requested="sonnet",
        payload={"prompt_ids": tokenizer.encode(prompt).ids, "output_ids": tokenizer.encode("Done: hello & bye").ids},
    )
    page = admin_client.get(reverse("admin:proxy_interaction_change", args=[interaction.pk])).content.decode()
    assert escape(prompt) in page and escape("Done: hello & bye") in page

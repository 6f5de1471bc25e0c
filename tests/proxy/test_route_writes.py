"""Routes name a family an adapter renders: the command, the admin and the service refuse others."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from apps.core.errors import ValidationFailed
from apps.proxy.adapters.registry import ADAPTERS
from apps.proxy.models import ModelRoute
from apps.proxy.routes import route_upsert

ROOT = Path(__file__).resolve().parents[2]
SPEC = {
    "name": "r1",
    "family": "qwen3",
    "tokenizer": "qwen3",
    "context_window": 32768,
    "max_output": 4096,
    "sampler_backend": "instant",
}


@pytest.mark.django_db
def test_service_refuses_an_unknown_family_with_field_family() -> None:
    with pytest.raises(ValidationFailed) as refused:
        route_upsert(**{**SPEC, "family": "llama3"})
    assert refused.value.field == "family" and refused.value.status_code == 400
    assert "'llama3'" in refused.value.message and "qwen3" in refused.value.message
    assert not ModelRoute.objects.exists()
    route_upsert(**SPEC)
    with pytest.raises(ValidationFailed):  # an edit too
        route_upsert(**{**SPEC, "family": "qwen"})
    assert ModelRoute.objects.get(name="r1").family == "qwen3"


@pytest.mark.django_db
@pytest.mark.parametrize("family", sorted(ADAPTERS))
def test_service_accepts_every_adapter_family(family: str) -> None:
    route, created = route_upsert(**{**SPEC, "name": f"r-{family}", "family": family})
    assert created and route.family == family


@pytest.mark.django_db
def test_route_add_refuses_an_unknown_family() -> None:
    args = ["--context-window", "1000", "--max-output", "100", "--backend", "instant"]
    with pytest.raises(CommandError, match=r"unknown family 'gpt-9'; known families: deepseek-r1, "):
        call_command("route_add", "r2", "--family", "gpt-9", *args)
    assert not ModelRoute.objects.filter(name="r2").exists()
    call_command("route_add", "r2", "--family", "kimi-k2", *args)
    with pytest.raises(CommandError, match="unknown family 'kimi'"):
        call_command("route_add", "r2", "--family", "kimi")
    assert ModelRoute.objects.get(name="r2").family == "kimi-k2"


@pytest.mark.django_db(transaction=True)
def test_route_add_command_line_prints_one_line_and_fails() -> None:
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "DJANGO_SETTINGS_MODULE": "synth_project.settings",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "route_add", "r3", "--family", "mistral", "--context-window", "1000"]
        + ["--max-output", "100", "--backend", "instant"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("CommandError: unknown family 'mistral'"), done.stderr
    assert not ModelRoute.objects.filter(name="r3").exists()


@pytest.mark.django_db
def test_admin_form_refuses_an_unknown_family(admin_client) -> None:
    form = {
        "name": "r4",
        "family": "qwen-3",
        "tokenizer": "qwen3",
        "context_window": "32768",
        "max_output": "4096",
        "sampler_backend": "instant",
        "sampler_config": "{}",
        "aliases": "[]",
        "inference_enabled": "on",
    }
    page = admin_client.post(reverse("admin:proxy_modelroute_add"), form)
    assert page.status_code == 200  # the form again, with its errors
    errors = page.context["adminform"].form.errors
    assert list(errors) == ["family"] and "unknown family 'qwen-3'" in errors["family"][0]
    assert not ModelRoute.objects.filter(name="r4").exists()
    saved = admin_client.post(reverse("admin:proxy_modelroute_add"), {**form, "family": "glm-4.6"})
    assert saved.status_code == 302
    route = ModelRoute.objects.get(name="r4")
    assert route.family == "glm-4.6"
    edit = admin_client.post(reverse("admin:proxy_modelroute_change", args=[route.pk]), {**form, "family": "glm"})
    assert edit.status_code == 200 and list(edit.context["adminform"].form.errors) == ["family"]
    assert ModelRoute.objects.get(pk=route.pk).family == "glm-4.6"

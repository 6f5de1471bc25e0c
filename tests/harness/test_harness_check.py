"""`manage.py harness_check`: the installed harness on a scripted task through a real proxy
process (its own uvicorn process, the production ASGI app, a scripted Qwen3 sampler), in the
local sandbox, with its calls captured; and the train-run gate keyed by the harness's digest.

The failing cases are real failures of the two properties, not of the plumbing: a harness
that changes the tool call it echoes back (a synth-mini copy that adds a default argument),
and a re-rendering that drifts from what the proxy rendered when it captured (the adapter in
the checking process patched to render other ids).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command

from apps.proxy.models import HarnessCheck, Interaction
from apps.proxy.routes import DEFAULT_ROUTE, route_upsert
from apps.runs.models import Run
from apps.trials.harness_check.service import CHECK_RUN
from synth_launcher import engines
from tests.harness.conftest import harness_checked
from tests.trials.conftest import EXAMPLES, Stack

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _train_body(alice) -> dict:
    from apps.datasets.services import dataset_import_dir
    from apps.profiles.services import profile_publish

    dataset, _ = dataset_import_dir(org=alice.org, name="toys", version="v1", path=EXAMPLES / "train-tasks")
    recipe = json.loads((EXAMPLES / "agent.json").read_text())
    version, _ = profile_publish(org=alice.org, name="claude-coder", recipe=recipe, created_by=None)
    return {
        "kind": "train",
        "dataset": dataset.reference,
        "actor": {"profile": "claude-coder", "version": version.version},
        "plan": {"batch_size": 1, "group_size": 2, "steps": 1},
    }


def test_claude_code_passes_and_unlocks_training(alice, tmp_path, tokenizer_dir, settings, monkeypatch):
    from apps.trials.harness_check.identity import harness_identity

    route_upsert(**{**DEFAULT_ROUTE, "trainable": True})
    body = _train_body(alice)
    identity = harness_identity(engine="claude-code")
    # A failed check of this very build unlocks nothing.
    HarnessCheck.objects.create(engine="claude-code", digest=identity.digest, family="qwen3", passed=False)

    refused = alice.client.post("/api/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="t1")
    assert refused.status_code == 400, refused.content
    error = refused.json()["error"]
    assert error["field"] == "actor.engine"
    assert "run `manage.py harness_check claude-code`" in error["message"]
    assert identity.digest[:16] in error["message"]
    assert Run.objects.count() == 0

    # The command, as an operator runs it: the check's proxy gets this process's environment.
    for name, value in Stack(tmp_path).env.items():
        monkeypatch.setenv(name, value)
    settings.SYNTH_TOKENIZER_DIR = tokenizer_dir
    out = io.StringIO()
    call_command("harness_check", "claude-code", stdout=out)
    summary = out.getvalue()
    assert summary.splitlines()[0].startswith(f"claude-code {identity.version} (sha256 {identity.digest[:16]}): PASSED")

    check = HarnessCheck.objects.get(passed=True)
    assert (check.engine, check.digest, check.harness_version, check.family) == (
        "claude-code",
        hashlib.sha256(identity.path.read_bytes()).hexdigest(),
        json.loads((identity.path.parents[1] / "package.json").read_text())["version"],
        "qwen3",
    )
    report = check.report
    # What Claude Code sent: the Messages endpoint, its credential header and the correlation
    # header the launcher set, never a header's secret value; its tools.
    assert "POST /v1/messages" in report["requests"]["endpoints"]
    assert {"x-api-key", "x-synth-trial", "anthropic-version"} <= set(report["requests"]["header_names"])
    assert "x-api-key" not in report["requests"]["header_values"]
    assert {"messages", "model", "tools", "system"} <= set(report["requests"]["body_keys"]["POST /v1/messages"])
    assert "Bash" in report["requests"]["tool_names"]
    assert report["checks"] == {"rerender": True, "tool_round_trip": True, "harness": True}
    assert report["failures"] == []
    assert len(report["calls"]) >= 2 and all(c["rerenders"] for c in report["calls"])
    [bash] = [t for t in report["tool_calls"] if t["name"] == "Bash"]
    assert bash["request_matches"] and bash["result_sent"] and bash["sampled_ids_in_next_prompt"]
    assert bash["next_prompt_extends"]
    assert report["attempt"]["rewards"] == {"reward": 1.0}
    # The calls were captured like an attempt's, under the check's own run id.
    captured = Interaction.objects.filter(run_id=CHECK_RUN, trial_id=check.id)
    assert captured.count() == len(report["calls"])
    assert {c.correlation_id for c in captured} == {check.id}

    accepted = alice.client.post("/api/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="t2")
    assert accepted.status_code == 201, accepted.content


def test_codex_passes_and_unlocks_training(alice, tmp_path, tokenizer_dir):
    from apps.datasets.services import dataset_import_dir
    from apps.profiles.services import profile_publish
    from apps.trials.harness_check.identity import harness_identity

    route_upsert(**{**DEFAULT_ROUTE, "trainable": True})
    dataset, _ = dataset_import_dir(org=alice.org, name="toys", version="v1", path=EXAMPLES / "train-tasks")
    recipe = {
        "model": {"route": DEFAULT_ROUTE["name"]},
        "engine": {"name": "codex", "version": "0.171.0"},
        "limits": {"timeout_sec": 600},
    }
    version, _ = profile_publish(org=alice.org, name="codex-coder", recipe=recipe, created_by=None)
    body = {
        "kind": "train",
        "dataset": dataset.reference,
        "actor": {"profile": "codex-coder", "version": version.version},
        "plan": {"batch_size": 1, "group_size": 2, "steps": 1},
    }
    refused = alice.client.post("/api/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="c1")
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "actor.engine"
    assert "run `manage.py harness_check codex`" in refused.json()["error"]["message"]

    check = harness_checked(engine="codex", tmp=tmp_path, tokenizer_dir=tokenizer_dir)
    assert check.passed, check.report["failures"]
    assert check.digest == harness_identity(engine="codex").digest
    report = check.report
    # Codex speaks only the Responses API, with its credential as a bearer token.
    assert list(report["requests"]["endpoints"]) == ["POST /v1/responses"]
    assert {"authorization", "x-synth-trial"} <= set(report["requests"]["header_names"])
    assert {"input", "model", "tools"} <= set(report["requests"]["body_keys"]["POST /v1/responses"])
    assert "exec_command" in report["requests"]["tool_names"]
    [shell] = [t for t in report["tool_calls"] if t["name"] == "exec_command"]
    assert shell["request_matches"] and shell["result_sent"] and shell["sampled_ids_in_next_prompt"]
    assert all(c["rerenders"] for c in report["calls"]) and report["attempt"]["rewards"] == {"reward": 1.0}

    accepted = alice.client.post("/api/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="c2")
    assert accepted.status_code == 201, accepted.content


def _mangled_synth_mini(tmp: Path) -> Path:
    """synth-mini, changed to add a default argument to every tool call it sends back (as
    harnesses that normalize tool inputs do)."""
    source = engines.SYNTH_MINI_SOURCE.read_text()
    original = 'messages.append({"role": "assistant", "content": content})'
    assert original in source
    mangled = tmp / "mini_agent_mangled.py"
    mangled.write_text(
        source.replace(
            original,
            'messages.append({"role": "assistant", "content": [dict(b, input={**b["input"], "timeout": 60}) '
            'if b.get("type") == "tool_use" else b for b in content]})',
        )
    )
    return mangled


def test_a_harness_that_changes_the_tool_call_fails(tmp_path, tokenizer_dir, monkeypatch):
    mangled = _mangled_synth_mini(tmp_path)
    engine = engines.ENGINES["synth-mini"]
    upload = dataclasses.replace(engine.uploads[0], source=mangled)
    monkeypatch.setitem(engines.ENGINES, "synth-mini", dataclasses.replace(engine, uploads=(upload,)))

    check = harness_checked(engine="synth-mini", tmp=tmp_path, tokenizer_dir=tokenizer_dir)
    assert not check.passed
    # The build that ran is the one recorded: a check of the real synth-mini is another digest.
    assert check.digest == hashlib.sha256(mangled.read_bytes()).hexdigest()
    report = check.report
    assert report["checks"] == {"rerender": True, "tool_round_trip": False, "harness": True}
    [bash] = report["tool_calls"]
    assert bash["returned"] and not bash["request_matches"] and not bash["sampled_ids_in_next_prompt"]
    assert any("came back changed" in f and '"timeout": 60' in f for f in report["failures"]), report["failures"]


def test_a_rerender_that_drifts_from_the_capture_fails(tmp_path, tokenizer_dir, monkeypatch):
    from apps.proxy.adapters.registry import ADAPTERS

    cls = ADAPTERS["qwen3"]
    render = cls.render

    def drifted(self, *, request):
        rendered = render(self, request=request)
        return dataclasses.replace(rendered, token_ids=list(rendered.token_ids)[:-1])

    # Only this process re-renders differently; the proxy process rendered (and captured) as ever.
    monkeypatch.setattr(cls, "render", drifted)
    check = harness_checked(engine="synth-mini", tmp=tmp_path, tokenizer_dir=tokenizer_dir)
    assert not check.passed
    report = check.report
    assert report["checks"]["rerender"] is False and report["checks"]["harness"] is True
    assert all(not c["rerenders"] for c in report["calls"])
    assert any("re-renders to other ids" in f for f in report["failures"]), report["failures"]


def test_bad_input_is_one_line_and_exit_2(settings, tmp_path):
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_:
        call_command("harness_check", "claude-kode", stderr=err)
    assert exit_.value.code == 2
    assert err.getvalue().strip() == (
        "harness_check: unknown engine 'claude-kode' (checkable: claude-code, codex, synth-mini)"
    )

    settings.SYNTH_CLAUDE_CODE_BIN = str(tmp_path / "absent" / "claude")
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_:
        call_command("harness_check", "claude-code", stderr=err)
    assert exit_.value.code == 2
    assert len(err.getvalue().strip().splitlines()) == 1 and "is not installed" in err.getvalue()
    fake = tmp_path / "claude"
    fake.write_text("#!/bin/sh\necho 2.1.0\n")
    settings.SYNTH_CLAUDE_CODE_BIN = str(fake)
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_:
        call_command("harness_check", "claude-code", stderr=err)
    assert exit_.value.code == 2 and "is not a native executable" in err.getvalue()
    with pytest.raises(SystemExit):
        call_command("harness_check", "command", stderr=io.StringIO())
    assert HarnessCheck.objects.count() == 0

"""The real Codex CLI, headless, through the whole platform; only the model is scripted.

API -> run admission -> Celery control + trials workers -> a Harbor trial in the local
bubblewrap sandbox -> Codex (the pinned npm package's native executable, bound read-only;
its config.toml written by the launcher) -> the model bridge inside the sandbox -> the proxy
process on its Unix socket (/v1/responses: scoped credential, Qwen3 rendering and parsing,
capture) -> a ScriptedSampler emitting Qwen3 native tool-call tokens
(tests/harness/codex_script.py) -> Codex's shell tool in the sandbox -> the task's verifier ->
reward, artifacts, evidence, revocation.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from apps.accounts.models import ModelCredential
from apps.datasets.services import dataset_import_dir
from apps.objects.selectors import object_get
from apps.objects.services import object_read
from apps.profiles.services import profile_publish
from apps.proxy.adapters.registry import adapter_for
from apps.proxy.models import Delivery, Integrity, Interaction
from apps.proxy.routes import route_upsert
from apps.runs.models import Artifact, Run, Trial
from tests.harness import codex_script as script
from tests.harness.conftest import proxy_start
from tests.trials.conftest import wait_for

# Not skipped when missing: CI installs node_modules with npm ci, so a missing Codex is a failure.
CODEX = Path(django_settings.SYNTH_CODEX_SANDBOX_BIN)

pytestmark = [pytest.mark.slow]

ROUTE = "harness-codex-scripted"
RECIPE = {
    "model": {"route": ROUTE},
    "engine": {"name": "codex", "version": "0.171.0"},
    "instruction": {"via": "argument"},
    "limits": {"timeout_sec": 120},
}


def _task(root: Path) -> Path:
    d = root / "tasks" / "codex-writes-a-file"
    (d / "environment").mkdir(parents=True)
    (d / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    (d / "task.toml").write_text(
        textwrap.dedent("""\
        version = "1.0"
        [agent]
        timeout_sec = 120.0
        [verifier]
        timeout_sec = 30.0
        [environment]
        memory_mb = 2048
        storage_mb = 512
        workdir = "/app"
        """)
    )
    (d / "instruction.md").write_text(f"{script.TASK_MARKER}: write ok to {script.OUT_PATH}.\n")
    (d / "tests").mkdir()
    (d / "tests" / "test.sh").write_text(
        "#!/bin/bash\n"
        f'if [ "$(cat {script.OUT_PATH})" = ok ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n'
    )
    (d / "solution").mkdir()
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho ok > {script.OUT_PATH}\n")
    return d.parent


def _payload(interaction: Interaction) -> dict[str, Any]:
    obj = object_get(org=interaction.org, sha256=interaction.payload_sha256)
    return json.loads(object_read(obj=obj))


def test_codex_runs_a_task_through_the_proxy(stack, alice, tmp_path, proxy_socket, tokenizer_dir, settings):
    assert CODEX.is_file(), f"{CODEX} is missing: run `npm ci` in the repository root"
    started = time.monotonic()
    route_upsert(
        name=ROUTE,
        family="qwen3",
        tokenizer="qwen3",
        context_window=131072,
        max_output=32000,
        sampler_backend="scripted",
        sampler_config={"choose": "tests.harness.codex_script:choose"},
        aliases=[],
    )
    dsv, _ = dataset_import_dir(org=alice.org, name="harness", version="1", path=_task(tmp_path))
    version, _ = profile_publish(org=alice.org, name="codex", recipe=RECIPE, created_by=None)

    proxy_start(stack, socket_path=proxy_socket, tokenizer_dir=tokenizer_dir)
    stack.start_worker("w1", queues="control,trials,evidence", extra_env={"SYNTH_PROXY_SOCKET": str(proxy_socket)})
    ready = time.monotonic()
    resp = alice.client.post(
        "/api/runs",
        {
            "kind": "evaluate",
            "dataset": dsv.reference,
            "actor": {"profile": "codex", "version": version.version},
            "plan": {"attempts_per_task": 1},
        },
        format="json",
    )
    assert resp.status_code == 201, resp.content
    run_id = resp.json()["id"]
    run = wait_for(
        lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r, timeout=180, what=f"run {run_id}", stack=stack
    )
    finished = time.monotonic()
    trial = Trial.objects.get(run_id=run_id)
    assert run.status == "succeeded", (run.summary, stack.logs())
    assert trial.status == "succeeded", (trial.error_type, trial.error_message, stack.logs())
    assert trial.reward == 1.0, (trial.rewards, stack.logs())

    # Every model call was captured as a Responses call and attributed to the attempt: by the
    # credential (run, trial) and by the correlation header of Codex's provider config.
    calls = list(Interaction.objects.filter(trial_id=trial.id).select_related("org", "route").order_by("created_at"))
    assert len(calls) == 2, [(c.protocol, c.stop_reason) for c in calls]
    assert {c.protocol for c in calls} == {"responses"}
    assert {c.run_id for c in calls} == {run_id}
    assert {c.correlation_id for c in calls} == {trial.id}
    assert {c.route.name for c in calls} == {ROUTE}
    assert {c.principal_kind for c in calls} == {"attempt"}
    assert all(c.delivery == Delivery.DELIVERED for c in calls), [(c.delivery, c.delivery_error) for c in calls]
    assert all(c.prompt_tokens > 1000 and c.output_tokens > 0 for c in calls)  # Codex's own prompt and tools
    wait_for(
        lambda: all(
            i.integrity != Integrity.STAGED for i in Interaction.objects.filter(trial_id=trial.id).only("integrity")
        ),
        timeout=30,
        what="the interactions to be published",
        stack=stack,
    )

    # Read again: the rows fetched above may predate their publication (a run can finish
    # before the evidence worker has published its last call), and so lack its reference.
    for c in calls:
        c.refresh_from_db()
    # The exact tokens: each captured request re-renders to its captured prompt ids, and the
    # second call's prompt begins with the first call's prompt and sampled ids (Codex sent the
    # tool call back as it was parsed, and it renders to the same tokens).
    payloads = [_payload(c) for c in calls]
    settings.SYNTH_TOKENIZER_DIR = tokenizer_dir  # where the adapter registry loads from
    adapter = adapter_for("qwen3")
    for payload in payloads:
        rendered = list(adapter.render(request=json.loads(payload["request_json"])).token_ids)
        assert rendered == payload["prompt_ids"]
    first = payloads[0]["prompt_ids"] + payloads[0]["output_ids"]
    assert payloads[1]["prompt_ids"][: len(first)] == first

    # The JSONL transcript is an artifact, and it shows the command Codex ran and its answer.
    transcript = Artifact.objects.get(trial=trial, name="agent/codex.jsonl")
    assert transcript.kind == "transcript"
    events = [json.loads(line) for line in object_read(obj=transcript.object).decode().splitlines() if line.strip()]
    done = [e["item"] for e in events if e["type"] == "item.completed"]
    commands = [item for item in done if item["type"] == "command_execution"]
    assert len(commands) == 1 and script.SHELL_ARGUMENTS["cmd"] in commands[0]["command"], commands
    assert commands[0]["exit_code"] == 0
    assert [item["text"] for item in done if item["type"] == "agent_message"] == [script.FINAL_TEXT]
    assert events[-1]["type"] == "turn.completed"

    # The credential was scoped to this attempt and revoked when it ended; no stored file of
    # the trial holds the secret.
    cred = ModelCredential.objects.get(trial_id=trial.id)
    assert (cred.run_id, cred.route, cred.org_id) == (run_id, ROUTE, alice.org.id)
    assert cred.revoked_at is not None and cred.revoked_at <= trial.finished_at
    secret_head = f"synm_{cred.prefix}_".encode()
    for artifact in Artifact.objects.filter(trial=trial).select_related("object"):
        assert secret_head not in object_read(obj=artifact.object), artifact.name

    print(
        f"\ncodex e2e: setup {ready - started:.1f}s, run {finished - ready:.1f}s, "
        f"agent {trial.timings.get('agent_execution', {}).get('seconds')}s, {len(calls)} model calls, "
        f"prompt tokens {[c.prompt_tokens for c in calls]}"
    )

"""The real Claude Code, headless, through the whole platform; only the model is scripted.

API -> run admission -> Celery control + trials workers -> a Harbor trial in the local
bubblewrap sandbox -> Claude Code (the pinned npm package, bound read-only into the sandbox)
-> the model bridge inside the sandbox -> the proxy process on its Unix socket (scoped
credential, Qwen3 rendering and parsing, capture) -> a ScriptedSampler emitting Qwen3
native tool-call tokens (tests/harness/script.py) -> Bash and a delegated Agent run by Claude
Code in the sandbox -> the task's verifier -> reward, artifacts, evidence, revocation.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest
from django.conf import settings

from apps.accounts.models import ModelCredential
from apps.datasets.services import dataset_import_dir
from apps.objects.services import object_read
from apps.profiles.services import profile_publish
from apps.proxy.models import Delivery, Integrity, Interaction
from apps.proxy.routes import route_upsert
from apps.runs.models import Artifact, Run, Trial
from tests.harness import script
from tests.harness.conftest import proxy_start
from tests.trials.conftest import EXAMPLES, wait_for

CLAUDE = Path(settings.SYNTH_CLAUDE_CODE_BIN)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CLAUDE.exists(),
        reason=f"Claude Code is not installed at {CLAUDE}: run `npm ci` in the repository root (deploy/setup.sh does)",
    ),
]

ROUTE = "harness-scripted"


def _task(root: Path) -> Path:
    d = root / "tasks" / "claude-code-delegates"
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
    (d / "instruction.md").write_text(
        f"{script.TASK_MARKER}: write ok to {script.OUT_PATH}, then have a sub-agent check it.\n"
    )
    (d / "tests").mkdir()
    (d / "tests" / "test.sh").write_text(
        "#!/bin/bash\n"
        f'if [ "$(cat {script.OUT_PATH})" = ok ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n'
    )
    (d / "solution").mkdir()
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho ok > {script.OUT_PATH}\n")
    return d.parent


def test_claude_code_runs_a_task_through_the_proxy(stack, alice, tmp_path, proxy_socket, tokenizer_dir):
    started = time.monotonic()
    route_upsert(
        name=ROUTE,
        family="qwen3",
        tokenizer="qwen3",
        context_window=131072,
        max_output=32000,
        sampler_backend="scripted",
        sampler_config={"choose": "tests.harness.script:choose"},
        aliases=["claude-*", "sonnet", "opus", "haiku"],
    )
    dsv, _ = dataset_import_dir(org=alice.org, name="harness", version="1", path=_task(tmp_path))
    recipe = json.loads((EXAMPLES / "agent.json").read_text())
    recipe["model"] = {"route": ROUTE}
    version, _ = profile_publish(org=alice.org, name="claude-code", recipe=recipe, created_by=None)

    proxy_start(stack, socket_path=proxy_socket, tokenizer_dir=tokenizer_dir)
    stack.start_worker("w1", queues="control,trials,evidence", extra_env={"SYNTH_PROXY_SOCKET": str(proxy_socket)})
    ready = time.monotonic()
    resp = alice.client.post(
        "/api/runs",
        {
            "kind": "evaluate",
            "dataset": dsv.reference,
            "actor": {"profile": "claude-code", "version": version.version},
            "plan": {"attempts_per_task": 1},
        },
        format="json",
    )
    assert resp.status_code == 201, resp.content
    run_id = resp.json()["id"]
    run = wait_for(
        lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r, timeout=120, what=f"run {run_id}", stack=stack
    )
    finished = time.monotonic()
    trial = Trial.objects.get(run_id=run_id)
    assert run.status == "succeeded", (run.summary, stack.logs())
    assert trial.status == "succeeded", (trial.error_type, trial.error_message, stack.logs())
    assert trial.reward == 1.0, (trial.rewards, stack.logs())

    # Every model call of the attempt was captured and attributed to it: by the credential
    # (run, trial) and by the correlation header the launcher sets.
    calls = list(Interaction.objects.filter(trial_id=trial.id).order_by("created_at"))
    assert len(calls) >= 4, [(c.agent_id, c.stop_reason) for c in calls]
    assert {c.run_id for c in calls} == {run_id}
    assert {c.correlation_id for c in calls} == {trial.id}
    assert {c.route.name for c in calls} == {ROUTE}
    assert {c.principal_kind for c in calls} == {"attempt"}
    assert all(c.delivery == Delivery.DELIVERED for c in calls), [(c.delivery, c.delivery_error) for c in calls]
    assert len({c.session_id for c in calls}) == 1 and calls[0].session_id
    delegated = [c for c in calls if c.agent_id]
    main = [c for c in calls if not c.agent_id]
    assert delegated, "no call carried the delegated agent's x-claude-code-agent-id"
    assert [c.stop_reason for c in main] == ["tool_use", "tool_use", "end_turn"]
    assert all(c.stop_reason == "end_turn" for c in delegated)
    assert all(c.prompt_tokens > 1000 and c.output_tokens > 0 for c in calls)
    # The evidence worker publishes the exact tokens to the object store.
    wait_for(
        lambda: all(
            i.integrity != Integrity.STAGED for i in Interaction.objects.filter(trial_id=trial.id).only("integrity")
        ),
        timeout=30,
        what="the interactions to be published",
        stack=stack,
    )

    # The stream-json transcript is an artifact, and it shows the tools Claude Code ran.
    transcript = Artifact.objects.get(trial=trial, name="agent/claude-code.jsonl")
    assert transcript.kind == "transcript"
    events = [json.loads(line) for line in object_read(obj=transcript.object).decode().splitlines() if line.strip()]
    tool_uses = [
        block
        for e in events
        if e.get("type") == "assistant"
        for block in e["message"]["content"]
        if block.get("type") == "tool_use"
    ]
    assert [b["name"] for b in tool_uses] == ["Bash", "Agent"]
    assert tool_uses[0]["input"] == script.BASH_INPUT
    results = [
        block
        for e in events
        if e.get("type") == "user" and isinstance(e["message"].get("content"), list)
        for block in e["message"]["content"]
        if block.get("type") == "tool_result"
    ]
    assert results and not any(r.get("is_error") for r in results), results
    assert any(script.SUBAGENT_REPORT in json.dumps(r) for r in results)
    final = events[-1]
    assert final["type"] == "result" and final["subtype"] == "success", final
    assert final["result"] == script.FINAL_TEXT

    # The credential was scoped to this attempt and revoked when it ended; no stored file
    # of the trial holds the secret.
    cred = ModelCredential.objects.get(trial_id=trial.id)
    assert (cred.run_id, cred.route, cred.org_id) == (run_id, ROUTE, alice.org.id)
    assert cred.revoked_at is not None and cred.revoked_at <= trial.finished_at
    secret_head = f"synm_{cred.prefix}_".encode()
    for artifact in Artifact.objects.filter(trial=trial).select_related("object"):
        assert secret_head not in object_read(obj=artifact.object), artifact.name

    print(
        f"\nclaude-code e2e: setup {ready - started:.1f}s, run {finished - ready:.1f}s, "
        f"agent {trial.timings.get('agent_execution', {}).get('seconds')}s, {len(calls)} model calls "
        f"({len(delegated)} delegated), prompt tokens {[c.prompt_tokens for c in calls]}"
    )

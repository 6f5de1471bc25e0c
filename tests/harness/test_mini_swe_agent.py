"""The real mini-swe-agent, headless, through the whole platform; only the model is scripted.

API -> run admission -> Celery control + trials workers -> a Harbor trial in the local
bubblewrap sandbox -> mini-swe-agent (the venv deploy/harnesses.sh built from the pinned lock,
bound read-only into the sandbox) -> litellm's OpenAI provider -> the model bridge inside the
sandbox -> the proxy process on its Unix socket (POST /v1/chat/completions: scoped credential,
Qwen3 rendering and parsing, capture) -> a ScriptedSampler emitting Qwen3 native tool-call
tokens (tests/harness/mini_script.py) -> the bash tool run by mini-swe-agent in the sandbox ->
the task's verifier -> reward, artifacts, evidence, revocation.

mini-swe-agent 2.4.6 with its default config acts through tool calls (one ``bash`` function
tool), not text actions; the script emits Qwen3's ``<tool_call>`` markup accordingly.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest

from apps.accounts.models import ModelCredential
from apps.datasets.services import dataset_import_dir
from apps.objects.services import object_read
from apps.profiles.services import profile_publish
from apps.proxy.adapters.registry import adapter_for
from apps.proxy.admin_selectors import interaction_payload
from apps.proxy.models import Delivery, Integrity, Interaction
from apps.proxy.routes import route_upsert
from apps.runs.models import Artifact, Run, Trial
from tests.harness import mini_script as script
from tests.harness.conftest import proxy_start
from tests.trials.conftest import wait_for

pytestmark = [pytest.mark.slow]

ROUTE = "harness-chat-scripted"


def _task(root: Path) -> Path:
    d = root / "tasks" / "mini-swe-agent-writes"
    (d / "environment").mkdir(parents=True)
    (d / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    (d / "task.toml").write_text(
        textwrap.dedent("""\
        version = "1.0"
        [agent]
        timeout_sec = 600.0
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


def test_mini_swe_agent_runs_a_task_through_the_proxy(stack, alice, tmp_path, proxy_socket, tokenizer_dir, settings):
    from apps.trials.harnesses import harness_tree_resolve
    from synth_launcher.engines import MINI_SWE_AGENT_TREE

    harness_tree_resolve(tree=MINI_SWE_AGENT_TREE)  # built by deploy/harnesses.sh; if not, this says how
    started = time.monotonic()
    route_upsert(
        name=ROUTE,
        family="qwen3",
        tokenizer="qwen3",
        context_window=131072,
        max_output=32000,
        sampler_backend="scripted",
        sampler_config={"choose": "tests.harness.mini_script:choose"},
        aliases=[],
    )
    dsv, _ = dataset_import_dir(org=alice.org, name="harness-msa", version="1", path=_task(tmp_path))
    recipe = {
        "model": {"route": ROUTE},
        "engine": {"name": "mini-swe-agent", "version": "2.4.6"},
        "args": ["-c", "mini.yaml", "-c", "agent.step_limit=10"],
        "limits": {"timeout_sec": 600},
    }
    version, _ = profile_publish(org=alice.org, name="mini-swe-agent", recipe=recipe, created_by=None)

    proxy_start(stack, socket_path=proxy_socket, tokenizer_dir=tokenizer_dir)
    stack.start_worker("w1", queues="control,trials,evidence", extra_env={"SYNTH_PROXY_SOCKET": str(proxy_socket)})
    ready = time.monotonic()
    resp = alice.client.post(
        "/api/runs",
        {
            "kind": "evaluate",
            "dataset": dsv.reference,
            "actor": {"profile": "mini-swe-agent", "version": version.version},
            "plan": {"attempts_per_task": 1},
        },
        format="json",
    )
    assert resp.status_code == 201, resp.content
    run_id = resp.json()["id"]
    run = wait_for(
        lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r, timeout=600, what=f"run {run_id}", stack=stack
    )
    finished = time.monotonic()
    trial = Trial.objects.get(run_id=run_id)
    assert run.status == "succeeded", (run.summary, stack.logs())
    assert trial.status == "succeeded", (trial.error_type, trial.error_message, stack.logs())
    assert trial.reward == 1.0, (trial.rewards, stack.logs())

    # Both model calls were Chat Completions calls, captured and attributed to the attempt by
    # the credential (run, trial) and by the correlation header the launcher sets.
    calls = list(Interaction.objects.filter(trial_id=trial.id).order_by("created_at"))
    assert [c.stop_reason for c in calls] == ["tool_use", "tool_use"], [(c.protocol, c.stop_reason) for c in calls]
    assert {c.protocol for c in calls} == {"chat"}
    assert {c.run_id for c in calls} == {run_id}
    assert {c.correlation_id for c in calls} == {trial.id}
    assert {c.route.name for c in calls} == {ROUTE}
    assert {c.model_requested for c in calls} == {ROUTE}  # litellm's "openai/" prefix is not sent
    assert {c.principal_kind for c in calls} == {"attempt"}
    assert all(c.delivery == Delivery.DELIVERED for c in calls), [(c.delivery, c.delivery_error) for c in calls]
    assert all(c.prompt_tokens > 500 and c.output_tokens > 0 for c in calls)
    wait_for(
        lambda: all(
            i.integrity != Integrity.STAGED for i in Interaction.objects.filter(trial_id=trial.id).only("integrity")
        ),
        timeout=30,
        what="the interactions to be published",
        stack=stack,
    )

    # Every captured call re-renders to its captured prompt ids, and the first call's sampled
    # tool call comes back in the second call's prompt exactly as it was sampled.
    payloads = [interaction_payload(interaction=c) for c in Interaction.objects.filter(trial_id=trial.id)]
    payloads.sort(key=lambda p: len(p["prompt_ids"]))
    settings.SYNTH_TOKENIZER_DIR = tokenizer_dir  # the proxy's process has it; this one renders too
    adapter = adapter_for("qwen3")
    for payload in payloads:
        rendered = list(adapter.render(request=json.loads(payload["request_json"])).token_ids)
        assert rendered == list(payload["prompt_ids"])
    first_out, second_prompt = list(payloads[0]["output_ids"]), list(payloads[1]["prompt_ids"])
    assert list(payloads[0]["prompt_ids"]) == second_prompt[: len(payloads[0]["prompt_ids"])]
    after = second_prompt[len(payloads[0]["prompt_ids"]) :]
    assert after[: len(first_out)] == first_out, "the sampled tool call did not round-trip"

    # mini-swe-agent's trajectory is the transcript artifact, and it shows the bash actions.
    transcript = Artifact.objects.get(trial=trial, name="agent/mini-swe-agent.traj.json")
    assert transcript.kind == "transcript"
    trajectory = json.loads(object_read(obj=transcript.object))
    assert trajectory["info"]["exit_status"] == "Submitted", trajectory["info"]
    actions = [a["command"] for m in trajectory["messages"] for a in m.get("extra", {}).get("actions", [])]
    assert actions == [script.WRITE_COMMAND, script.SUBMIT_COMMAND]
    tools = [m for m in trajectory["messages"] if m["role"] == "tool"]
    assert '"returncode": 0' in tools[0]["content"]

    # The credential was scoped to this attempt and revoked when it ended; no stored file
    # of the trial holds the secret.
    cred = ModelCredential.objects.get(trial_id=trial.id)
    assert (cred.run_id, cred.route, cred.org_id) == (run_id, ROUTE, alice.org.id)
    assert cred.revoked_at is not None and cred.revoked_at <= trial.finished_at
    secret_head = f"synm_{cred.prefix}_".encode()
    for artifact in Artifact.objects.filter(trial=trial).select_related("object"):
        assert secret_head not in object_read(obj=artifact.object), artifact.name

    print(
        f"\nmini-swe-agent e2e: setup {ready - started:.1f}s, run {finished - ready:.1f}s, "
        f"agent {trial.timings.get('agent_execution', {}).get('seconds')}s, {len(calls)} model calls, "
        f"prompt tokens {[c.prompt_tokens for c in calls]}"
    )

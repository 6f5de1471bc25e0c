"""A train run on Codex attempts: the real Codex CLI in the sandbox, its Responses calls served
by the tiny local Qwen3 model and captured by the proxy, graded rewards, and an update step
of the local backend that trains on exactly those tokens."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from django.conf import settings

from apps.datasets.services import dataset_import_dir
from apps.proxy.models import Interaction
from apps.proxy.routes import DEFAULT_ROUTE, route_upsert
from apps.runs.models import Run
from apps.training.models import Checkpoint, LearningUpdate, UpdateStatus
from tests.harness.conftest import harness_checked, proxy_start
from tests.trials.conftest import wait_for
from tests.trials.test_end_to_end import publish, submit

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROUTE = "qwen3-tiny-codex"
CODEX_RECIPE = {
    "model": {"route": ROUTE},
    "engine": {"name": "codex", "version": "0.171.0"},
    "args": ["--ephemeral"],
    "limits": {"timeout_sec": 300},
}
# The verifier grades Codex's final message from its JSONL transcript: the share of ASCII
# letters and spaces, a dense reward that differs between a group's attempts.
GRADE = textwrap.dedent("""\
    #!/bin/bash
    mkdir -p /logs/verifier
    python3 - <<'PY' > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
    import json
    text = ""
    with open("/logs/agent/codex.jsonl", encoding="utf-8") as fh:
        for line in fh:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            item = event.get("item") or {}
            if event.get("type") == "item.completed" and item.get("type") == "agent_message":
                text = item.get("text") or text
    good = sum(1 for c in text if c == " " or ("a" <= c.lower() <= "z"))
    print(round(good / len(text), 6) if text else 0)
    PY
    """)


def _tasks(root: Path) -> Path:
    for name, instruction in [("codex-plain-reply", "Reply with one short sentence of plain English.")]:
        d = root / "tasks" / name
        (d / "environment").mkdir(parents=True)
        (d / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
        (d / "task.toml").write_text(
            textwrap.dedent("""\
            version = "1.0"
            [agent]
            timeout_sec = 300.0
            [verifier]
            timeout_sec = 60.0
            [environment]
            memory_mb = 1024
            storage_mb = 256
            workdir = "/app"
            """)
        )
        (d / "instruction.md").write_text(instruction + "\n")
        (d / "tests").mkdir()
        (d / "tests" / "test.sh").write_text(GRADE)
    return root / "tasks"


def test_a_train_run_on_codex_attempts_takes_an_update_step(stack, alice, tmp_path, proxy_socket, tokenizer_dir):
    assert Path(settings.SYNTH_CODEX_SANDBOX_BIN).is_file(), "run `npm ci` in the repository root"
    # The embedded tiny model, with short answers: each Codex turn is one model call.
    route_upsert(**{**DEFAULT_ROUTE, "name": ROUTE, "max_output": 24, "aliases": []})
    dataset, _ = dataset_import_dir(org=alice.org, name="codex-toys", version="v1", path=_tasks(tmp_path))
    stack.env.update({"SYNTH_PROXY_SOCKET": str(proxy_socket)})
    proxy_start(stack, socket_path=proxy_socket, tokenizer_dir=tokenizer_dir)
    stack.start_worker("control", queues="control,evidence", concurrency=2, beat=True)
    stack.start_worker("trials", queues="trials", concurrency=2)
    stack.start_worker("training", queues="training", concurrency=1)

    plan = {
        "backend": "local",
        "batch_size": 1,
        "group_size": 2,
        "steps": 1,
        "learning_rate": 0.02,
        "lora_rank": 4,
        "save_every": 1,
        "max_concurrency": 2,
    }
    # A train run needs the installed Codex build to have passed the harness check: run it.
    check = harness_checked(engine="codex", tmp=tmp_path / "harness-check", tokenizer_dir=tokenizer_dir)
    assert check.passed, check.report["failures"]
    run_id = submit(
        alice, kind="train", dataset=dataset.reference, actor=publish(alice, "codex", CODEX_RECIPE), plan=plan
    )
    run = wait_for(
        lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r, timeout=600, what="the train run", stack=stack
    )
    assert run.status == "succeeded", (run.error, run.summary, stack.logs())
    trials = list(run.trials.all())
    assert len(trials) == 2 and all(t.status == "succeeded" for t in trials), [
        (t.error_type, t.error_message) for t in trials
    ]
    calls = Interaction.objects.filter(run_id=run_id)
    assert calls.exists() and {c.protocol for c in calls} == {"responses"}
    assert all(c.prompt_tokens > 1000 for c in calls)  # Codex's own instructions and tools

    (update,) = LearningUpdate.objects.filter(run=run)
    why = json.dumps(
        {
            "groups": update.groups,
            "calls": [(c.trial_id, c.delivery, c.eligibility, c.eligibility_reason, c.stop_reason) for c in calls],
        },
        default=str,
    )
    assert update.status == UpdateStatus.APPLIED, why
    assert update.datums > 0 and update.sampled_tokens > 0
    assert update.metrics["attempts_qualified"] == 2, update.metrics
    # The trainer's logprobs of the captured tokens match the sampler's: the Responses path
    # captured exactly what the model produced.
    assert abs(update.metrics["kl_sample_train"]) < 1e-3, update.metrics
    assert Checkpoint.objects.filter(run=run, step=1).exists()

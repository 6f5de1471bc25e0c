"""A judge that calls a model, through the proxy process: its calls are captured as the
judge's (its own credential, role "judge", ineligible for learning), never as the attempt's."""

from __future__ import annotations

import json
import re

import pytest

from apps.accounts.models import ModelCredential
from apps.datasets.services import dataset_import_dir
from apps.proxy.models import Eligibility, Interaction
from apps.proxy.routes import DEFAULT_ROUTE, route_upsert
from apps.runs.models import Artifact, Trial
from tests.harness.conftest import proxy_start
from tests.trials.conftest import EXAMPLES
from tests.trials.test_end_to_end import finished, publish
from tests.trials.test_judges import submit_judged

pytestmark = [pytest.mark.slow]


def test_a_model_judges_calls_are_its_own_and_never_the_attempts(stack, alice, proxy_socket, tokenizer_dir, settings):
    settings.SYNTH_PROXY_SOCKET = proxy_socket
    route_upsert(**DEFAULT_ROUTE)
    stack.env["SYNTH_PROXY_SOCKET"] = str(proxy_socket)
    proxy_start(stack, socket_path=proxy_socket, tokenizer_dir=tokenizer_dir)
    stack.start_worker("w1", beat=True, queues="control,trials,evidence")
    dsv, _ = dataset_import_dir(org=alice.org, name="toys", version="1", path=EXAMPLES / "train-tasks")
    mini = json.loads((EXAMPLES / "train-agent.json").read_text())
    run_id = submit_judged(
        alice,
        dataset=dsv.reference,
        actor=publish(alice, "mini", mini),
        judge=publish(alice, "mini-judge", mini),  # the tiny model never writes a verdict
        plan={"attempts_per_task": 1, "task_names": ["*plain-reply"]},
    )
    assert alice.client.get(f"/api/runs/{run_id}").json()["judge_model"] == {"route": "qwen3-8b"}
    run = finished(run_id, stack, timeout=240)
    (trial,) = Trial.objects.filter(run=run)
    assert trial.status == "failed" and trial.error_type == "VerifierError", (
        trial.error_message,
        stack.logs(),
    )
    assert re.search(r"the judge \(synth-mini, exit code \d\) wrote no verdict", trial.error_message)
    calls = {i.role: i for i in Interaction.objects.filter(trial_id=trial.id)}
    assert set(calls) == {"actor", "judge"}
    assert calls["actor"].eligibility == Eligibility.ELIGIBLE
    assert calls["judge"].eligibility == Eligibility.INELIGIBLE
    assert "judge" in calls["judge"].eligibility_reason
    creds = {c.role: c for c in ModelCredential.objects.filter(trial_id=trial.id)}
    assert set(creds) == {"actor", "judge"} and all(c.revoked_at is not None for c in creds.values())
    names = set(Artifact.objects.filter(trial=trial).values_list("name", flat=True))
    assert {"agent/synth-mini.jsonl", "verifier/judge/synth-mini.jsonl"} <= names

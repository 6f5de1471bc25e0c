"""Judges through real Celery workers, Harbor trials and the local sandbox: the judge's
verdict replaces the task's tests and its files stay apart from the actor's. (A judge that
calls a model: tests/harness/test_judges.py.)"""

from __future__ import annotations

import json

import pytest

from apps.datasets.services import dataset_import_dir
from apps.runs.models import Artifact, Trial
from tests.execution.conftest import EXAMPLES
from tests.execution.test_end_to_end import finished, publish

pytestmark = [pytest.mark.slow]

ORACLE = json.loads((EXAMPLES / "oracle-agent.json").read_text())
NOOP = json.loads((EXAMPLES / "noop-agent.json").read_text())
# A judge that needs no model: it grades by looking at the work (the oracle of
# implement-roman writes roman.py; the no-op agent leaves the stub).
INSPECTOR = {
    "engine": {"name": "command", "version": "1"},
    "command": [
        "bash",
        "-c",
        "grep -q 'def to_roman' ${task.workdir}/roman.py && ! grep -q NotImplementedError ${task.workdir}/roman.py"
        " && echo 0.75 > /logs/verifier/reward.txt || echo 0.25 > /logs/verifier/reward.txt; echo judged",
    ],
    "instruction": {"via": "stdin"},
    "limits": {"timeout_sec": 60},
}


def submit_judged(alice, *, dataset, actor, judge, plan=None):
    body = {"kind": "evaluate", "dataset": dataset, "actor": actor, "judge": judge, "plan": plan or {}}
    resp = alice.client.post("/api/runs", body, format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()["id"]


def test_a_judge_replaces_the_tests_and_keeps_its_files_apart(stack, alice):
    dsv, _ = dataset_import_dir(org=alice.org, name="examples", version="1", path=EXAMPLES / "tasks")
    stack.start_worker("w1", beat=True)
    judge = publish(alice, "inspector", INSPECTOR)
    plan = {"attempts_per_task": 1, "task_names": ["*implement-roman"]}
    good = submit_judged(alice, dataset=dsv.reference, actor=publish(alice, "oracle", ORACLE), judge=judge, plan=plan)
    bad = submit_judged(alice, dataset=dsv.reference, actor=publish(alice, "noop", NOOP), judge=judge, plan=plan)
    for run_id, reward in ((good, 0.75), (bad, 0.25)):
        run = finished(run_id, stack)
        assert run.status == "succeeded", (run.summary, stack.logs())
        (trial,) = Trial.objects.filter(run=run)
        # The judge's number, not the task's tests (which give 1.0 and 0.0).
        assert trial.rewards == {"reward": reward}, (trial.error_message, stack.logs())
        names = set(Artifact.objects.filter(trial=trial).values_list("name", flat=True))
        assert {"verifier/judge/launch-plan.json", "verifier/judge/command.txt", "verifier/reward.txt"} <= names
        assert "verifier/test-stdout.txt" not in names  # the tests did not run
    detail = alice.client.get(f"/api/runs/{good}").json()
    assert detail["judge"]["profile"] == "inspector"

"""Judges through real Celery workers, Harbor trials and the local sandbox: the judge's
verdict replaces the task's tests and its files stay apart from the actor's. (A judge that
calls a model: tests/harness/test_judges.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.datasets.services import dataset_import_dir
from apps.runs.models import Artifact, Trial
from tests.trials.conftest import EXAMPLES
from tests.trials.test_end_to_end import finished, publish

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


def test_a_finished_evaluation_is_regraded_by_a_judge_on_its_retained_work(stack, alice):
    dsv, _ = dataset_import_dir(org=alice.org, name="examples", version="1", path=EXAMPLES / "tasks")
    stack.start_worker("w1", beat=True)
    plan = {"attempts_per_task": 2, "task_names": ["*implement-roman", "*word-frequencies"]}
    resp = alice.client.post(
        "/api/runs",
        {"kind": "evaluate", "dataset": dsv.reference, "actor": publish(alice, "oracle", ORACLE), "plan": plan},
        format="json",
    )
    source = finished(resp.json()["id"], stack)
    assert source.status == "succeeded" and source.summary["mean_reward"] == 1.0
    judge = publish(alice, "inspector", INSPECTOR)

    regrade = alice.client.post(
        f"/api/runs/{source.id}/regrade", {"judge": judge}, format="json", HTTP_IDEMPOTENCY_KEY="rg-1"
    )
    assert regrade.status_code == 201, regrade.content
    again = alice.client.post(
        f"/api/runs/{source.id}/regrade", {"judge": judge}, format="json", HTTP_IDEMPOTENCY_KEY="rg-1"
    )
    assert again.status_code == 200 and again.json()["id"] == regrade.json()["id"]
    run = finished(regrade.json()["id"], stack)
    assert run.status == "succeeded" and run.kind == "regrade", (run.summary, stack.logs())
    trials = {t.source_id: t for t in Trial.objects.filter(run=run).select_related("task_version")}
    assert set(trials) == set(Trial.objects.filter(run=source).values_list("id", flat=True))  # every attempt
    for trial in trials.values():
        # The inspector gives 0.75 to a finished roman.py (the oracle's) and 0.25 elsewhere:
        # the work re-assessed is the source attempt's, restored, not a fresh checkout.
        expected = 0.75 if trial.task_version.name.endswith("implement-roman") else 0.25
        assert trial.rewards == {"reward": expected}, (trial.error_message, stack.logs())
    assert run.summary["mean_reward"] == 0.5
    assert run.spec.actor_version_id == source.spec.actor_version_id and run.spec.plan["source_run"] == source.id


def test_regrade_refuses_what_it_cannot_do(stack, alice, bob):
    from apps.runs.models import Run

    dsv, _ = dataset_import_dir(org=alice.org, name="examples", version="1", path=EXAMPLES / "tasks")
    judge = publish(alice, "inspector", INSPECTOR)
    actor = publish(alice, "oracle", ORACLE)
    unfinished = alice.client.post(
        "/api/runs", {"kind": "evaluate", "dataset": dsv.reference, "actor": actor}, format="json"
    ).json()["id"]
    cases = [
        (alice, unfinished, {"judge": judge}, 409, "plan.source_run"),  # not ended yet
        (alice, unfinished, {}, 400, "judge"),
        (alice, unfinished, {"judge": judge, "extra": 1}, 400, "extra"),
        (bob, unfinished, {"judge": judge}, 404, None),  # another organization's run
        (alice, "run_nope", {"judge": judge}, 404, None),
    ]
    for member, run_id, body, status, field in cases:
        resp = member.client.post(f"/api/runs/{run_id}/regrade", body, format="json")
        assert resp.status_code == status, (body, resp.content)
        assert resp.json()["error"]["field"] == field
    Run.objects.filter(pk=unfinished).update(status="succeeded")  # ended, but kept no workdir
    resp = alice.client.post(f"/api/runs/{unfinished}/regrade", {"judge": judge}, format="json")
    assert resp.status_code == 409 and "retained no outputs" in resp.json()["error"]["message"]
    assert Run.objects.filter(org=alice.org).count() == 1  # nothing was created by a refusal


def test_a_retained_workdir_is_restored_in_batches_bounded_by_files_and_bytes():
    from types import SimpleNamespace

    from apps.trials.launch import RESTORE_BATCH, RESTORE_BATCH_BYTES, _restore_batches

    small = [(Path(f"f{i}"), SimpleNamespace(size=10)) for i in range(RESTORE_BATCH + 3)]
    assert [len(b) for b in _restore_batches(small)] == [RESTORE_BATCH, 3]
    half = RESTORE_BATCH_BYTES // 2 + 1
    big = [
        (Path(f"b{i}"), SimpleNamespace(size=size)) for i, size in enumerate([half, half, 5, RESTORE_BATCH_BYTES * 2])
    ]
    # Two halves do not fit one batch; a file bigger than the bound goes alone; order kept.
    assert [[p.name for p, _ in b] for b in _restore_batches(big)] == [["b0"], ["b1", "b2"], ["b3"]]
    assert _restore_batches([]) == []

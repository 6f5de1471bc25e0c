"""What a trial's launch plan tells the harness about its task."""

from __future__ import annotations

import pytest

from apps.runs.dispatch import run_dispatch
from apps.runs.models import Trial
from apps.runs.services import run_schedule
from apps.trials.launch import trial_launch_plan

pytestmark = pytest.mark.django_db

# An agent that is handed the instruction as its last argument.
RECIPE = {
    "engine": {"name": "command", "version": "1"},
    "command": ["sh", "-c", "true", "sh"],
    "limits": {"timeout_sec": 60},
}


def test_the_launch_plan_carries_the_instruction_stored_at_import(alice, inputs, tmp_path):
    # Import stores the instruction parsed from the verified package the worker unpacks, so
    # the launch reads it from the task version instead of parsing the package again (a
    # Harbor Task per launch plan walked and checked the task's files each time). A folder
    # saying something else shows which one the plan carries.
    run_id = alice.client.post("/api/runs", inputs["body"], format="json").json()["id"]
    run_schedule(run_id=run_id)
    run_dispatch(run_id=run_id)
    trial = Trial.objects.select_related("task_version", "run").filter(run_id=run_id).first()
    assert trial is not None and trial.task_version.instruction == "do it"
    (tmp_path / "task.toml").write_text("[agent]\ntimeout_sec = 30\n")
    (tmp_path / "instruction.md").write_text("what the folder says\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test.sh").write_text("exit 0\n")
    (tmp_path / "environment").mkdir()
    (tmp_path / "environment" / "Dockerfile").write_text("FROM debian\nWORKDIR /app\n")

    plan = trial_launch_plan(trial=trial, task_dir=tmp_path, recipe=RECIPE)
    assert plan.instruction == "do it"

    judged = trial_launch_plan(trial=trial, task_dir=tmp_path, recipe=RECIPE, instruction="assess the work")
    assert judged.instruction == "assess the work"

"""Evaluation runs credit only what verification established: a cheating agent scores 0, a
verifier that cannot work here is a verifier error counted apart, a fresh verifier runs in a
sandbox of its own (real Celery workers, Harbor trials, the local sandbox)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from apps.datasets.services import dataset_import_dir
from apps.runs.models import Trial
from tests.cheats import TECHNIQUES, cheating_recipe
from tests.trials.conftest import EXAMPLES, ROOT
from tests.trials.test_end_to_end import ORACLE, finished, publish, submit

pytestmark = [pytest.mark.slow]


def test_a_cheating_agent_scores_zero_in_an_evaluation_run(stack, alice):
    dsv, _ = dataset_import_dir(org=alice.org, name="examples", version="1", path=EXAMPLES / "tasks")
    stack.start_worker("w1", beat=True)
    run_id = submit(
        alice,
        dataset=dsv.reference,
        actor=publish(alice, "cheater", cheating_recipe(*TECHNIQUES)),
        plan={"attempts_per_task": 2, "max_concurrency": 4, "task_names": ["*implement-roman", "*fix-failing-test"]},
    )
    run = finished(run_id, stack)
    trials = list(Trial.objects.filter(run_id=run_id))
    assert len(trials) == 4 and all(t.status == "succeeded" for t in trials), [
        (t.error_type, t.error_message) for t in trials
    ]
    assert {t.reward for t in trials} == {0.0}, [t.rewards for t in trials]
    assert run.summary["mean_reward"] == 0.0 and run.summary["pass_at_k"]["1"] == 0.0


def test_verifier_errors_are_counted_apart_and_fresh_verification_runs(stack, alice, tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    shutil.copytree(EXAMPLES / "tasks" / "implement-roman", tasks / "implement-roman")
    subprocess.run(
        [
            str(ROOT / ".venv/bin/harbor"),
            "task",
            "init",
            "synth/needs-net",
            "-p",
            str(tasks),
            "--verifier-mode",
            "shared",
        ],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(tasks / "needs-net" / "tests" / "__pycache__", ignore_errors=True)
    (tasks / "needs-net" / "instruction.md").write_text("Write hello to /app/hello.txt\n")
    (tasks / "needs-net" / "solution" / "solve.sh").write_text("#!/bin/bash\necho hello > /app/hello.txt\n")
    dsv, _ = dataset_import_dir(org=alice.org, name="mixed", version="1", path=tasks)
    stack.start_worker("w1", beat=True)
    oracle = publish(alice, "oracle", ORACLE)
    run_id = submit(alice, dataset=dsv.reference, actor=oracle, plan={"attempts_per_task": 2})
    fresh_id = submit(
        alice, dataset=dsv.reference, actor=oracle, plan={"task_names": ["*implement-roman"], "verifier": "fresh"}
    )
    run = finished(run_id, stack)
    net = [t for t in Trial.objects.filter(run_id=run_id) if t.task_version.name.endswith("needs-net")]
    assert {(t.status, t.error_type, t.reward) for t in net} == {("failed", "VerifierError", None)}
    assert "astral.sh" in net[0].error_message and "last lines of the verifier's output" in net[0].error_message
    summary = run.summary
    assert summary["verifier_errors"] == 2 and summary["assessed"] == 2
    assert summary["mean_reward"] == 1.0, summary  # the oracle's real score, not diluted by the errors
    per_task = {name.rsplit("/", 1)[-1]: g for name, g in summary["per_task"].items()}
    assert per_task["needs-net"]["mean_reward"] is None and per_task["needs-net"]["verifier_errors"] == 2
    fresh = finished(fresh_id, stack)
    assert fresh.status == "succeeded" and fresh.summary["mean_reward"] == 1.0, (fresh.summary, stack.logs())


def test_file_names_that_are_not_utf8_survive_as_artifacts(stack, alice):
    dsv, _ = dataset_import_dir(org=alice.org, name="examples", version="1", path=EXAMPLES / "tasks")
    stack.start_worker("w1", beat=True)
    recipe = {
        "engine": {"name": "command", "version": "1"},
        "limits": {"timeout_sec": 60},
        "command": ["bash", "-c", "echo a > /app/$'\\xff\\xfe'name.txt; mkdir /app/$'\\xc3'; echo b > /app/$'\\xc3'/f"],
    }
    run_id = submit(
        alice,
        dataset=dsv.reference,
        actor=publish(alice, "odd-names", recipe),
        plan={"task_names": ["*implement-roman"]},
    )
    run = finished(run_id, stack)
    (trial,) = Trial.objects.filter(run_id=run_id)
    assert trial.status == "succeeded" and trial.reward == 0.0, (trial.error_type, trial.error_message, stack.logs())
    names = set(trial.artifacts.filter(kind="work").values_list("name", flat=True))
    assert {"artifacts/workdir/%FF%FEname.txt", "artifacts/workdir/%C3/f"} <= names, names
    assert run.status == "succeeded"

"""Runs through real Celery workers, Harbor trials and the local sandbox."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from apps.datasets.services import dataset_import_dir
from apps.profiles.services import profile_publish
from apps.runs.models import Artifact, Run, RunEvent, Trial
from tests.factories import make_dataset_of, make_task_version_unchecked
from tests.trials.conftest import EXAMPLES, LOSE_LEASES_FAST, wait_for

pytestmark = [pytest.mark.slow]

ORACLE = json.loads((EXAMPLES / "oracle-agent.json").read_text())
NOOP = json.loads((EXAMPLES / "noop-agent.json").read_text())


def publish(alice, name, recipe):
    version, _ = profile_publish(org=alice.org, name=name, recipe=recipe, created_by=None)
    return {"profile": name, "version": version.version}


def submit(alice, *, dataset, actor, kind="evaluate", plan=None):
    resp = alice.client.post(
        "/api/runs", {"kind": kind, "dataset": dataset, "actor": actor, "plan": plan or {}}, format="json"
    )
    assert resp.status_code == 201, resp.content
    return resp.json()["id"]


def finished(run_id, stack, timeout=180):
    return wait_for(
        lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r, timeout=timeout, what=f"run {run_id}", stack=stack
    )


def test_oracle_scores_one_and_noop_zero_on_every_example_task(stack, alice):
    dsv, _ = dataset_import_dir(org=alice.org, name="examples", version="1", path=EXAMPLES / "tasks")
    stack.start_worker("w1", beat=True)
    oracle = submit(
        alice,
        dataset=dsv.reference,
        actor=publish(alice, "oracle", ORACLE),
        plan={"attempts_per_task": 1, "max_concurrency": 3},
    )
    noop = submit(
        alice,
        dataset=dsv.reference,
        actor=publish(alice, "noop", NOOP),
        plan={"attempts_per_task": 1, "max_concurrency": 3},
    )
    run = finished(oracle, stack)
    assert run.status == "succeeded", (run.summary, stack.logs())
    per_task = run.summary["per_task"]
    assert len(per_task) == dsv.task_count >= 6
    assert {name: g["mean_reward"] for name, g in per_task.items()} == {name: 1.0 for name in per_task}, [
        (t.task_version.name, t.error_type, t.error_message[:300]) for t in Trial.objects.filter(run_id=oracle)
    ]
    assert run.summary["pass_at_k"]["1"] == 1.0
    run = finished(noop, stack)
    assert run.status == "succeeded"
    assert {g["mean_reward"] for g in run.summary["per_task"].values()} == {0.0}
    # Multi-key rewards are kept whole.
    graded = Trial.objects.get(run_id=oracle, task_version__name__endswith="slugify-graded")
    assert set(graded.rewards) >= {"reward", "style"}
    # Events tell the story in order.
    types = list(RunEvent.objects.filter(run_id=oracle).order_by("seq").values_list("type", flat=True))
    assert types[:3] == ["run.created", "run.queued", "run.started"]
    assert types[-1] == "run.succeeded"
    assert types.count("trial.finished") == dsv.task_count


def test_execute_run_returns_artifacts_without_rewards(stack, alice):
    dsv, _ = dataset_import_dir(org=alice.org, name="examples", version="1", path=EXAMPLES / "tasks")
    stack.start_worker("w1")
    run_id = submit(
        alice,
        kind="execute",
        dataset=dsv.reference,
        actor=publish(alice, "oracle", ORACLE),
        plan={"task_names": ["*word-frequencies"]},
    )
    run = finished(run_id, stack)
    assert run.status == "succeeded"
    trial = Trial.objects.get(run_id=run_id)
    assert trial.rewards is None and trial.status == "succeeded"
    names = set(Artifact.objects.filter(trial=trial).values_list("name", flat=True))
    assert "launch-plan.json" in names
    assert any(n.startswith("agent/") for n in names), names
    assert not any(n.startswith("verifier/reward") for n in names)  # the verifier did not run
    # The work itself comes back: the agent's /app/out.json is an artifact of kind "work".
    work = Artifact.objects.get(trial=trial, name__endswith="workdir/out.json")
    assert work.kind == "work" and work.size > 0
    listed = alice.client.get(f"/api/runs/{run_id}/artifacts").json()["results"]
    assert {a["name"] for a in listed} == names
    some = listed[0]
    assert some["digest"] == f"sha256:{Artifact.objects.get(pk=some['id']).sha256}"
    assert "mean_reward" not in run.summary


def _task(
    root: Path,
    name: str,
    *,
    toml: str | None = None,
    test: str | None = "echo 1 > /logs/verifier/reward.txt",
    solve: str = "true",
) -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    (d / "task.toml").write_text(
        toml
        if toml is not None
        else textwrap.dedent("""\
        [agent]
        timeout_sec = 30.0
        [verifier]
        timeout_sec = 30.0
        [environment]
        memory_mb = 512
        storage_mb = 256
        workdir = "/app"
        """)
    )
    (d / "instruction.md").write_text("Do the thing.\n")
    if test is not None:
        (d / "tests").mkdir()
        (d / "tests" / "test.sh").write_text(f"#!/bin/bash\n{test}\n")
    (d / "solution").mkdir()
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{solve}\n")
    return d


def test_bad_tasks_end_in_clear_errors_while_the_rest_finishes(stack, alice, tmp_path):
    bad = [
        ("no-test-sh", _task(tmp_path, "no-test-sh", test=None)),
        ("bad-toml", _task(tmp_path, "bad-toml", toml="[agent\ntimeout_sec = = 1\n")),
        ("no-reward", _task(tmp_path, "no-reward", test="echo tests ran")),
        (
            "timeout",
            _task(
                tmp_path,
                "timeout",
                solve="sleep 600",
                toml="[agent]\ntimeout_sec = 2.0\n[environment]\nmemory_mb = 512\nstorage_mb = 256\n",
            ),
        ),
    ]
    good = _task(tmp_path, "good")
    tvs = [make_task_version_unchecked(org=alice.org, path=p, name=n) for n, p in bad]
    tvs.append(make_task_version_unchecked(org=alice.org, path=good, name="good"))
    dsv = make_dataset_of(org=alice.org, name="bad", version="1", task_versions=tvs)
    stack.start_worker("w1")
    run_id = submit(alice, dataset=dsv.reference, actor=publish(alice, "oracle", ORACLE))
    run = finished(run_id, stack)
    assert run.status == "succeeded", stack.logs()
    trials = {t.task_version.name: t for t in Trial.objects.filter(run_id=run_id).select_related("task_version")}
    assert trials["good"].status == "succeeded" and trials["good"].reward == 1.0
    for name in ("no-test-sh", "bad-toml", "no-reward", "timeout"):
        t = trials[name]
        assert t.status == "failed", (name, t.status, t.error_type)
        assert t.error_type and t.error_message, name
    no_reward = trials["no-reward"]
    assert no_reward.error_type == "VerifierError" and no_reward.error_message.startswith("RewardFileNotFoundError")
    assert trials["timeout"].error_type == "AgentTimeoutError"
    assert run.summary["errors"]["AgentTimeoutError"] == 1


def _sandbox_processes() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"synth-e2e-sleeper" in cmdline:
                pids.append(int(entry.name))
    return pids


def test_cancel_stops_running_trials_and_leaves_nothing_behind(stack, alice, tmp_path):
    slow = _task(
        tmp_path,
        "slow",
        solve="exec -a synth-e2e-sleeper sleep 300",
        toml="[agent]\ntimeout_sec = 600.0\n[environment]\nmemory_mb = 256\nstorage_mb = 64\n",
    )
    tv = make_task_version_unchecked(org=alice.org, path=slow, name="slow")
    dsv = make_dataset_of(org=alice.org, name="slow", version="1", task_versions=[tv])
    stack.start_worker("w1")
    run_id = submit(
        alice,
        dataset=dsv.reference,
        actor=publish(alice, "oracle", ORACLE),
        plan={"attempts_per_task": 3, "resources": {"cpus": 0.5}},
    )  # three fit on two cores
    try:
        wait_for(lambda: len(_sandbox_processes()) == 3, timeout=60, what="three running sleepers")
    except AssertionError:
        rows = list(
            Trial.objects.filter(run_id=run_id).values("status", "need", "error_type", "error_message", "timings")
        )
        raise AssertionError(
            f"{rows} {_sandbox_processes()} {RunEvent.objects.filter(run_id=run_id).values_list('type', 'data')}"
        ) from None
    assert alice.client.post(f"/api/runs/{run_id}/cancel").json()["status"] == "cancelling"
    run = finished(run_id, stack, timeout=30)
    assert run.status == "cancelled"
    assert set(Trial.objects.filter(run_id=run_id).values_list("status", flat=True)) == {"cancelled"}
    wait_for(lambda: not _sandbox_processes(), timeout=10, what="sleepers to be gone")
    work = Path(stack.env["SYNTH_WORK_DIR"])
    # Each trial's work dir goes once its worker has recorded the cancel.
    wait_for(lambda: not work.exists() or not any(work.iterdir()), timeout=30, what="work dirs to be removed")


def test_a_killed_worker_loses_its_lease_and_the_trial_runs_once_more(stack, alice, tmp_path):
    slow = _task(
        tmp_path,
        "slowish",
        solve="sleep 8; echo done > /app/done",
        test="[ -f /app/done ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt",
        toml="[agent]\ntimeout_sec = 120.0\n[environment]\nmemory_mb = 256\nstorage_mb = 64\n",
    )
    tv = make_task_version_unchecked(org=alice.org, path=slow, name="slowish")
    dsv = make_dataset_of(org=alice.org, name="slowish", version="1", task_versions=[tv])
    first = stack.start_worker("first", extra_env=LOSE_LEASES_FAST)
    run_id = submit(
        alice,
        dataset=dsv.reference,
        actor=publish(alice, "oracle", ORACLE),
        plan={"on_lost": "retry", "max_retries": 2},
    )
    wait_for(
        lambda: Trial.objects.filter(run_id=run_id, status="running").exists(),
        timeout=60,
        what="the trial to start",
        stack=stack,
    )
    stack.kill(first)  # the whole worker, children included, mid-trial
    stack.start_worker("second", beat=True)  # its sweeper expires the short lease of the first
    run = finished(run_id, stack, timeout=120)
    assert run.status == "succeeded", stack.logs()
    trial = Trial.objects.get(run_id=run_id)
    assert trial.status == "succeeded" and trial.reward == 1.0
    assert trial.tries == 2
    types = list(RunEvent.objects.filter(run_id=run_id).values_list("type", flat=True))
    assert types.count("trial.finished") == 1  # counted once
    assert "trial.requeued" in types

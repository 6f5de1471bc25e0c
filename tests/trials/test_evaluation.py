from __future__ import annotations

from types import SimpleNamespace

import pytest

from apps.runs.evaluation import group_summarize, pass_at_k, run_summarize


def test_pass_at_k_matches_the_closed_form():
    assert pass_at_k(n=4, c=0, k=1) == 0.0
    assert pass_at_k(n=4, c=4, k=1) == 1.0
    assert pass_at_k(n=4, c=1, k=1) == pytest.approx(0.25)
    assert pass_at_k(n=4, c=1, k=2) == pytest.approx(0.5)
    assert pass_at_k(n=4, c=2, k=4) == 1.0
    assert pass_at_k(n=5, c=2, k=2) == pytest.approx(1 - 3 / 10)


def t(group, reward, error="", status="succeeded", name="task"):
    return SimpleNamespace(
        group_id=group, reward=reward, error_type=error, status=status, task_version=SimpleNamespace(name=name)
    )


def test_group_and_run_summaries():
    trials = [
        t("g1", 1.0, name="a"),
        t("g1", 0.0, name="a"),
        t("g2", None, "AgentTimeoutError", "failed", "b"),
        t("g2", 1.0, name="b"),
    ]
    g = group_summarize(trials=trials[:2])
    assert g["mean_reward"] == 0.5 and g["passed"] == 1 and g["pass_at_k"]["2"] == 1.0
    s = run_summarize(trials=trials, scored=True)
    assert s["mean_reward"] == pytest.approx(0.5)
    assert s["errors"] == {"AgentTimeoutError": 1}
    assert s["per_task"]["b"]["mean_reward"] == 0.5
    assert s["pass_at_k"]["1"] == pytest.approx(0.5)
    assert "mean_reward" not in run_summarize(trials=trials, scored=False)


def test_errors_that_are_not_the_agents_weigh_in_no_mean():
    trials = [
        t("g1", 1.0),
        t("g1", None, "AgentTimeoutError", "failed"),  # the agent's failure: a 0
        t("g1", None, "VerifierError", "failed"),  # the verifier could not assess it
        t("g1", None, "WorkerLost", "lost"),
        t("g1", None, "Cancelled", "cancelled"),
    ]
    g = group_summarize(trials=trials)
    assert g["attempts"] == 5 and g["assessed"] == 2 and g["unassessed"] == 3
    assert g["mean_reward"] == 0.5 and g["pass_at_k"]["1"] == 0.5 and "4" not in g["pass_at_k"]
    assert g["verifier_errors"] == 1 and g["errors"]["VerifierError"] == 1
    s = run_summarize(trials=trials, scored=True)
    assert s["mean_reward"] == 0.5 and s["assessed"] == 2 and s["verifier_errors"] == 1
    nothing = group_summarize(trials=[t("g", None, "VerifierError", "failed")])
    assert nothing["mean_reward"] is None and nothing["pass_at_k"] == {}


def test_a_task_sampled_at_every_step_counts_once_and_pools_its_groups():
    # A train run of 2 tasks over 3 steps: 6 groups, 2 tasks; each task's figures pool its steps.
    trials = [t(f"g{step}{task}", float(step == 2), name=task) for step in range(3) for task in ("a", "b")]
    s = run_summarize(trials=trials, scored=True)
    assert s["tasks"] == 2 and s["groups"] == 6 and s["trials"] == 6
    assert s["per_task"]["a"]["attempts"] == 3 and s["per_task"]["a"]["mean_reward"] == pytest.approx(1 / 3)
    assert s["mean_reward"] == pytest.approx(1 / 3)

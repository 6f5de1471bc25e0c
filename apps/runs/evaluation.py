"""Aggregates of assessed trials: mean reward, pass@k, errors by type.

An attempt is *assessed* when its verifier gave a reward, or when it failed by the agent's own
doing (it timed out, crashed, left a required output out): that counts as 0. Every other ending
(a verifier error, a platform error, a cancelled or lost trial) says nothing about the agent:
such attempts are counted apart, by error type, and weigh in no mean and no pass@k.
"""

from __future__ import annotations

from collections import Counter
from math import comb
from typing import Any

# A trial passes when its primary reward reaches this value (binary tests write 1/0).
PASS_THRESHOLD = 1.0
# Failures that are the agent's: its attempt is assessed, with reward 0.
AGENT_ERRORS = frozenset(
    {
        "AgentTimeoutError",
        "AgentSetupTimeoutError",
        "NonZeroAgentExitCodeError",
        "RequiredOutputMissing",
        "SetupCommandFailed",
        "LaunchError",
    }
)
VERIFIER_ERROR = "VerifierError"


def assessed(trial: Any) -> bool:
    return trial.reward is not None or trial.error_type in AGENT_ERRORS


def pass_at_k(*, n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n attempts of which c passed (Chen et al. 2021, eq. 1)."""
    if k > n:
        raise ValueError("k must not exceed n")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def _ks(n: int) -> list[int]:
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= n]
    if n not in ks:
        ks.append(n)
    return ks


def group_summarize(*, trials: list[Any]) -> dict[str, Any]:
    counted = [t for t in trials if assessed(t)]
    n = len(counted)
    rewards = [t.reward if t.reward is not None else 0.0 for t in counted]
    passed = sum(1 for t in counted if t.reward is not None and t.reward >= PASS_THRESHOLD)
    errors = Counter(t.error_type for t in trials if t.error_type)
    return {
        "attempts": len(trials),
        "assessed": n,
        "scored": sum(1 for t in trials if t.reward is not None),
        "mean_reward": sum(rewards) / n if n else None,
        "passed": passed,
        "pass_at_k": {str(k): pass_at_k(n=n, c=passed, k=k) for k in _ks(n)} if n else {},
        "errors": dict(errors),
        "verifier_errors": errors.get(VERIFIER_ERROR, 0),
        "unassessed": len(trials) - n,
    }


def run_summarize(*, trials: list[Any], scored: bool) -> dict[str, Any]:
    """The run's figures, each over all of its trials: a train run samples a task once per
    step (one group each), and its per-task figures pool that task's groups of every step
    (training.reward_by_step has them by step)."""
    by_task: dict[str, list[Any]] = {}
    for t in trials:
        by_task.setdefault(t.task_version.name, []).append(t)
    statuses = Counter(t.status for t in trials)
    errors = Counter(t.error_type for t in trials if t.error_type)
    summary: dict[str, Any] = {
        "trials": len(trials),
        "tasks": len(by_task),
        "groups": len({t.group_id for t in trials}),
        "statuses": dict(statuses),
        "errors": dict(errors),
    }
    if scored:
        summary["assessed"] = sum(1 for t in trials if assessed(t))
        summary["verifier_errors"] = errors.get(VERIFIER_ERROR, 0)
    if not scored:
        return summary
    per_task = {name: group_summarize(trials=task_trials) for name, task_trials in by_task.items()}
    means = [g["mean_reward"] for g in per_task.values() if g["mean_reward"] is not None]
    summary["mean_reward"] = sum(means) / len(means) if means else None
    ks = sorted({int(k) for g in per_task.values() for k in g["pass_at_k"]})
    summary["pass_at_k"] = {
        str(k): sum(g["pass_at_k"][str(k)] for g in per_task.values() if str(k) in g["pass_at_k"])
        / sum(1 for g in per_task.values() if str(k) in g["pass_at_k"])
        for k in ks
    }
    summary["per_task"] = per_task
    return summary


def actors_summarize(*, trials: list[Any], actors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A mixed run's figures per actor (harness), in the run's order of actors: each
    actor's groups pooled, so an operator compares harnesses on the same model."""
    figures = []
    for actor in actors:
        own = [t for t in trials if t.actor_id == actor["id"]]
        pooled = group_summarize(trials=own)
        figures.append(
            {
                "profile": actor["profile"],
                "version": actor["version"],
                "engine": actor["engine"],
                "groups": len({t.group_id for t in own}),
                "trials": len(own),
                "assessed": pooled["assessed"],
                "mean_reward": pooled["mean_reward"],
                "passed": pooled["passed"],
                "errors": pooled["errors"],
            }
        )
    return figures

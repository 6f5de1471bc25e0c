"""`synth run compare A B`: two runs over the same tasks, task by task (e.g. a baseline
against a checkpoint).

Per task and overall: the mean reward of each run with a 95% confidence interval, pass@k
and the differences B - A. The intervals are percentile bootstraps with a fixed seed, so
the same runs always give the same figures: per task, the attempts are resampled; overall
(the mean of the task means, as the run summary computes it), the attempts are resampled
within each task (a stratified bootstrap). The difference is bootstrapped from independent
resamples of both runs.

Which attempts count follows the server's rule (apps/runs/evaluation.py, reported in the
run's summary): an attempt counts when it has a reward, or when it failed by the agent's own
doing, as 0. When the run's summary reports a task's `assessed` count, its attempts without
a reward fill up to it as zeros; for a run still going (no summary yet), only rewarded
attempts count. A task passes at reward 1.0 or more; pass@k is the unbiased estimator
(Chen et al. 2021).
"""

from __future__ import annotations

import random
from math import comb
from typing import Annotated, Any

import typer

from synth_cli.cli import JsonOpt, api_open
from synth_cli.http import Api
from synth_cli.output import Ui
from synth_cli.run_outputs import run_collection, run_path

PASS_THRESHOLD = 1.0
CONFIDENCE = 0.95
SEED = 0


def pass_at_k(*, n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def _ks(n: int) -> list[int]:
    return [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= n]


def task_rewards(*, run: dict[str, Any], trials: list[dict[str, Any]]) -> dict[str, list[float]]:
    """The counted rewards of each task of a run (attempts that did not count are left out)."""
    per_task_summary = (run.get("summary") or {}).get("per_task") or {}
    rewards: dict[str, list[float]] = {}
    for trial in trials:
        name = str(trial.get("task"))
        rewards.setdefault(name, [])
        if trial.get("reward") is not None:
            rewards[name].append(float(trial["reward"]))
    for name, values in rewards.items():
        assessed = (per_task_summary.get(name) or {}).get("assessed")
        if isinstance(assessed, int) and assessed > len(values):
            values.extend([0.0] * (assessed - len(values)))  # the agent's own failures
    return rewards


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _mean_of_means(strata: list[list[float]]) -> float | None:
    means = [m for m in (_mean(s) for s in strata) if m is not None]
    return _mean(means)


def _resample(rng: random.Random, strata: list[list[float]]) -> list[list[float]]:
    return [rng.choices(s, k=len(s)) if s else [] for s in strata]


def _interval(values: list[float]) -> list[float] | None:
    if not values:
        return None
    values = sorted(values)
    tail = (1 - CONFIDENCE) / 2
    low = values[int(tail * (len(values) - 1))]
    high = values[int(round((1 - tail) * (len(values) - 1)))]
    return [low, high]


def bootstrap(
    *, a: list[list[float]], b: list[list[float]], resamples: int, seed: int = SEED
) -> dict[str, list[float] | None]:
    """Percentile intervals of the mean of task means of a, of b, and of b - a."""
    rng = random.Random(seed)
    draws_a: list[float] = []
    draws_b: list[float] = []
    draws_d: list[float] = []
    for _ in range(resamples):
        mean_a = _mean_of_means(_resample(rng, a))
        mean_b = _mean_of_means(_resample(rng, b))
        if mean_a is not None:
            draws_a.append(mean_a)
        if mean_b is not None:
            draws_b.append(mean_b)
        if mean_a is not None and mean_b is not None:
            draws_d.append(mean_b - mean_a)
    return {"a": _interval(draws_a), "b": _interval(draws_b), "diff": _interval(draws_d)}


def _side(rewards: list[float] | None) -> dict[str, Any]:
    values = rewards or []
    passed = sum(1 for r in values if r >= PASS_THRESHOLD)
    return {
        "n": len(values),
        "passed": passed,
        "mean": _mean(values),
        "pass_at_k": {str(k): pass_at_k(n=len(values), c=passed, k=k) for k in _ks(len(values))},
    }


def _diff(a: Any, b: Any) -> float | None:
    return b - a if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None


def compare_rewards(*, a: dict[str, list[float]], b: dict[str, list[float]], resamples: int = 2000) -> dict[str, Any]:
    """The comparison of two runs' per-task rewards (the `--json` shape without run ids)."""
    tasks: list[dict[str, Any]] = []
    for name in sorted(set(a) | set(b)):
        side_a, side_b = _side(a.get(name)), _side(b.get(name))
        intervals = bootstrap(a=[a.get(name) or []], b=[b.get(name) or []], resamples=resamples)
        side_a["ci"], side_b["ci"] = intervals["a"], intervals["b"]
        common = set(side_a["pass_at_k"]) & set(side_b["pass_at_k"])
        tasks.append(
            {
                "task": name,
                "a": side_a,
                "b": side_b,
                "diff": {
                    "mean": _diff(side_a["mean"], side_b["mean"]),
                    "ci": intervals["diff"],
                    "pass_at_k": {k: side_b["pass_at_k"][k] - side_a["pass_at_k"][k] for k in sorted(common, key=int)},
                },
            }
        )
    shared = [t["task"] for t in tasks if t["a"]["n"] and t["b"]["n"]]
    strata_a = [a[name] for name in shared]
    strata_b = [b[name] for name in shared]
    overall_intervals = bootstrap(a=strata_a, b=strata_b, resamples=resamples)
    ks = sorted({k for t in tasks if t["task"] in shared for k in t["diff"]["pass_at_k"]}, key=int)

    def pass_mean(side: str, k: str) -> float | None:
        values = [t[side]["pass_at_k"][k] for t in tasks if t["task"] in shared and k in t[side]["pass_at_k"]]
        return _mean(values)

    overall_a: dict[str, Any] = {"mean": _mean_of_means(strata_a), "ci": overall_intervals["a"]}
    overall_b: dict[str, Any] = {"mean": _mean_of_means(strata_b), "ci": overall_intervals["b"]}
    overall_a["pass_at_k"] = {
        k: pass_mean("a", k) for k in ks if all(k in t["a"]["pass_at_k"] for t in tasks if t["task"] in shared)
    }
    overall_b["pass_at_k"] = {k: pass_mean("b", k) for k in overall_a["pass_at_k"]}
    return {
        "method": {
            "interval": "percentile bootstrap",
            "confidence": CONFIDENCE,
            "resamples": resamples,
            "seed": SEED,
            "pass_threshold": PASS_THRESHOLD,
        },
        "tasks": tasks,
        "overall": {
            "tasks": len(shared),
            "a": overall_a,
            "b": overall_b,
            "diff": {
                "mean": _diff(overall_a["mean"], overall_b["mean"]),
                "ci": overall_intervals["diff"],
                "pass_at_k": {
                    k: _diff(overall_a["pass_at_k"][k], overall_b["pass_at_k"][k]) for k in overall_a["pass_at_k"]
                },
            },
        },
    }


def _run_rewards(api: Api, run_id: str) -> tuple[dict[str, Any], dict[str, list[float]]]:
    run = api.get(run_path(run_id))
    trials = run_collection(api, run_id, "trials")
    return run, task_rewards(run=run, trials=trials)


def _mean_ci(side: dict[str, Any]) -> str:
    if side.get("mean") is None:
        return "-"
    ci = side.get("ci")
    return f"{side['mean']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{side['mean']:.3f}"


def _signed(value: Any) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _pass(side: dict[str, Any], k: str) -> str:
    value = (side.get("pass_at_k") or {}).get(k)
    return "-" if value is None else f"{value:.3f}"


def compare_command(
    run_a: Annotated[str, typer.Argument(metavar="RUN_A", help="The baseline.")],
    run_b: Annotated[str, typer.Argument(metavar="RUN_B", help="The run compared with it.")],
    resamples: Annotated[int, typer.Option("--resamples", min=100, help="Bootstrap resamples.")] = 2000,
    json_output: JsonOpt = False,
) -> None:
    """Compare two runs task by task: mean reward with a 95% confidence interval (a
    percentile bootstrap with a fixed seed, stratified by task overall), pass@k, and the
    differences B - A. Tasks in only one run are listed but left out of the overall figures.

    --json prints {"a", "b" (run ids), "method", "tasks": [{"task", "a", "b", "diff"}],
    "overall": {"tasks", "a", "b", "diff"}}; each side is {"n", "passed", "mean", "ci":
    [low, high], "pass_at_k": {"1": ...}}, a diff {"mean", "ci", "pass_at_k"}.
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api, ui.status(f"Fetching {run_a} and {run_b}..."):
        _, rewards_a = _run_rewards(api, run_a)
        _, rewards_b = _run_rewards(api, run_b)
    result = {"a": run_a, "b": run_b, **compare_rewards(a=rewards_a, b=rewards_b, resamples=resamples)}
    if json_output:
        ui.emit_json(result)
        return
    overall = result["overall"]
    ks = list(overall["a"]["pass_at_k"]) or ["1"]
    k_top = ks[-1]
    pass_columns = ["1", k_top] if k_top != "1" else ["1"]
    rows = []
    for t in [*result["tasks"], {"task": "(overall)", **overall}]:
        diff = t["diff"]
        ci = diff.get("ci")
        counts = f"{t['a']['n']}/{t['b']['n']}" if "n" in t["a"] else f"{overall['tasks']} tasks"
        diff_text = _signed(diff["mean"])
        if ci and diff["mean"] is not None:
            diff_text += f" [{ci[0]:+.3f}, {ci[1]:+.3f}]"
        row = [t["task"], counts, _mean_ci(t["a"]), _mean_ci(t["b"]), diff_text]
        for k in pass_columns:
            row += [_pass(t["a"], k), _pass(t["b"], k), _signed((diff.get("pass_at_k") or {}).get(k))]
        rows.append(row)
    columns = ["TASK", "N A/B", "A MEAN [95% CI]", "B MEAN [95% CI]", "B-A [95% CI]"]
    for k in pass_columns:
        columns += [f"A PASS@{k}", f"B PASS@{k}", f"B-A PASS@{k}"]
    ui.table(columns, rows)
    ui.note(f"A = {run_a}, B = {run_b}; intervals: percentile bootstrap, {resamples} resamples, seed {SEED}")

"""`synth run agreement A B`: how far two assessments of the same retained outputs agree
(two regrades of one run, or a regrade and its source run's own verifier).

Registered on `synth run` by synth_cli.runs."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from synth_cli.cli import JsonOpt, api_open
from synth_cli.output import Ui
from synth_cli.run_outputs import run_path


def _share(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


def agreement_command(
    run_a: Annotated[str, typer.Argument(metavar="RUN_A", help="A regrade, or the run it re-assessed.")],
    run_b: Annotated[str, typer.Argument(metavar="RUN_B", help="Another assessment of the same outputs.")],
    threshold: Annotated[
        float | None, typer.Option("--threshold", "-t", help="A reward at or above it passes (default 1.0).")
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """Compare two judges (or a judge and the task's tests) on the same retained work.

    Prints the agreement rate, Cohen's kappa, the pass/fail confusion matrix and the
    attempts the two disagree on. --json prints the server's object: {"a", "b",
    "source_run", "threshold", "compared", "unassessed", "only_in_a", "only_in_b",
    "agreement", "kappa", "confusion": {"pass_pass", "pass_fail", "fail_pass",
    "fail_fail"}, "disagreements": [{"attempt", "task", "a", "b"}]}.
    """
    ui = Ui(json_mode=json_output)
    params: dict[str, Any] = {"with": run_b}
    if threshold is not None:
        params["threshold"] = threshold
    with api_open() as api, ui.status(f"Comparing {run_a} with {run_b}..."):
        body = api.get(run_path(run_a, "agreement"), params=params)
    if json_output:
        ui.emit_json(body)
        return
    confusion = body["confusion"]
    ui.fields(
        [
            ("A", body["a"]),
            ("B", body["b"]),
            ("outputs of", body["source_run"]),
            ("pass at", f"reward >= {body['threshold']:g}"),
            ("compared", body["compared"]),
            ("agreement", _share(body["agreement"])),
            ("kappa", _share(body["kappa"])),
        ]
    )
    ui.table(
        ["", "B PASS", "B FAIL"],
        [
            ["A PASS", confusion["pass_pass"], confusion["pass_fail"]],
            ["A FAIL", confusion["fail_pass"], confusion["fail_fail"]],
        ],
    )
    skipped = {k: body[k] for k in ("unassessed", "only_in_a", "only_in_b") if body[k]}
    if skipped:
        ui.note("not compared: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in skipped.items()))
    if body["disagreements"]:
        ui.table(
            ["ATTEMPT", "TASK", "A TRIAL", "A REWARD", "B TRIAL", "B REWARD"],
            [
                [d["attempt"], d["task"], d["a"]["trial"], d["a"]["reward"], d["b"]["trial"], d["b"]["reward"]]
                for d in body["disagreements"]
            ],
            title="Disagreements",
        )
    else:
        ui.note("no disagreements")

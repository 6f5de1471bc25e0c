"""Read-only commands over what the server keeps: dataset and profile lists, model
routes, checkpoints (with lineage), captured model interactions, and one trial with its
logs. Each prints a table or key/value view, or the server's objects with --json.

`dataset list` and `profile list` are registered on their groups by synth_cli.main.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer

from synth_cli.cli import JsonOpt, SynthTyper, api_open
from synth_cli.errors import CliError
from synth_cli.output import Ui, digest_short, time_short
from synth_cli.run_outputs import artifact_download, render_items, run_collection

LimitOpt = Annotated[int, typer.Option("--limit", "-n", min=1, help="At most this many (pages are followed).")]
model_app = SynthTyper(help="The model routes the proxy serves.")
checkpoint_app = SynthTyper(help="Checkpoints training runs saved, and where each came from and went.")
interaction_app = SynthTyper(help="Model calls the proxy captured (tokens, timings, training eligibility).")
trial_app = SynthTyper(help="One trial (an attempt of a task): its record and its logs.")


def dataset_list_command(limit: LimitOpt = 50, json_output: JsonOpt = False) -> None:
    """List your organization's dataset versions, newest first.

    --json prints a JSON array of {"id", "reference", "name", "version", "digest",
    "task_count", "created_at"}.
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api, ui.status("Listing datasets..."):
        items = api.collect("/api/datasets", limit=limit)
    if json_output:
        ui.emit_json(items)
        return
    render_items(ui, items, ["reference", "task_count", "digest", "id", "created_at"], empty="no datasets")


def profile_list_command(limit: LimitOpt = 50, json_output: JsonOpt = False) -> None:
    """List your organization's agent profiles, newest first.

    --json prints a JSON array of {"id", "name", "latest_version", "versions_count", "created_at"}.
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api, ui.status("Listing profiles..."):
        items = api.collect("/api/profiles", limit=limit)
    if json_output:
        ui.emit_json(items)
        return
    render_items(ui, items, ["name", "latest_version", "versions_count", "created_at"], empty="no profiles")


@model_app.command("list")
def model_list_command(json_output: JsonOpt = False) -> None:
    """List the model routes: family, context window, max output, whether trainable.

    --json prints a JSON array of {"name", "family", "context_window", "max_output",
    "trainable", "inference_enabled", "aliases"}.
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api, ui.status("Listing models..."):
        items = api.collect("/api/models")
    if json_output:
        ui.emit_json(items)
        return
    render_items(
        ui,
        items,
        ["name", "family", "context_window", "max_output", "trainable", "inference_enabled", "aliases"],
        empty="no model routes",
    )


@checkpoint_app.command("list")
def checkpoint_list_command(
    run: Annotated[str | None, typer.Option("--run", "-r", metavar="RUN_ID", help="Only this run's.")] = None,
    limit: LimitOpt = 50,
    json_output: JsonOpt = False,
) -> None:
    """List your organization's checkpoints, newest first.

    --json prints a JSON array of checkpoint objects (as `synth run checkpoints --json`).
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api, ui.status("Listing checkpoints..."):
        items = api.collect("/api/checkpoints", params={"run": run}, limit=limit)
    if json_output:
        ui.emit_json(items)
        return
    render_items(
        ui, items, ["id", "run", "step", "route", "digest", "milestone", "parent", "created_at"], empty="no checkpoints"
    )


@checkpoint_app.command("show")
def checkpoint_show_command(
    checkpoint_id: Annotated[str, typer.Argument(metavar="CHECKPOINT_ID")], json_output: JsonOpt = False
) -> None:
    """Show a checkpoint and its lineage: the run and update that produced it, its
    ancestors, the runs that selected it and the sampling groups sampled against it.

    --json prints the checkpoint object with "lineage": {"produced_by": {"run", "step",
    "update"}, "ancestors": [{"id", "run", "step"}], "selected_by_runs", "sampled_groups"}.
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api, ui.status(f"Fetching {checkpoint_id}..."):
        body = api.get(f"/api/checkpoints/{quote(checkpoint_id, safe='')}")
    if json_output:
        ui.emit_json(body)
        return
    lineage = body.get("lineage") or {}
    produced = lineage.get("produced_by") or {}
    ui.fields(
        [
            ("id", body.get("id")),
            ("run", body.get("run")),
            ("step", body.get("step")),
            ("route", body.get("route")),
            ("base model", body.get("base_model")),
            ("backend", body.get("backend")),
            ("digest", digest_short(body.get("digest"))),
            ("size", body.get("size")),
            ("milestone", body.get("milestone")),
            ("produced by", f"{produced.get('run')} step {produced.get('step')} ({produced.get('update') or '-'})"),
            (
                "ancestors",
                " <- ".join(f"{a['id']} ({a['run']} step {a['step']})" for a in lineage.get("ancestors") or []),
            ),
            ("selected by runs", ", ".join(lineage.get("selected_by_runs") or [])),
            ("sampled groups", len(lineage.get("sampled_groups") or [])),
            ("use as", body.get("model")),
            ("created", time_short(body.get("created_at"))),
        ]
    )


@interaction_app.command("list")
def interaction_list_command(
    run: Annotated[str | None, typer.Option("--run", "-r", metavar="RUN_ID", help="Only this run's calls.")] = None,
    trial: Annotated[str | None, typer.Option("--trial", metavar="TRIAL_ID", help="Only this trial's calls.")] = None,
    limit: LimitOpt = 50,
    json_output: JsonOpt = False,
) -> None:
    """List captured model calls, newest first.

    --json prints a JSON array of interaction objects (see `synth interaction show --help`).
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api, ui.status("Listing interactions..."):
        items = api.collect("/api/interactions", params={"run": run, "trial": trial}, limit=limit)
    if json_output:
        ui.emit_json(items)
        return
    rows = [
        {
            **item,
            "delivery": (item.get("delivery") or {}).get("state"),
            "eligibility": (item.get("eligibility") or {}).get("state"),
        }
        for item in items
    ]
    render_items(
        ui,
        rows,
        ["id", "trial", "route", "prompt_tokens", "output_tokens", "stop_reason", "eligibility", "created_at"],
        empty="no interactions",
    )


@interaction_app.command("show")
def interaction_show_command(
    interaction_id: Annotated[str, typer.Argument(metavar="INTERACTION_ID")], json_output: JsonOpt = False
) -> None:
    """Show one captured model call: route, tokens, timings, delivery, integrity, eligibility.

    --json prints the server's object: {"id", "run", "trial", "principal", "route",
    "model_requested", "snapshot", "stop_reason", "prompt_tokens", "output_tokens",
    "timings", "delivery", "integrity", "eligibility", "payload": {"inline", "download"}, ...}.
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api, ui.status(f"Fetching {interaction_id}..."):
        body = api.get(f"/api/interactions/{quote(interaction_id, safe='')}")
    if json_output:
        ui.emit_json(body)
        return
    skip = {"payload"}
    ui.fields([(key.replace("_", " "), value) for key, value in body.items() if key not in skip])


def _trial_get(api: Any, trial_id: str) -> dict[str, Any]:
    return api.get(f"/api/trials/{quote(trial_id, safe='')}")


@trial_app.command("show")
def trial_show_command(
    trial_id: Annotated[str, typer.Argument(metavar="TRIAL_ID")], json_output: JsonOpt = False
) -> None:
    """Show one trial: run, task, attempt, status, reward(s), error and timings.

    --json prints the server's trial object (as in `synth run trials --json`) with "run".
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api, ui.status(f"Fetching {trial_id}..."):
        trial = _trial_get(api, trial_id)
    if json_output:
        ui.emit_json(trial)
        return
    ui.fields([(key.replace("_", " "), time_short(v) if key.endswith("_at") else v) for key, v in trial.items()])


@trial_app.command("logs")
def trial_logs_command(
    trial_id: Annotated[str, typer.Argument(metavar="TRIAL_ID")],
    name: Annotated[
        str | None,
        typer.Option("--name", metavar="NAME", help="Only this log (e.g. agent/claude-code.txt), no header."),
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """Print a trial's logs (its artifacts other than retained work), each after a
    `==> NAME <==` header. Every file is sha256-verified before it is printed.

    --json prints a JSON array of {"name", "size", "digest", "text"} (text decoded as
    UTF-8, undecodable bytes replaced).
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api:
        with ui.status(f"Fetching the logs of {trial_id}..."):
            trial = _trial_get(api, trial_id)
            artifacts = run_collection(api, str(trial["run"]), "artifacts", params={"trial": trial_id})
        logs = [a for a in artifacts if a.get("kind") != "work" and (name is None or a.get("name") == name)]
        if name is not None and not logs:
            raise CliError(f"trial {trial_id} has no log named {name}")
        texts = []
        with tempfile.TemporaryDirectory(prefix="synth-logs-") as folder:
            for artifact in logs:
                path = artifact_download(api, artifact, Path(folder))
                texts.append(path.read_bytes().decode("utf-8", errors="replace"))
    if json_output:
        ui.emit_json(
            [
                {"name": a.get("name"), "size": a.get("size"), "digest": a.get("digest"), "text": text}
                for a, text in zip(logs, texts, strict=True)
            ]
        )
        return
    if not logs:
        ui.note(f"trial {trial_id} has no logs")
    for artifact, text in zip(logs, texts, strict=True):
        if name is None:
            typer.echo(f"==> {artifact.get('name')} <==")
        typer.echo(text, nl=bool(text) and not text.endswith("\n"))

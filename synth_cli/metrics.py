"""`synth run metrics RUN`: a training run's per-step figures, for plots and trackers.

One row per learning update (the server's step numbering): status, reward, loss, gradient
norm, KL between sampler and trainer, data and token counts, and the phase timings. As CSV
or JSON Lines (on stdout, or --out FILE), as TensorBoard event files (the tensorboard
package's own writer, scalars under `train/<metric>`), or as an offline W&B run when the
wandb package is installed (`wandb sync DIR` uploads it later).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from synth_cli.cli import api_open
from synth_cli.errors import CliError, UsageError
from synth_cli.output import Ui
from synth_cli.run_outputs import run_collection

# (column, where it is read in an update object): the update's own fields, then its metrics.
FIELDS: list[tuple[str, str]] = [
    ("step", "step"),
    ("status", "status"),
    ("reward_mean", "metrics.reward_mean"),
    ("loss", "metrics.loss_sum"),
    ("grad_norm", "metrics.grad_norm"),
    ("kl_sample_train", "metrics.kl_sample_train"),
    ("datums", "datums"),
    ("sampled_tokens", "sampled_tokens"),
    ("attempts_qualified", "metrics.attempts_qualified"),
    ("groups_used", "metrics.groups_used"),
    ("groups_skipped", "metrics.groups_skipped"),
    ("gather_seconds", "metrics.gather_seconds"),
    ("train_seconds", "metrics.train_seconds"),
    ("save_seconds", "metrics.save_seconds"),
    ("checkpoint", "checkpoint"),
    ("finished_at", "finished_at"),
]
# What is plotted: the numbers, not the step, labels or ids.
SCALARS = [name for name, _ in FIELDS if name not in ("step", "status", "checkpoint", "finished_at")]
FORMATS = ("csv", "jsonl", "tensorboard", "wandb")


def metric_rows(updates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for update in updates:
        row: dict[str, Any] = {}
        for name, source in FIELDS:
            if source.startswith("metrics."):
                row[name] = (update.get("metrics") or {}).get(source.removeprefix("metrics."))
            else:
                row[name] = update.get(source)
        rows.append(row)
    return rows


def rows_csv(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[name for name, _ in FIELDS], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buffer.getvalue()


def rows_tensorboard(rows: list[dict[str, Any]], *, directory: Path) -> int:
    """Write the scalars as TensorBoard event files in `directory`; the count of points."""
    try:
        from tensorboard.summary import Writer
    except ImportError:
        raise CliError("--format tensorboard needs the tensorboard package (pip install tensorboard)") from None
    from datetime import datetime

    directory.mkdir(parents=True, exist_ok=True)
    writer = Writer(str(directory))
    points = 0
    try:
        for row in rows:
            finished = row.get("finished_at")
            wall_time = datetime.fromisoformat(finished).timestamp() if isinstance(finished, str) else None
            for name in SCALARS:
                value = row.get(name)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    writer.add_scalar(f"train/{name}", float(value), int(row["step"]), wall_time=wall_time)
                    points += 1
        writer.flush()
    finally:
        writer.close()
    return points


def rows_wandb(rows: list[dict[str, Any]], *, directory: Path, run: str) -> None:
    try:
        import wandb
    except ImportError:
        raise CliError("--format wandb needs the wandb package (pip install wandb)") from None
    directory.mkdir(parents=True, exist_ok=True)
    # Offline: nothing leaves the machine until `wandb sync`.
    tracker = wandb.init(mode="offline", dir=str(directory), project="synth", name=run, id=run)
    try:
        for row in rows:
            values = {f"train/{k}": row[k] for k in SCALARS if isinstance(row.get(k), (int, float))}
            tracker.log(values, step=int(row["step"]))
    finally:
        tracker.finish()


def metrics_command(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID")],
    output_format: Annotated[
        str, typer.Option("--format", metavar="csv|jsonl|tensorboard|wandb", help="What to write.")
    ] = "csv",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", metavar="PATH", help="A file (csv, jsonl; default stdout) or a folder (tensorboard, wandb)."
        ),
    ] = None,
) -> None:
    """Export a training run's metrics by step: reward, loss, gradient norm, KL, tokens
    and timings.

    csv and jsonl go to stdout (or --out FILE); one row per learning update with the
    columns step, status, reward_mean, loss, grad_norm, kl_sample_train, datums,
    sampled_tokens, attempts_qualified, groups_used, groups_skipped, gather_seconds,
    train_seconds, save_seconds, checkpoint, finished_at (empty / null when not measured).
    tensorboard writes event files into --out DIR (default runs/RUN_ID), scalars tagged
    train/<column>: `tensorboard --logdir runs`. wandb (when installed) writes an offline
    run into --out DIR.
    """
    ui = Ui(json_mode=False)
    if output_format not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, not {output_format!r}")
    with api_open() as api, ui.status(f"Fetching updates of {run_id}..."):
        rows = metric_rows(run_collection(api, run_id, "updates"))
    if output_format in ("csv", "jsonl"):
        text = rows_csv(rows) if output_format == "csv" else "".join(json.dumps(r) + "\n" for r in rows)
        if out is None:
            typer.echo(text, nl=False)
        else:
            out.write_text(text, encoding="utf-8")
            ui.note(f"wrote {len(rows)} step(s) to {out}")
        return
    directory = out or Path("runs") / run_id
    if output_format == "tensorboard":
        points = rows_tensorboard(rows, directory=directory)
        ui.note(f"wrote {points} point(s) of {len(rows)} step(s) to {directory} (tensorboard --logdir {directory})")
    else:
        rows_wandb(rows, directory=directory, run=run_id)
        ui.note(f"wrote an offline W&B run of {len(rows)} step(s) to {directory} (wandb sync to upload)")
    if not rows:
        ui.warn(f"run {run_id} has no learning updates")

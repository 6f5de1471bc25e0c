"""What a run produced, as `synth run` subcommands: its trials, checkpoints, learning
updates and artifacts (downloaded through their read grants, sha256-verified).

The commands are registered on `synth run` by synth_cli.runs.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath
from typing import Annotated, Any
from urllib.parse import quote, urljoin

import httpx
import typer

from synth_cli.cli import JsonOpt, api_open
from synth_cli.errors import ApiError, CliError
from synth_cli.http import TRANSFER_TIMEOUT, Api, plain_client, same_origin
from synth_cli.output import Ui, digest_short, time_short


def run_path(run_id: str, sub: str = "") -> str:
    return f"/api/runs/{quote(run_id, safe='')}" + (f"/{sub}" if sub else "")


def run_collection(api: Api, run_id: str, sub: str, *, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """GET /api/runs/ID/<sub> (all pages). A 404 is either an unknown run or a server
    that does not have this view yet; asking for the run itself tells them apart."""
    try:
        return api.collect(run_path(run_id, sub), params=params)
    except ApiError as exc:
        if exc.status != 404:
            raise
        api.get(run_path(run_id))  # raises the server's "run ... not found"
        raise CliError(f"this server does not support run {sub} yet") from None


def _columns(items: list[dict[str, Any]], preferred: list[str]) -> list[str]:
    present = [key for key in preferred if any(key in item for item in items)]
    return present or sorted({k for item in items for k, v in item.items() if not isinstance(v, (dict, list))})


def render_items(ui: Ui, items: list[dict[str, Any]], preferred: list[str], *, empty: str) -> None:
    if not items:
        ui.note(empty)
        return
    columns = _columns(items, preferred)
    rows = []
    for item in items:
        row = []
        for key in columns:
            value = item.get(key)
            if isinstance(value, dict) and "message" in value:
                value = value["message"]  # e.g. a trial's {"type", "message"} error
            elif key.endswith("_at"):
                value = time_short(value)
            elif key in ("digest", "sha256"):
                value = digest_short(value)
            row.append(value)
        rows.append(row)
    ui.table([c.upper().replace("_", " ") for c in columns], rows)


def trials_command(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID")],
    status: Annotated[str | None, typer.Option("--status", "-s", help="Only trials in this status.")] = None,
    json_output: JsonOpt = False,
) -> None:
    """List a run's trials (attempts): task, status, reward, error, timings.

    --json prints a JSON array of the server's trial objects: {"id", "group", "task",
    "task_version_id", "attempt", "status", "reward", "rewards", "error", "timings", ...}.
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api, ui.status(f"Fetching trials of {run_id}..."):
        trials = run_collection(api, run_id, "trials", params={"status": status})
    if json_output:
        ui.emit_json(trials)
        return
    render_items(
        ui,
        trials,
        ["id", "task", "task_name", "attempt", "status", "reward", "error", "started_at", "finished_at"],
        empty="no trials yet",
    )


def checkpoints_command(run_id: Annotated[str, typer.Argument(metavar="RUN_ID")], json_output: JsonOpt = False) -> None:
    """List the checkpoints a training run saved, one per applied update.

    Use one as a model with {"model": {"checkpoint": "ckpt_..."}} in agent.json, or
    `synth claude --model ckpt_...`. --json prints a JSON array of the server's checkpoint
    objects (id, step, route, snapshot, digest, size, milestone, parent, model, created_at).
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api, ui.status(f"Fetching checkpoints of {run_id}..."):
        checkpoints = run_collection(api, run_id, "checkpoints")
    if json_output:
        ui.emit_json(checkpoints)
        return
    render_items(
        ui, checkpoints, ["id", "step", "route", "digest", "milestone", "created_at"], empty="no checkpoints yet"
    )


def updates_command(run_id: Annotated[str, typer.Argument(metavar="RUN_ID")], json_output: JsonOpt = False) -> None:
    """List a training run's learning updates: status, data used, reward and loss per step.

    --json prints a JSON array of the server's update objects (with per-group details).
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api, ui.status(f"Fetching updates of {run_id}..."):
        updates = run_collection(api, run_id, "updates")
    if json_output:
        ui.emit_json(updates)
        return
    rows = [
        {
            "step": u["step"],
            "status": u["status"],
            "datums": u["datums"],
            "tokens": u["sampled_tokens"],
            "reward": u["metrics"].get("reward_mean"),
            "loss": u["metrics"].get("loss_sum"),
            "checkpoint": u["checkpoint"],
        }
        for u in updates
    ]
    render_items(
        ui, rows, ["step", "status", "datums", "tokens", "reward", "loss", "checkpoint"], empty="no updates yet"
    )


def _artifact_grant(artifact: dict[str, Any]) -> tuple[str, str] | None:
    """(method, url) of the read grant ({"download": {"url", "method"}}, or a bare URL)."""
    for key in ("download", "grant", "read_grant"):
        value = artifact.get(key)
        if isinstance(value, dict) and isinstance(value.get("url"), str):
            return str(value.get("method") or "GET").upper(), value["url"]
        if isinstance(value, str):
            return "GET", value
    for key in ("download_url", "url"):
        if isinstance(artifact.get(key), str):
            return "GET", artifact[key]
    return None


def _artifact_target(directory: Path, artifact: dict[str, Any]) -> Path:
    """Where an artifact lands: its name as a relative path, never outside `directory`."""
    # "path" is unique within the run (trial/name); "name" may repeat across trials.
    name = str(artifact.get("path") or artifact.get("name") or artifact.get("id") or "artifact")
    parts = [p for p in PurePosixPath(name.replace("\\", "/")).parts if p not in ("", ".", "/")]
    if not parts or ".." in parts or PurePosixPath(name).is_absolute():
        parts = [str(artifact.get("id") or hashlib.sha256(name.encode()).hexdigest()[:16])]
    return directory.joinpath(*parts)


def artifact_download(api: Api, artifact: dict[str, Any], directory: Path) -> Path:
    """Stream one artifact through its read grant, verifying its sha256 before keeping it."""
    label = artifact.get("name") or artifact.get("id")
    grant = _artifact_grant(artifact)
    expected = str(artifact.get("digest") or artifact.get("sha256") or "").removeprefix("sha256:").lower()
    if not grant:
        raise CliError(f"artifact {label}: no download grant in the server's answer")
    method, url = grant
    if not expected:
        raise CliError(f"artifact {label}: no digest in the server's answer; cannot verify it")
    absolute = urljoin(api.base_url + "/", url)
    target = _artifact_target(directory, artifact)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    # Our token goes only to our own server; a presigned URL elsewhere carries its own
    # authority (and object stores reject an unexpected Authorization header).
    client = api.http if same_origin(absolute, api.base_url) else plain_client()
    try:
        with client.stream(method, absolute, timeout=TRANSFER_TIMEOUT) as response:
            if not response.is_success:
                raise CliError(f"artifact {label}: download failed with HTTP {response.status_code}")
            with partial.open("wb") as handle:
                for chunk in response.iter_bytes():
                    digest.update(chunk)
                    handle.write(chunk)
    except httpx.TransportError as exc:
        partial.unlink(missing_ok=True)
        raise CliError(f"artifact {label}: download interrupted ({exc})") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        if client is not api.http:
            client.close()
    actual = digest.hexdigest()
    if actual != expected:
        partial.unlink(missing_ok=True)
        raise CliError(f"artifact {label}: sha256 mismatch (expected {expected}, got {actual}); not kept")
    os.replace(partial, target)
    return target


def artifacts_command(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID")],
    trial: Annotated[str | None, typer.Option("--trial", help="Only the artifacts of this trial.")] = None,
    download: Annotated[
        Path | None,
        typer.Option("--download", metavar="DIR", help="Download every artifact into DIR, verifying sha256 digests."),
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """List a run's artifacts (digest, size, download grant); optionally download them.

    A downloaded file whose sha256 differs from the listed digest is deleted and the
    command fails.

    --json prints a JSON array of the server's artifact objects: {"id", "trial", "name",
    "path", "kind", "digest", "size", "created_at", "download": {"url", "method",
    "expires_at"}}; downloads land in DIR/<path>.
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api:
        with ui.status(f"Fetching artifacts of {run_id}..."):
            artifacts = run_collection(api, run_id, "artifacts", params={"trial": trial})
        if download is not None:
            download.mkdir(parents=True, exist_ok=True)
            for artifact in artifacts:
                with ui.status(f"Downloading {artifact.get('name') or artifact.get('id')}..."):
                    path = artifact_download(api, artifact, download)
                ui.progress(f"{path} (sha256 verified)")
            ui.note(f"downloaded {len(artifacts)} artifact(s) to {download}, sha256 verified")
    if json_output:
        ui.emit_json(artifacts)
        return
    render_items(ui, artifacts, ["id", "path", "kind", "size", "digest", "created_at"], empty="no artifacts")

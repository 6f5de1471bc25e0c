"""`synth run ...` and `synth train start`: submit, follow and inspect runs."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path, PurePosixPath
from typing import Annotated, Any
from urllib.parse import quote, urljoin

import httpx
import typer

from synth_cli.cli import JsonOpt, SynthTyper, api_open
from synth_cli.errors import ApiError, CliError, UsageError
from synth_cli.events import events_follow, events_page_all
from synth_cli.http import TRANSFER_TIMEOUT, Api, plain_client, response_json, same_origin
from synth_cli.inputs import dataset_ref_parse, json_object_arg, profile_arg
from synth_cli.output import Ui, cell_text, digest_short, profile_ref_text, time_short
from synth_cli.profiles import profile_resolve

RUN_EPILOG = (
    "Examples:\n\n"
    "  synth run start --dataset team/examples@v1 --actor @examples/agent.json --plan @eval-plan.json\n\n"
    "  synth run events RUN_ID --follow\n\n"
    "  synth run list --status running --json | jq '.[].id'\n\n"
    "  synth run artifacts RUN_ID --download ./out"
)

run_app = SynthTyper(help="Submit, follow and inspect evaluation and execution runs.", epilog=RUN_EPILOG)
train_app = SynthTyper(
    help="Submit training runs (a run of kind train; inspect it with `synth run ...`).",
    epilog=(
        "Examples:\n\n"
        "  synth train start --dataset team/examples@v1 --actor @examples/agent.json --plan @train-plan.json\n\n"
        "  synth run updates RUN_ID\n\n"
        "  synth run checkpoints RUN_ID"
    ),
)


def _run_path(run_id: str, sub: str = "") -> str:
    return f"/api/runs/{quote(run_id, safe='')}" + (f"/{sub}" if sub else "")


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the form the automatic idempotency key hashes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# --------------------------------------------------------------------------- start

DatasetOpt = Annotated[str, typer.Option("--dataset", "-d", metavar="ORG/NAME@VERSION", help="Dataset version to run.")]
ActorOpt = Annotated[
    str,
    typer.Option(
        "--actor", "-a", metavar="@AGENT.json|NAME[@VERSION]", help="Agent recipe file (published first) or profile."
    ),
]
ActorNameOpt = Annotated[
    str | None,
    typer.Option("--actor-name", metavar="NAME", help="Profile name for --actor @FILE (default: file stem)."),
]
PlanOpt = Annotated[
    str, typer.Option("--plan", "-p", metavar="@PLAN.json", help="The plan: @FILE.json or inline JSON.")
]
JudgeOpt = Annotated[
    str | None,
    typer.Option(
        "--judge", metavar="@JUDGE.json|NAME[@VERSION]", help="Judge recipe or profile (default: the task tests)."
    ),
]
JudgeNameOpt = Annotated[
    str | None,
    typer.Option("--judge-name", metavar="NAME", help="Profile name for --judge @FILE (default: file stem)."),
]
KeyOpt = Annotated[
    str | None,
    typer.Option(
        "--idempotency-key",
        metavar="KEY",
        help="Default: sha256 of the submission, so repeating a start returns the same run. "
        "Pass a fresh key to start an identical run again.",
    ),
]


def run_submit(
    *,
    kind: str,
    dataset: str,
    actor: str,
    actor_name: str | None,
    plan: str,
    judge: str | None,
    judge_name: str | None,
    idempotency_key: str | None,
    json_output: bool,
) -> None:
    ui = Ui(json_mode=json_output)
    # Everything local is checked before the first request (exit 2, nothing published).
    dataset = dataset_ref_parse(dataset)
    actor_spec = profile_arg(actor, option="--actor")
    judge_spec = profile_arg(judge, option="--judge") if judge else None
    plan_body = json_object_arg(plan, option="--plan")
    if judge_name and not judge:
        raise UsageError("--judge-name needs --judge @FILE.json")
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= 200:
        raise UsageError("--idempotency-key must be 1-200 characters")
    with api_open() as api:
        actor_ref = profile_resolve(api, ui, actor_spec, name=actor_name, role="actor")
        judge_ref = profile_resolve(api, ui, judge_spec, name=judge_name, role="judge") if judge_spec else None
        body = {"kind": kind, "dataset": dataset, "actor": actor_ref, "judge": judge_ref, "plan": plan_body}
        key = idempotency_key or hashlib.sha256(canonical_json(body)).hexdigest()
        with ui.status("Submitting run..."):
            response = api.request("POST", "/api/runs", json=body, headers={"Idempotency-Key": key})
    run = response_json(response)
    if json_output:
        ui.emit_json(run)
        return
    if response.status_code == 201:
        ui.note(
            f"started {run.get('kind')} run on {run.get('dataset')} with {profile_ref_text(run.get('actor'))}"
            f" ({run.get('status')})"
        )
    else:
        ui.note("already submitted (same idempotency key and body): the existing run")
    ui.line(str(run["id"]))


@run_app.command("start")
def start_command(
    dataset: DatasetOpt,
    actor: ActorOpt,
    plan: PlanOpt,
    kind: Annotated[
        str, typer.Option("--kind", "-k", metavar="evaluate|execute", help="evaluate (assessed) or execute (unscored).")
    ] = "evaluate",
    judge: JudgeOpt = None,
    actor_name: ActorNameOpt = None,
    judge_name: JudgeNameOpt = None,
    idempotency_key: KeyOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Start an evaluation or execution run; prints the run id.

    An --actor @FILE recipe is published first (or found, if identical) and pinned by
    version and digest. Repeating the same start returns the same run (safe to retry).

    --json prints the server's run object (see `synth run show --help`).
    """
    if kind not in ("evaluate", "execute"):
        raise UsageError(f"--kind must be evaluate or execute, not {kind!r} (training: `synth train start`)")
    run_submit(
        kind=kind,
        dataset=dataset,
        actor=actor,
        actor_name=actor_name,
        plan=plan,
        judge=judge,
        judge_name=judge_name,
        idempotency_key=idempotency_key,
        json_output=json_output,
    )


@train_app.command("start")
def train_start_command(
    dataset: DatasetOpt,
    actor: ActorOpt,
    plan: PlanOpt,
    judge: JudgeOpt = None,
    actor_name: ActorNameOpt = None,
    judge_name: JudgeNameOpt = None,
    idempotency_key: KeyOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Start a training run (kind train); prints the run id.

    Same arguments as `synth run start`, without --kind.
    --json prints the server's run object.
    """
    run_submit(
        kind="train",
        dataset=dataset,
        actor=actor,
        actor_name=actor_name,
        plan=plan,
        judge=judge,
        judge_name=judge_name,
        idempotency_key=idempotency_key,
        json_output=json_output,
    )


# --------------------------------------------------------------------------- show / list / cancel


def _render_run(ui: Ui, run: dict[str, Any]) -> None:
    ui.fields(
        [
            ("id", run.get("id")),
            ("kind", run.get("kind")),
            ("status", run.get("status")),
            ("dataset", run.get("dataset")),
            ("dataset digest", digest_short(run.get("dataset_digest"))),
            ("actor", profile_ref_text(run.get("actor"))),
            ("judge", profile_ref_text(run.get("judge"))),
            ("model", run.get("model")),
            ("plan", run.get("plan")),
            ("summary", run.get("summary")),
            ("error", run.get("error")),
            ("events", run.get("last_event_seq")),
            ("created", time_short(run.get("created_at"))),
            ("started", time_short(run.get("started_at"))),
            ("finished", time_short(run.get("finished_at"))),
            ("cancel requested", time_short(run.get("cancel_requested_at"))),
        ]
    )


@run_app.command("show")
def show_command(run_id: Annotated[str, typer.Argument(metavar="RUN_ID")], json_output: JsonOpt = False) -> None:
    """Show one run: status, pinned inputs, summary.

    --json prints the server's run object: {"id", "kind", "status", "dataset",
    "dataset_digest", "actor": {"profile", "version", "digest"}, "judge", "model", "plan",
    "summary", "error", "last_event_seq", "created_at", "started_at", "finished_at",
    "cancel_requested_at"}.
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api, ui.status(f"Fetching {run_id}..."):
        run = api.get(_run_path(run_id))
    if json_output:
        ui.emit_json(run)
    else:
        _render_run(ui, run)


@run_app.command("list")
def list_command(
    status: Annotated[
        str | None, typer.Option("--status", "-s", help="Only runs in this status, e.g. running.")
    ] = None,
    kind: Annotated[
        str | None, typer.Option("--kind", "-k", help="Only runs of this kind: evaluate, execute, train.")
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=1, help="At most this many runs (pages are followed).")
    ] = 20,
    json_output: JsonOpt = False,
) -> None:
    """List runs, newest first.

    --json prints a JSON array of run objects (as `synth run show --json`).
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api, ui.status("Listing runs..."):
        runs = api.collect("/api/runs", params={"status": status, "kind": kind}, limit=limit)
    if json_output:
        ui.emit_json(runs)
        return
    if not runs:
        ui.note("no runs")
        return
    ui.table(
        ["ID", "KIND", "STATUS", "DATASET", "ACTOR", "CREATED"],
        [
            (
                r.get("id"),
                r.get("kind"),
                r.get("status"),
                r.get("dataset"),
                profile_ref_text({**(r.get("actor") or {}), "digest": None}) if r.get("actor") else None,
                time_short(r.get("created_at")),
            )
            for r in runs
        ],
    )


@run_app.command("cancel")
def cancel_command(run_id: Annotated[str, typer.Argument(metavar="RUN_ID")], json_output: JsonOpt = False) -> None:
    """Cancel a run (running attempts stop; a finished run is left as it is).

    --json prints the server's run object after the request.
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api, ui.status(f"Cancelling {run_id}..."):
        run = api.post(_run_path(run_id, "cancel"))
    if json_output:
        ui.emit_json(run)
    else:
        ui.line(f"{run.get('id')}: {run.get('status')}")


# --------------------------------------------------------------------------- events


def _event_line(event: dict[str, Any]) -> str:
    data = event.get("data")
    data_text = json.dumps(data, ensure_ascii=False, separators=(",", ":")) if data else ""
    return f"{event.get('seq'):>5}  {time_short(event.get('created_at')) or '-'}  {event.get('type')}  {data_text}".rstrip()


def _server_timeout_default() -> float | None:
    raw = os.environ.get("SYNTH_FOLLOW_SERVER_TIMEOUT")
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


@run_app.command("events")
def events_command(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Stream new events until the run ends; exit 0 only if it succeeded.")
    ] = False,
    after: Annotated[int, typer.Option("--after", min=0, help="Start after this event sequence number.")] = 0,
    server_timeout: Annotated[
        float | None,
        typer.Option(
            "--server-timeout",
            hidden=True,
            min=1,
            help="Ask the server to close the stream after this many seconds (it is resumed). "
            "Env: SYNTH_FOLLOW_SERVER_TIMEOUT.",
        ),
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """Print a run's events in order; with --follow, stream them until the run ends.

    Following resumes after dropped connections from the last event seen, so every
    event is printed once, in order. Exit code with --follow: 0 if the run succeeded,
    1 if it failed or was cancelled.

    --json prints one event object per line (JSON Lines): {"seq", "type", "data", "created_at"}.
    """
    ui = Ui(json_mode=json_output)

    def emit(event: dict[str, Any]) -> None:
        if json_output:
            ui.emit_json_line(event)
        else:
            typer.echo(_event_line(event))

    with api_open() as api:
        if not follow:
            with ui.status(f"Fetching events of {run_id}..."):
                events = events_page_all(api, run_id, after=after)
            for event in events:
                emit(event)
            return
        status = events_follow(
            api,
            run_id,
            after=after,
            on_event=emit,
            server_timeout=server_timeout or _server_timeout_default(),
            on_reconnect=lambda last, why: ui.progress(f"resuming after event {last}: {why}"),
        )
    if status == "succeeded":
        ui.note(f"run {run_id} succeeded")
    else:
        raise CliError(f"run {run_id} {status or 'ended without a status'}")


# --------------------------------------------------------------------------- views of later issues


def run_collection(api: Api, run_id: str, sub: str, *, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """GET /api/runs/ID/<sub> (all pages). A 404 is either an unknown run or a server
    that does not have this view yet; asking for the run itself tells them apart."""
    try:
        return api.collect(_run_path(run_id, sub), params=params)
    except ApiError as exc:
        if exc.status != 404:
            raise
        api.get(_run_path(run_id))  # raises the server's "run ... not found"
        raise CliError(f"this server does not support run {sub} yet") from None


def _columns(items: list[dict[str, Any]], preferred: list[str]) -> list[str]:
    present = [key for key in preferred if any(key in item for item in items)]
    return present or sorted({k for item in items for k, v in item.items() if not isinstance(v, (dict, list))})


def _render_items(ui: Ui, items: list[dict[str, Any]], preferred: list[str], *, empty: str) -> None:
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


@run_app.command("trials")
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
    _render_items(
        ui,
        trials,
        ["id", "task", "task_name", "attempt", "status", "reward", "error", "started_at", "finished_at"],
        empty="no trials yet",
    )


@run_app.command("checkpoints")
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
    _render_items(
        ui, checkpoints, ["id", "step", "route", "digest", "milestone", "created_at"], empty="no checkpoints yet"
    )


@run_app.command("updates")
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
    _render_items(
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


@run_app.command("artifacts")
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
    _render_items(ui, artifacts, ["id", "path", "kind", "size", "digest", "created_at"], empty="no artifacts")


@run_app.command("regrade")
def regrade_command(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID")],
    judge: Annotated[
        str, typer.Option("--judge", metavar="@JUDGE.json|NAME[@VERSION]", help="The judge to re-assess outputs with.")
    ],
    judge_name: JudgeNameOpt = None,
    idempotency_key: KeyOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Re-assess a run's retained outputs with a judge.

    --json prints the server's answer unchanged.
    """
    ui = Ui(json_mode=json_output)
    judge_spec = profile_arg(judge, option="--judge")
    with api_open() as api:
        judge_ref = profile_resolve(api, ui, judge_spec, name=judge_name, role="judge")
        body = {"judge": judge_ref}
        key = idempotency_key or hashlib.sha256(canonical_json({"run": run_id, **body})).hexdigest()
        try:
            with ui.status(f"Requesting a regrade of {run_id}..."):
                # Not retried after the request may have arrived: whether the server honours
                # the key for regrades is up to the issue that builds them.
                result = api.post(
                    _run_path(run_id, "regrade"), json=body, headers={"Idempotency-Key": key}, idempotent=False
                )
        except ApiError as exc:
            if exc.status not in (404, 405):
                raise
            api.get(_run_path(run_id))
            raise CliError("this server does not support run regrade yet") from None
    if json_output:
        ui.emit_json(result)
    elif isinstance(result, dict) and result.get("id"):
        ui.line(str(result["id"]))
    else:
        ui.line(cell_text(result))

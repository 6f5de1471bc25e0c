"""`synth run ...` and `synth train start`: submit, follow and inspect runs."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

import typer

from synth_cli.agreement import agreement_command
from synth_cli.cli import JsonOpt, SynthTyper, api_open
from synth_cli.compare import compare_command
from synth_cli.config import follow_server_timeout
from synth_cli.errors import ApiError, CliError, UsageError
from synth_cli.events import events_follow, events_page_all
from synth_cli.http import response_json
from synth_cli.inputs import dataset_ref_parse, json_object_arg, profile_arg
from synth_cli.metrics import metrics_command
from synth_cli.output import Ui, cell_text, digest_short, profile_ref_text, time_short
from synth_cli.profiles import profile_resolve
from synth_cli.run_outputs import artifacts_command, checkpoints_command, run_path, trials_command, updates_command
from synth_cli.watch import IntervalOpt, run_watch, watch_command

RUN_EPILOG = (
    "Examples:\n\n"
    "  synth run start --dataset team/examples@v1 --actor @examples/agent.json --plan @eval-plan.json\n\n"
    "  synth run start --dataset team/examples@v1 --actor oracle --attempts 4 --task 'examples/*' --follow\n\n"
    "  synth run watch RUN_ID\n\n"
    "  synth run compare BASELINE_RUN CHECKPOINT_RUN --json\n\n"
    "  synth run metrics TRAIN_RUN --format tensorboard --out runs/TRAIN_RUN\n\n"
    "  synth run list --status running --json | jq '.[].id'\n\n"
    "  synth run artifacts RUN_ID --download ./out"
)

run_app = SynthTyper(help="Submit, follow and inspect evaluation and execution runs.", epilog=RUN_EPILOG)
train_app = SynthTyper(
    help="Submit training runs (a run of kind train; inspect it with `synth run ...`).",
    epilog=(
        "Examples:\n\n"
        "  synth train start --dataset team/examples@v1 --actor @examples/agent.json --plan @train-plan.json --follow\n\n"
        "  synth run updates RUN_ID\n\n"
        "  synth run checkpoints RUN_ID"
    ),
)


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
    str | None,
    typer.Option(
        "--plan", "-p", metavar="@PLAN.json", help="The plan: @FILE.json or inline JSON (the flags below override it)."
    ),
]
AttemptsOpt = Annotated[
    int | None, typer.Option("--attempts", min=1, help="Plan key attempts_per_task: attempts of each task.")
]
ConcurrencyOpt = Annotated[
    int | None, typer.Option("--concurrency", min=1, help="Plan key max_concurrency: trials in flight at most.")
]
TimeoutMultiplierOpt = Annotated[
    float | None,
    typer.Option("--timeout-multiplier", help="Plan key timeout_multiplier (above 0)."),
]
TaskOpt = Annotated[
    list[str] | None,
    typer.Option("--task", "-t", metavar="GLOB", help="Plan key task_names: only matching tasks (repeatable)."),
]
FollowOpt = Annotated[
    bool, typer.Option("--follow", "-f", help="Then show its live progress (`synth run watch`) until it ends.")
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


def plan_merge(
    *,
    plan: str | None,
    kind: str,
    attempts: int | None = None,
    concurrency: int | None = None,
    timeout_multiplier: float | None = None,
    tasks: list[str] | None = None,
) -> dict[str, Any]:
    """The plan of --plan (or {}), with the common keys given as flags set over it."""
    body = json_object_arg(plan, option="--plan") if plan else {}
    if attempts is not None:
        if kind == "train":
            # A training plan sizes its groups with group_size; the server would refuse the key.
            raise UsageError("--attempts does not apply to training (its plan sets group_size)")
        body["attempts_per_task"] = attempts
    if concurrency is not None:
        body["max_concurrency"] = concurrency
    if timeout_multiplier is not None:
        body["timeout_multiplier"] = timeout_multiplier
    if tasks:
        body["task_names"] = list(tasks)
    return body


def run_submit(
    *,
    kind: str,
    dataset: str,
    actor: str,
    actor_name: str | None,
    plan_body: dict[str, Any],
    judge: str | None,
    judge_name: str | None,
    idempotency_key: str | None,
    json_output: bool,
    follow: bool = False,
    interval: float = 2.0,
) -> None:
    ui = Ui(json_mode=json_output)
    # Everything local is checked before the first request (exit 2, nothing published).
    dataset = dataset_ref_parse(dataset)
    actor_spec = profile_arg(actor, option="--actor")
    judge_spec = profile_arg(judge, option="--judge") if judge else None
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
        if json_output and follow:
            ui.emit_json_line(run)  # then progress objects: one stream of JSON Lines
        elif json_output:
            ui.emit_json(run)
        else:
            if response.status_code == 201:
                ui.note(
                    f"started {run.get('kind')} run on {run.get('dataset')} with {profile_ref_text(run.get('actor'))}"
                    f" ({run.get('status')})"
                )
            else:
                ui.note("already submitted (same idempotency key and body): the existing run")
            ui.line(str(run["id"]))
        if follow:
            run_watch(api=api, ui=ui, run_id=str(run["id"]), interval=interval)


@run_app.command("start")
def start_command(
    dataset: DatasetOpt,
    actor: ActorOpt,
    plan: PlanOpt = None,
    kind: Annotated[
        str, typer.Option("--kind", "-k", metavar="evaluate|execute", help="evaluate (assessed) or execute (unscored).")
    ] = "evaluate",
    attempts: AttemptsOpt = None,
    concurrency: ConcurrencyOpt = None,
    timeout_multiplier: TimeoutMultiplierOpt = None,
    task: TaskOpt = None,
    judge: JudgeOpt = None,
    actor_name: ActorNameOpt = None,
    judge_name: JudgeNameOpt = None,
    idempotency_key: KeyOpt = None,
    follow: FollowOpt = False,
    interval: IntervalOpt = 2.0,
    json_output: JsonOpt = False,
) -> None:
    """Start an evaluation or execution run; prints the run id.

    An --actor @FILE recipe is published first (or found, if identical) and pinned by
    version and digest. Repeating the same start returns the same run (safe to retry).
    --attempts, --concurrency, --timeout-multiplier and --task set their plan keys over
    --plan (which may then be left out). --follow then shows the run's live progress and
    exits 0 only if it succeeded.

    --json prints the server's run object (see `synth run show --help`); with --follow,
    JSON Lines: the run object, then progress objects (see `synth run watch --help`).
    """
    if kind not in ("evaluate", "execute"):
        raise UsageError(f"--kind must be evaluate or execute, not {kind!r} (training: `synth train start`)")
    plan_body = plan_merge(
        plan=plan,
        kind=kind,
        attempts=attempts,
        concurrency=concurrency,
        timeout_multiplier=timeout_multiplier,
        tasks=task,
    )
    run_submit(
        kind=kind,
        dataset=dataset,
        actor=actor,
        actor_name=actor_name,
        plan_body=plan_body,
        judge=judge,
        judge_name=judge_name,
        idempotency_key=idempotency_key,
        json_output=json_output,
        follow=follow,
        interval=interval,
    )


@train_app.command("start")
def train_start_command(
    dataset: DatasetOpt,
    actor: ActorOpt,
    plan: PlanOpt = None,
    concurrency: ConcurrencyOpt = None,
    timeout_multiplier: TimeoutMultiplierOpt = None,
    task: TaskOpt = None,
    judge: JudgeOpt = None,
    actor_name: ActorNameOpt = None,
    judge_name: JudgeNameOpt = None,
    idempotency_key: KeyOpt = None,
    follow: FollowOpt = False,
    interval: IntervalOpt = 2.0,
    json_output: JsonOpt = False,
) -> None:
    """Start a training run (kind train); prints the run id.

    Same arguments as `synth run start`, without --kind and --attempts (a training plan
    sets group_size); --follow also shows the current step, its reward and loss.
    --json prints the server's run object (with --follow, JSON Lines as for run start).
    """
    plan_body = plan_merge(
        plan=plan, kind="train", concurrency=concurrency, timeout_multiplier=timeout_multiplier, tasks=task
    )
    run_submit(
        kind="train",
        dataset=dataset,
        actor=actor,
        actor_name=actor_name,
        plan_body=plan_body,
        judge=judge,
        judge_name=judge_name,
        idempotency_key=idempotency_key,
        json_output=json_output,
        follow=follow,
        interval=interval,
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
        run = api.get(run_path(run_id))
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
def cancel_command(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID")],
    reason: Annotated[
        str | None, typer.Option("--reason", "-r", help="Why; recorded in the run's cancel event.")
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """Cancel a run (running attempts stop; a finished run is left as it is).

    --json prints the server's run object after the request.
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api, ui.status(f"Cancelling {run_id}..."):
        run = api.post(run_path(run_id, "cancel"), json={"reason": reason} if reason is not None else None)
    if json_output:
        ui.emit_json(run)
    else:
        ui.line(f"{run.get('id')}: {run.get('status')}")


# --------------------------------------------------------------------------- events


def _event_line(event: dict[str, Any]) -> str:
    data = event.get("data")
    data_text = json.dumps(data, ensure_ascii=False, separators=(",", ":")) if data else ""
    return f"{event.get('seq'):>5}  {time_short(event.get('created_at')) or '-'}  {event.get('type')}  {data_text}".rstrip()


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
            server_timeout=server_timeout or follow_server_timeout(),
            on_reconnect=lambda last, why: ui.progress(f"resuming after event {last}: {why}"),
        )
    if status == "succeeded":
        ui.note(f"run {run_id} succeeded")
    else:
        raise CliError(f"run {run_id} {status or 'ended without a status'}")


# --------------------------------------------------------------------------- what a run produced

run_app.command("watch")(watch_command)
run_app.command("compare")(compare_command)
run_app.command("metrics")(metrics_command)
run_app.command("trials")(trials_command)
run_app.command("checkpoints")(checkpoints_command)
run_app.command("updates")(updates_command)
run_app.command("artifacts")(artifacts_command)
run_app.command("agreement")(agreement_command)


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
                # Sent once: a retry after the request may have arrived is left to the
                # operator, and re-running the command is safe (the server deduplicates
                # regrades by the Idempotency-Key).
                result = api.post(
                    run_path(run_id, "regrade"), json=body, headers={"Idempotency-Key": key}, idempotent=False
                )
        except ApiError as exc:
            if exc.status not in (404, 405):
                raise
            api.get(run_path(run_id))
            raise CliError("this server does not support run regrade yet") from None
    if json_output:
        ui.emit_json(result)
    elif isinstance(result, dict) and result.get("id"):
        ui.line(str(result["id"]))
    else:
        ui.line(cell_text(result))

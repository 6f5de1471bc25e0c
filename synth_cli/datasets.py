"""`synth dataset push|show`: import Harbor task folders as a dataset version, inspect one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

import typer

from synth_cli.cli import JsonOpt, SynthTyper, api_open
from synth_cli.errors import CliError
from synth_cli.http import TRANSFER_TIMEOUT, Api, response_json
from synth_cli.inputs import DATASET_REF, dataset_name_parse, dataset_ref_parse
from synth_cli.output import Ui, digest_short, time_short
from synth_cli.packing import pack_folder, pack_registry

dataset_app = SynthTyper(
    help="Import Harbor task folders as immutable dataset versions, and inspect them.",
    epilog=(
        "Examples:\n\n"
        "  synth dataset push examples/tasks --name team/examples --version v1\n\n"
        "  synth dataset push bench/registry.json --name team/bench --version 2025-01\n\n"
        "  synth dataset show team/examples@v1"
    ),
)


def dataset_get_all(api: Api, reference: str) -> dict[str, Any]:
    """The dataset version with every task (the server pages them; the pages are joined)."""
    match = DATASET_REF.match(reference)
    assert match is not None  # checked by dataset_ref_parse
    path = "/api/datasets/{}/{}@{}".format(*(quote(match[k], safe="") for k in ("org", "name", "version")))
    body = api.get(path, params={"limit": 500})
    tasks = list(body.get("tasks") or [])
    while body.get("next"):
        parts = urlsplit(body["next"])
        body = api.get(f"{parts.path}?{parts.query}")
        tasks.extend(body.get("tasks") or [])
    body["tasks"] = tasks
    body["next"] = None
    return body


def _render(ui: Ui, body: dict[str, Any]) -> None:
    ui.fields(
        [
            ("dataset", body.get("reference")),
            ("id", body.get("id")),
            ("digest", f"sha256:{body.get('digest')}"),
            ("tasks", body.get("task_count")),
            ("created", time_short(body.get("created_at"))),
        ]
    )
    tasks = body.get("tasks") or []
    if tasks:
        ui.out.print()
        ui.table(
            ["#", "TASK", "DIGEST", "TASK VERSION"],
            [
                (t.get("position"), t.get("name"), digest_short(t.get("digest")), t.get("task_version_id"))
                for t in tasks
            ],
        )
    if body.get("next"):
        ui.note("(more tasks: see `synth dataset show`)")


def _warn_local_sandbox(ui: Ui, body: dict[str, Any]) -> None:
    """Tasks the local sandbox cannot run: imported (other environments may run them), but
    a run in the local sandbox over this dataset will be refused."""
    verdict = body.get("local_sandbox") or {}
    count = int(verdict.get("unsupported_count") or 0)
    if not count:
        return
    lines = [
        f"the local sandbox cannot run {count} task(s) of {body.get('reference')}; runs there will be refused "
        "(other environments, e.g. plan.environment docker, may run them):"
    ]
    for task in verdict.get("unsupported") or []:
        lines.append(f"  {task.get('name')}: {'; '.join(task.get('problems') or [])}")
    if count > len(verdict.get("unsupported") or []):
        lines.append(f"  ... and {count - len(verdict.get('unsupported') or [])} more")
    ui.warn("\n".join(lines))


@dataset_app.command("push")
def push_command(
    source: Annotated[
        Path,
        typer.Argument(
            metavar="DIR|registry.json", help="A folder of task folders, a task folder, or a registry.json."
        ),
    ],
    name: Annotated[
        str, typer.Option("--name", "-n", metavar="ORG/NAME", help="Dataset name (ORG is your token's organization).")
    ],
    version: Annotated[str, typer.Option("--version", "-v", metavar="VERSION", help="Version label, e.g. v1.")],
    json_output: JsonOpt = False,
) -> None:
    """Upload task folders as dataset version ORG/NAME@VERSION.

    The folder is packed in memory as a deterministic tar.gz and imported by the server,
    which validates every task. Pushing identical content again is a no-op; different
    content under an existing version is refused (versions are immutable).

    --json prints the server's dataset version object: {"id", "reference", "name", "version",
    "digest", "task_count", "created_at", "tasks": [{"position", "task_version_id", "name",
    "digest"}], "next", "local_sandbox": {"unsupported_count", "unsupported": [{..., "problems"}]}}
    (first page of tasks).

    Tasks the local sandbox cannot run (a Dockerfile instruction it cannot apply, a GPU, ...)
    are imported all the same, with a warning on stderr that names each one and why.
    """
    ui = Ui(json_mode=json_output)
    org, dataset_name = dataset_name_parse(name)
    if not source.exists():
        raise CliError(f"{source}: no such file or folder", exit_code=2)
    if source.is_file():
        packed = pack_registry(source, name=dataset_name, version=version)
    else:
        packed = pack_folder(source)
    ui.progress(f"packed {len(packed.tasks)} task(s), {packed.files} files, {len(packed.archive):,} bytes")
    files: dict[str, Any] = {"archive": ("dataset.tar.gz", packed.archive, "application/gzip")}
    if packed.registry is not None:
        files["registry"] = ("registry.json", packed.registry, "application/json")
    with api_open() as api, ui.status(f"Uploading {name}@{version}..."):
        response = api.request(
            "POST",
            "/api/datasets",
            data={"name": dataset_name, "version": version},
            files=files,
            timeout=TRANSFER_TIMEOUT,
        )
    body = response_json(response)
    reference = str(body.get("reference") or "")
    if org and not reference.startswith(f"{org}/"):
        # The organization comes from the token, so a mismatch means the wrong token.
        raise CliError(f"the server imported {reference}, not under organization {org}: check your token")
    if json_output:
        ui.emit_json(body)
    else:
        created = response.status_code == 201
        ui.note(f"{'imported' if created else 'already imported (identical content)'}: {reference}")
        _render(ui, body)
    _warn_local_sandbox(ui, body)


@dataset_app.command("show")
def show_command(
    reference: Annotated[str, typer.Argument(metavar="ORG/NAME@VERSION", help="The dataset version.")],
    json_output: JsonOpt = False,
) -> None:
    """Show a dataset version and its ordered tasks.

    --json prints the server's dataset version object with every task joined into
    "tasks" (all pages; "next" is null).
    """
    ui = Ui(json_mode=json_output)
    reference = dataset_ref_parse(reference)
    with api_open() as api, ui.status(f"Fetching {reference}..."):
        body = dataset_get_all(api, reference)
    if json_output:
        ui.emit_json(body)
        return
    _render(ui, body)

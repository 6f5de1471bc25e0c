"""`synth profile publish|show`, and resolving --actor/--judge to a pinned, verified version.

Trust rule: the CLI never re-serialises a recipe to check a digest. It checks that the
digest the service states is the sha256 of the exact bytes the service returned, so what
gets pinned is what the service will launch.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any
from urllib.parse import quote

import typer

from synth_cli.cli import JsonOpt, SynthTyper, api_open
from synth_cli.errors import CliError, UsageError
from synth_cli.http import Api, response_json
from synth_cli.inputs import ProfileRef, RecipeFile, json_file_load, profile_ref_parse
from synth_cli.output import Ui

DIGEST_HEADER = "X-Synth-Digest"

profile_app = SynthTyper(
    help="Publish agent recipes as immutable profile versions and read them back.",
    epilog=(
        "Examples:\n\n"
        "  synth profile publish @examples/agent.json --name claude-code-qwen3\n\n"
        "  synth profile show claude-code-qwen3@3\n\n"
        "  synth profile show claude-code-qwen3 --raw | sha256sum"
    ),
)


def _hex(digest: Any) -> str:
    return str(digest or "").removeprefix("sha256:").lower()


def _versions_path(name: str) -> str:
    return f"/api/profiles/{quote(name, safe='')}/versions"


def profile_publish(api: Api, *, name: str, recipe: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """POST the recipe; returns (the server's version object, created) after verifying it."""
    response = api.request("POST", _versions_path(name), json=recipe)
    body = response_json(response)
    canonical = body.get("canonical")
    if not isinstance(canonical, str) or not body.get("digest"):
        raise CliError(f"profile {name}: the server's answer has no canonical bytes or digest")
    actual = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    stated = _hex(body["digest"])
    header = response.headers.get(DIGEST_HEADER)
    if actual != stated or (header and _hex(header) != stated):
        raise CliError(
            f"profile {name}@{body.get('version')}: the server states digest sha256:{stated} "
            f"but its canonical bytes hash to sha256:{actual}; not using it"
        )
    return body, response.status_code == 201


def profile_latest_version(api: Api, name: str) -> int:
    body = api.get(f"/api/profiles/{quote(name, safe='')}", params={"limit": 1})
    latest = body.get("latest_version")
    if not isinstance(latest, int):
        raise CliError(f"profile {name} has no published version")
    return latest


def profile_fetch(api: Api, *, name: str, version: int) -> tuple[bytes, str]:
    """The exact canonical bytes of NAME@VERSION and their verified sha256 hex."""
    response = api.request("GET", f"{_versions_path(name)}/{version}")
    data = response.content
    stated = _hex(response.headers.get(DIGEST_HEADER))
    actual = hashlib.sha256(data).hexdigest()
    if not stated:
        raise CliError(f"profile {name}@{version}: the server sent no {DIGEST_HEADER} header")
    if stated != actual:
        raise CliError(
            f"profile {name}@{version}: {DIGEST_HEADER} says sha256:{stated} "
            f"but the body hashes to sha256:{actual}; not using it"
        )
    return data, actual


def profile_resolve(api: Api, ui: Ui, spec: RecipeFile | ProfileRef, *, name: str | None, role: str) -> dict[str, Any]:
    """--actor/--judge -> {"profile", "version", "digest": "sha256:<hex>"}, verified."""
    if isinstance(spec, RecipeFile):
        profile_name = name or spec.default_name
        with ui.status(f"Publishing {role} profile {profile_name}..."):
            body, created = profile_publish(api, name=profile_name, recipe=spec.recipe)
        ui.progress(
            f"{role}: {'published' if created else 'found'} {body['name']}@{body['version']} "
            f"(sha256:{_hex(body['digest'])[:12]}) from {spec.path}"
        )
        return {"profile": body["name"], "version": body["version"], "digest": f"sha256:{_hex(body['digest'])}"}
    if name:
        raise UsageError(f"--{role}-name only applies to --{role} @FILE.json")
    with ui.status(f"Resolving {role} profile {spec.name}..."):
        version = spec.version or profile_latest_version(api, spec.name)
        _, digest = profile_fetch(api, name=spec.name, version=version)
    # Pinning the digest (not only the version) keeps the automatic idempotency key
    # honest: a new latest version is a different submission.
    return {"profile": spec.name, "version": version, "digest": f"sha256:{digest}"}


@profile_app.command("publish")
def publish_command(
    recipe_file: Annotated[str, typer.Argument(metavar="@RECIPE.json", help="The recipe file (the @ is optional).")],
    name: Annotated[
        str | None, typer.Option("--name", "-n", help="Profile name (default: the file name without .json).")
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """Publish a recipe as a new profile version (identical content finds the existing one).

    Prints NAME@VERSION and its digest, after checking that the digest is the sha256 of
    the canonical bytes the service returned.

    --json prints the server's object: {"id", "name", "version", "digest": "sha256:<hex>", "canonical",
    "created_at"}.
    """
    ui = Ui(json_mode=json_output)
    path = recipe_file.removeprefix("@")
    recipe = json_file_load(path)
    if not isinstance(recipe, dict):
        raise UsageError(f"{path}: a recipe must be a JSON object, got {type(recipe).__name__}")
    spec = RecipeFile(path=path, recipe=recipe)
    with api_open() as api, ui.status(f"Publishing {name or spec.default_name}..."):
        body, created = profile_publish(api, name=name or spec.default_name, recipe=recipe)
    if json_output:
        # The digest as every other command writes it (profile show, run ... --json).
        ui.emit_json({**body, "digest": f"sha256:{_hex(body['digest'])}"})
        return
    ui.line(f"{body['name']}@{body['version']} sha256:{_hex(body['digest'])}")
    ui.note("published a new version" if created else "identical content was already published; nothing new")


@profile_app.command("show")
def show_command(
    reference: Annotated[str, typer.Argument(metavar="NAME[@VERSION]", help="Profile, latest version if none given.")],
    raw: Annotated[bool, typer.Option("--raw", help="Write the exact canonical bytes, nothing else.")] = False,
    json_output: JsonOpt = False,
) -> None:
    """Show a published profile version (its exact canonical bytes, digest verified).

    --json prints {"name", "version", "digest": "sha256:<hex>", "canonical": "<exact text>"};
    --raw writes the canonical bytes themselves, so `| sha256sum` gives the digest.
    """
    ui = Ui(json_mode=json_output)
    ref = profile_ref_parse(reference)
    with api_open() as api, ui.status(f"Fetching {reference}..."):
        version = ref.version or profile_latest_version(api, ref.name)
        data, digest = profile_fetch(api, name=ref.name, version=version)
    if raw:
        out = typer.get_binary_stream("stdout")
        out.write(data)
        out.flush()
        return
    text = data.decode("utf-8")
    if json_output:
        ui.emit_json({"name": ref.name, "version": version, "digest": f"sha256:{digest}", "canonical": text})
        return
    ui.note(f"{ref.name}@{version} sha256:{digest} (verified)")
    # A pretty view for reading; --raw and --json carry the exact bytes.
    ui.out.print_json(text)

"""The `synth` command: the app tree, `synth login`, `synth agent run`, `synth claude` and `synth codex`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from synth_cli import __version__
from synth_cli.browse import (
    checkpoint_app,
    dataset_list_command,
    interaction_app,
    model_app,
    profile_list_command,
    trial_app,
)
from synth_cli.cli import JsonOpt, SynthTyper, api_open
from synth_cli.config import Settings, claude_bin, codex_bin, config_read, config_write, proxy_url, url_normalize
from synth_cli.datasets import dataset_app
from synth_cli.errors import ApiError, CliError
from synth_cli.http import Api
from synth_cli.output import Ui, stdout_discard
from synth_cli.profiles import profile_app
from synth_cli.runs import run_app, train_app

app = SynthTyper(
    name="synth",
    help="Run, evaluate and train tool-using coding agents on Synth.",
    epilog=(
        "Examples:\n\n"
        "  synth login --url https://synth.example.com\n\n"
        "  synth dataset push examples/tasks --name team/examples --version v1\n\n"
        "  synth run start --dataset team/examples@v1 --actor @examples/agent.json --plan @eval-plan.json\n\n"
        "  synth run watch RUN_ID\n\n"
        "  synth trial logs TRIAL_ID | less\n\n"
        "Shell completion: synth --install-completion. "
        "Configuration: SYNTH_API_URL and SYNTH_TOKEN override the file written by `synth login` "
        "(${SYNTH_CONFIG_DIR:-~/.config/synth}/config.json). Every command takes --json. "
        "Exit codes: 0 success, 1 failed operation, 2 bad usage."
    ),
    pretty_exceptions_enable=False,
    # --install-completion / --show-completion for bash, zsh, fish and PowerShell.
    add_completion=True,
)
app.add_typer(run_app, name="run")
app.add_typer(train_app, name="train")
app.add_typer(dataset_app, name="dataset")
app.add_typer(profile_app, name="profile")
app.add_typer(model_app, name="model")
app.add_typer(checkpoint_app, name="checkpoint")
app.add_typer(interaction_app, name="interaction")
app.add_typer(trial_app, name="trial")
dataset_app.command("list")(dataset_list_command)
profile_app.command("list")(profile_list_command)
agent_app = SynthTyper(help="Run one agent attempt on a local task folder (needs the execution core).")
app.add_typer(agent_app, name="agent")


def _version(value: bool) -> None:
    if value:
        try:
            typer.echo(f"synth {__version__}")
        except BrokenPipeError:
            stdout_discard()  # outside a guarded command: as quiet as inside one
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Run, evaluate and train tool-using coding agents on Synth."""


@app.command("login")
def login_command(
    url: Annotated[str | None, typer.Option("--url", help="Server URL, e.g. https://synth.example.com.")] = None,
    token: Annotated[
        str | None, typer.Option("--token", help="API token (prompted for, hidden, if not given).")
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """Store the server URL and API token for later commands (checked against the server first).

    Written to ${SYNTH_CONFIG_DIR:-~/.config/synth}/config.json, readable only by you (0600).

    --json prints {"url", "config"} (never the token).
    """
    ui = Ui(json_mode=json_output)
    stored = config_read()
    if not url:
        url = typer.prompt("Server URL", default=stored.get("url") or "http://127.0.0.1:8000")
    url = url_normalize(url)
    if not token:
        token = typer.prompt("API token", hide_input=True)
    token = token.strip()
    with Api(Settings(url=url, token=token)) as api, ui.status(f"Checking {url}..."):
        try:
            api.get("/api/runs", params={"limit": 1})
        except ApiError as exc:
            if exc.status == 401:
                raise
            raise CliError(f"{url} did not accept the check (GET /api/runs): {exc.message}") from None
    path = config_write(url=url, token=token)
    if json_output:
        ui.emit_json({"url": url, "config": str(path)})
    else:
        ui.line(f"Logged in to {url}; saved to {path}")


@agent_app.command("run")
def agent_run_command(
    profile: Annotated[
        str, typer.Option("--profile", metavar="NAME[@VERSION]|@AGENT.json", help="The agent recipe to launch.")
    ],
    task: Annotated[Path, typer.Option("--task", metavar="DIR", help="A Harbor task folder.")],
    out: Annotated[
        Path | None, typer.Option("--out", metavar="DIR", help="Keep the trial folder (logs, rewards) here.")
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """Run one attempt of an agent profile on a local task folder, in the local sandbox,
    with the same launcher the trials workers use. Exit 0 when the attempt ran without
    error (whatever its reward), 1 otherwise.

    NAME[@VERSION] is fetched from the server (digest verified); @AGENT.json is used as is.

    Example: synth agent run --profile @examples/oracle-agent.json --task examples/tasks/implement-roman

    --json prints {"trial_dir", "rewards", "error": {"type", "message"} | null, "launch_plan_digest"}.
    """
    from synth_cli.inputs import RecipeFile, profile_arg
    from synth_cli.local_agent import agent_run_local

    ui = Ui(json_mode=json_output)
    spec = profile_arg(profile, option="--profile")
    if isinstance(spec, RecipeFile):
        recipe = spec.recipe
    else:
        import json

        from synth_cli.profiles import profile_fetch, profile_latest_version

        with api_open() as api:
            version = spec.version or profile_latest_version(api, spec.name)
            data, _ = profile_fetch(api, name=spec.name, version=version)
        recipe = json.loads(data)
    with ui.status(f"Running one attempt on {task}..."):
        attempt = agent_run_local(recipe=recipe, task_dir=task, out_dir=out)
    error = {"type": attempt.error_type, "message": attempt.error_message} if attempt.error_type else None
    if json_output:
        ui.emit_json(
            {
                "trial_dir": str(attempt.trial_dir),
                "rewards": attempt.rewards,
                "error": error,
                "launch_plan_digest": attempt.launch_plan_digest,
            }
        )
    else:
        ui.fields(
            [
                ("trial dir", str(attempt.trial_dir)),
                ("rewards", attempt.rewards),
                ("error", error),
                ("launch plan", f"sha256:{attempt.launch_plan_digest[:12]}"),
            ]
        )
    if error:
        raise CliError(f"the attempt ended in {attempt.error_type}: {attempt.error_message}")


@app.command(
    "claude",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def claude_command(
    model: Annotated[
        str | None,
        typer.Option(
            "--model", metavar="BASE|CHECKPOINT", help="A model route (default: qwen3-8b) or a checkpoint id."
        ),
    ] = None,
    ttl: Annotated[int, typer.Option("--ttl", help="Seconds the session's model credential lives.")] = 12 * 3600,
    claude_args: Annotated[
        list[str] | None, typer.Argument(metavar="CLAUDE_ARGS", help="Passed to claude unchanged.")
    ] = None,
) -> None:
    """Run the installed Claude Code against a Synth model, with its own tools, plugins,
    permissions and resume behaviour.

    Asks the server for a short-lived credential scoped to that model (never hands over
    your API token), points Claude Code at the model proxy the server names (its TCP
    listener; $SYNTH_PROXY_URL overrides the address), after checking that it answers, and
    names the model for the main agent, subagents and the small/fast slot. The claude binary: $SYNTH_CLAUDE_BIN, else
    `claude` on PATH, else node_modules/.bin/claude of the current directory.

    Example: synth claude --model qwen3-8b -- -p "fix the failing test"
    """
    import os
    import shutil

    with api_open() as api:
        issued = api.post("/api/model-credentials", json={"model": model or "qwen3-8b", "ttl_sec": ttl})
    binary = claude_bin() or shutil.which("claude")
    if not binary and Path("node_modules/.bin/claude").exists():
        binary = str(Path("node_modules/.bin/claude").resolve())
    if not binary:
        raise CliError("Claude Code is not installed: npm install @anthropic-ai/claude-code (or set SYNTH_CLAUDE_BIN)")
    route = issued["route"]
    base_url = proxy_url() or url_normalize(issued["base_url"])
    _proxy_check(base_url)
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "SYNTH_TOKEN")}
    env.update(
        ANTHROPIC_BASE_URL=base_url,
        ANTHROPIC_AUTH_TOKEN=issued["credential"],
        ANTHROPIC_MODEL=route,
        ANTHROPIC_DEFAULT_SONNET_MODEL=route,
        ANTHROPIC_DEFAULT_OPUS_MODEL=route,
        ANTHROPIC_DEFAULT_HAIKU_MODEL=route,
        ANTHROPIC_SMALL_FAST_MODEL=route,
        CLAUDE_CODE_SUBAGENT_MODEL=route,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    # Replace this process: signals, the terminal and the exit code belong to Claude Code.
    os.execvpe(binary, [binary, *(claude_args or [])], env)


@app.command(
    "codex",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def codex_command(
    model: Annotated[
        str | None,
        typer.Option(
            "--model", metavar="BASE|CHECKPOINT", help="A model route (default: qwen3-8b) or a checkpoint id."
        ),
    ] = None,
    ttl: Annotated[int, typer.Option("--ttl", help="Seconds the session's model credential lives.")] = 12 * 3600,
    codex_args: Annotated[
        list[str] | None, typer.Argument(metavar="CODEX_ARGS", help="Passed to codex unchanged.")
    ] = None,
) -> None:
    """Run the installed Codex CLI against a Synth model, interactive or `exec`, with its own
    tools, approvals and sandbox.

    Asks the server for a short-lived credential scoped to that model (never hands over
    your API token), checks that the model proxy the server names answers (its TCP
    listener; $SYNTH_PROXY_URL overrides the address), and writes a private CODEX_HOME
    (${SYNTH_CONFIG_DIR:-~/.config/synth}/codex) whose config.toml names the proxy as a
    Responses provider, the route as the model and the variable holding the credential.
    The codex binary: $SYNTH_CODEX_BIN, else `codex` on PATH, else node_modules/.bin/codex
    of the current directory.

    Example: synth codex --model qwen3-8b -- exec "fix the failing test"
    """
    import os
    import shutil

    from synth_cli.codex_session import CREDENTIAL_ENV, session_home_write

    with api_open() as api:
        issued = api.post("/api/model-credentials", json={"model": model or "qwen3-8b", "ttl_sec": ttl})
    binary = codex_bin() or shutil.which("codex")
    if not binary and Path("node_modules/.bin/codex").exists():
        binary = str(Path("node_modules/.bin/codex").resolve())
    if not binary:
        raise CliError("Codex is not installed: npm install @openai/codex (or set SYNTH_CODEX_BIN)")
    base_url = proxy_url() or url_normalize(issued["base_url"])
    _proxy_check(base_url)
    home = session_home_write(base_url=base_url, route=issued["route"])
    # Neither the operator's API token nor an OpenAI key or endpoint reaches Codex.
    dropped = ("SYNTH_TOKEN", "OPENAI_API_KEY", "OPENAI_BASE_URL", "CODEX_API_KEY")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update({"CODEX_HOME": str(home), CREDENTIAL_ENV: issued["credential"]})
    # Replace this process: signals, the terminal and the exit code belong to Codex.
    os.execvpe(binary, [binary, *(codex_args or [])], env)


def _proxy_check(base_url: str) -> None:
    """Fail now, with the address, when the model proxy does not answer: Claude Code and
    Codex would retry for minutes before saying why."""
    import httpx

    from synth_cli.http import transport_reason

    try:
        response = httpx.get(f"{base_url}/healthz", timeout=10.0)
    except httpx.HTTPError as exc:
        raise CliError(
            f"the model proxy at {base_url} is not reachable ({transport_reason(exc)}); "
            "the server names it with SYNTH_PROXY_PUBLIC_URL, SYNTH_PROXY_URL overrides it here"
        ) from None
    if response.status_code != 200:
        raise CliError(f"the model proxy at {base_url} answered GET /healthz with {response.status_code}")


def main() -> None:
    try:
        app(prog_name="synth")
    except BrokenPipeError:
        # Raised outside a command (click's own output, a final flush): as quiet as inside.
        stdout_discard()
    finally:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            stdout_discard()


if __name__ == "__main__":
    main()

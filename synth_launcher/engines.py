"""The engine registry: every engine a recipe may name and what the platform knows about it.

One :class:`Engine` per name in :data:`ENGINES`. The recipe schema takes the names (and
which of them need a model, which take a ``command``) from here; the launcher takes the
argv builder, the transcript and the platform's own flags; RecipeAgent takes how the engine
runs, where its transcript comes from and the files it uploads; the trial host takes
whether it talks to a model at all and which host executable it binds into the sandbox.

* claude-code runs ``claude`` headless (:data:`CLAUDE_CODE_ARGV` + args); its stdout is
  the stream-json transcript. The trial host binds the host's Claude Code executable
  (:data:`CLAUDE_CODE_BINARY`).
* synth-mini runs the built-in minimal agent (``synth_launcher/mini_agent.py``, uploaded by
  RecipeAgent to :data:`SYNTH_MINI_PATH`) with the sandbox's python3:
  ``python3 -I /installed-agent/synth_mini.py --transcript <logs>/synth-mini.jsonl <args> --
  <instruction>`` (``--instruction-file <path>`` instead for ``file:`` delivery, nothing
  for stdin); it writes its own transcript.
* codex runs the Codex CLI headless (:data:`CODEX_ARGV` + args, ``--`` + the instruction);
  its stdout is the ``--json`` JSONL transcript. Its configuration is a ``config.toml`` in
  its own ``CODEX_HOME`` that the launcher writes (:func:`codex_config`): the model bridge
  as a Responses provider, the route as the model, the scoped credential in
  :data:`CODEX_CREDENTIAL_ENV`, no approvals, no sandbox of its own (ours is the boundary),
  nothing that reaches another host. The trial host binds the host's Codex executable
  (:data:`CODEX_BINARY`).
* command runs the recipe's ``command`` + args; it may use a model the recipe binds.
* oracle is Harbor's oracle (the task's ``solution/solve.sh``); nop does nothing. Neither
  takes an instruction or talks to a model: a model binding in their recipe is ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from synth_launcher.plan import CREDENTIAL_MARKER, TRIAL_HEADER, LaunchError, ModelBinding, PlanFile

# required: a recipe must bind a model, and a launch needs the binding and the credential.
# optional: a bound model is routed like any other (the platform's variables, the bridge).
# ignored: the engine never talks to a model; a binding gets it nothing.
ModelUse = Literal["required", "optional", "ignored"]
# argv: RecipeAgent runs the plan's argv; oracle: Harbor's OracleAgent runs the task's
# solution; nothing: the attempt does nothing at all.
Runner = Literal["argv", "oracle", "nothing"]

# Claude Code headless, as the platform always runs it: no prompts (nobody can answer
# one in a sandbox), the stream-json transcript on stdout (--verbose is required by
# stream-json with --print). The model comes from ANTHROPIC_MODEL, not a flag.
CLAUDE_CODE_ARGV = (
    "claude",
    "--print",
    "--output-format",
    "stream-json",
    "--verbose",
    "--permission-mode",
    "bypassPermissions",
)
# The built-in minimal agent (standard library only): RecipeAgent uploads it here during
# setup and the sandbox's own python3 runs it, isolated (-I: no PYTHONPATH, no user site,
# so nothing of the task's can shadow the standard library).
# Codex headless, as the platform always runs it: `codex exec` with the JSONL transcript on
# stdout, outside a git repository if need be (a task's workdir often is none), no colour
# codes in its log. Approvals, sandboxing and the model come from its config.toml.
CODEX_ARGV = ("codex", "exec", "--json", "--skip-git-repo-check", "--color", "never")
# The provider entry of the config, and the variable that holds the attempt's credential
# (Codex sends it as the bearer token; the config names the variable, never the value).
CODEX_PROVIDER = "synth"
CODEX_CREDENTIAL_ENV = "SYNTH_MODEL_CREDENTIAL"
# CODEX_HOME holds config.toml and what Codex writes itself (its SQLite state, bundled
# skills, session files): outside the logs, which are collected whole as artifacts, and
# outside /tmp, where Codex refuses to create its helper aliases. One per logs directory,
# so that an actor's and a judge's never mix.
CODEX_HOME_ROOT = "/installed-agent/codex-home"
SYNTH_MINI_SOURCE = Path(__file__).with_name("mini_agent.py")
SYNTH_MINI_PATH = "/installed-agent/synth_mini.py"
SYNTH_MINI_ARGV = ("python3", "-I", SYNTH_MINI_PATH)
ORACLE_SOLVE_PATH = "/solution/solve.sh"


@dataclass(frozen=True)
class ArgvRequest:
    """What an argv builder gets: the recipe's parts with their bindings substituted, and
    how the instruction arrives. The launcher appends the instruction itself when ``via``
    is "argument"."""

    args: tuple[str, ...]
    via: str  # argument | stdin | file | none
    instruction_path: str | None = None
    transcript_path: str | None = None
    command: tuple[str, ...] = ()  # the recipe's command (engines with recipe_command only)


@dataclass(frozen=True)
class Upload:
    """A file of this package that RecipeAgent uploads into the sandbox during setup; its
    sha256 is recorded in the agent's metadata as ``<name>_sha256``."""

    name: str
    source: Path
    target: str
    mode: str = "0755"


@dataclass(frozen=True)
class HostBinary:
    """An executable of the trials host that the trial host binds read-only into the sandbox,
    with the directory of ``target`` first on PATH. ``setting`` names the Django setting
    with its host path; ``label`` and ``install`` are for the messages when it is missing."""

    name: str
    target: str
    setting: str
    label: str
    install: str


# Not under /opt or /usr: those are read-only binds of the host's directories, so no mount
# point can be made in them; the sandbox root is a tmpfs where bubblewrap creates it.
CLAUDE_CODE_BINARY = HostBinary(
    name="claude",
    target="/synth/bin/claude",
    setting="SYNTH_CLAUDE_CODE_BIN",
    label="Claude Code",
    install="npm install @anthropic-ai/claude-code",
)
CODEX_BINARY = HostBinary(
    name="codex",
    target="/synth/bin/codex",
    setting="SYNTH_CODEX_SANDBOX_BIN",
    label="Codex",
    install="npm install @openai/codex",
)
# Every harness executable the platform binds: all that are installed go into the sandbox
# of an engine that uses a model (a command recipe may run any of them), the engine's own
# is required.
HOST_BINARIES = (CLAUDE_CODE_BINARY, CODEX_BINARY)


@dataclass(frozen=True)
class HarnessRequest:
    """What an engine's own environment and configuration files are made from: the bound
    model, the attempt, where the launch's logs go and whether a credential is bound."""

    model: ModelBinding
    trial_id: str
    logs_dir: str
    credential: bool


@dataclass(frozen=True)
class Engine:
    name: str
    model: ModelUse
    runner: Runner
    argv: Callable[[ArgvRequest], list[str]]
    takes_instruction: bool = True
    recipe_command: bool = False  # the recipe gives the argv ("command"); required, and only here
    transcript: str | None = None  # its file name in the launch's logs directory
    transcript_is_stdout: bool = False  # else the engine writes the transcript itself
    # Flags the argv builder sets, which the recipe's args may not: (flag, why).
    platform_args: tuple[tuple[str, str], ...] = ()
    uploads: tuple[Upload, ...] = ()
    # Without it the engine cannot run (a model-using engine gets it bound when available).
    host_binary: HostBinary | None = None
    # With a model bound: the engine's own variables (beyond the platform's routing set)
    # and the configuration files the launcher writes for it. Names and paths it returns
    # are the platform's; a recipe may not set them.
    harness_env: Callable[[HarnessRequest], dict[str, str]] | None = None
    harness_files: Callable[[HarnessRequest], tuple[PlanFile, ...]] | None = None

    @property
    def needs_model(self) -> bool:
        return self.model == "required"

    @property
    def uses_model(self) -> bool:
        return self.model != "ignored"


def _claude_code_argv(request: ArgvRequest) -> list[str]:
    return [*CLAUDE_CODE_ARGV, *request.args]


_SYNTH_MINI_FLAGS = (
    ("--transcript", "the platform keeps synth-mini's transcript where it collects artifacts"),
    ("--instruction-file", "the platform delivers the instruction as the recipe's instruction.via says"),
    ("--", "the platform places the instruction after --"),
)


def _synth_mini_argv(request: ArgvRequest) -> list[str]:
    for i, arg in enumerate(request.args):
        if any(arg == flag or arg.startswith(flag + "=") for flag, _ in _SYNTH_MINI_FLAGS):
            raise LaunchError(f"args[{i}] ({arg!r}) is set by the platform for engine synth-mini", field=f"args[{i}]")
    argv = [*SYNTH_MINI_ARGV, "--transcript", str(request.transcript_path), *request.args]
    if request.via == "file":
        argv += ["--instruction-file", str(request.instruction_path)]
    elif request.via == "argument":
        argv.append("--")  # ends the options, so an instruction may start with "-"
    return argv


_CODEX_FLAGS = (
    ("--json", "the platform keeps Codex's JSONL transcript (its stdout)"),
    ("--experimental-json", "the platform keeps Codex's JSONL transcript (its stdout)"),
    ("--color", "the platform keeps Codex's log free of colour codes"),
    ("--skip-git-repo-check", "the platform runs Codex whether or not the workdir is a git repository"),
)


def _codex_argv(request: ArgvRequest) -> list[str]:
    argv = [*CODEX_ARGV, *request.args]
    if request.via == "argument":
        argv.append("--")  # ends the options, so an instruction may start with "-"
    return argv


def codex_home(*, logs_dir: str) -> str:
    """The attempt's CODEX_HOME for a launch whose logs go to ``logs_dir``."""
    return CODEX_HOME_ROOT + logs_dir


def _toml(value: str) -> str:
    # A TOML basic string: JSON's escapes (\", \\, \uXXXX, \n ...) are TOML's too.
    return json.dumps(value)


def codex_config(*, request: HarnessRequest) -> str:
    """The ``config.toml`` of one attempt's Codex (see the module docstring)."""
    model = request.model
    lines = [
        "# Written by the Synth launcher for this attempt; a recipe cannot change it.",
        f"model = {_toml(model.name)}",
        f"model_provider = {_toml(CODEX_PROVIDER)}",
        # Nobody can answer an approval prompt in a sandbox, and the sandbox is the
        # boundary: Codex's own (Landlock/seccomp) would only get in the way.
        'approval_policy = "never"',
        'sandbox_mode = "danger-full-access"',
        # Nothing but model calls leaves Codex: no update check, no hosted web search (the
        # proxy runs no tools), no telemetry or feedback uploads, no plugin marketplace
        # sync (which contacts github.com and chatgpt.com: tests/fixtures/codex/README.md).
        "check_for_update_on_startup = false",
        'web_search = "disabled"',
        # A served model has no reasoning summaries to give; its reasoning text is shown
        # as it is (and kept in the transcript).
        'model_reasoning_summary = "none"',
        "show_raw_agent_reasoning = true",
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[feedback]",
        "enabled = false",
        "",
        "[features]",
        "plugins = false",
        "",
        f"[model_providers.{CODEX_PROVIDER}]",
        'name = "Synth"',
        f"base_url = {_toml(model.base_url.rstrip('/') + '/v1')}",
        'wire_api = "responses"',
        f"env_key = {_toml(CODEX_CREDENTIAL_ENV)}",
        # Every model call carries the correlation header, as Claude Code's do.
        f"http_headers = {{ {_toml(TRIAL_HEADER)} = {_toml(request.trial_id)} }}",
    ]
    return "\n".join(lines) + "\n"


def _codex_env(request: HarnessRequest) -> dict[str, str]:
    env = {"CODEX_HOME": codex_home(logs_dir=request.logs_dir)}
    if request.credential:
        env[CODEX_CREDENTIAL_ENV] = CREDENTIAL_MARKER
    return env


def _codex_files(request: HarnessRequest) -> tuple[PlanFile, ...]:
    path = f"{codex_home(logs_dir=request.logs_dir)}/config.toml"
    return (PlanFile(path=path, content=codex_config(request=request), mode="0644"),)


def _command_argv(request: ArgvRequest) -> list[str]:
    return [*request.command, *request.args]


def _oracle_argv(request: ArgvRequest) -> list[str]:
    return [ORACLE_SOLVE_PATH]  # informational: Harbor's oracle runs it


def _nop_argv(request: ArgvRequest) -> list[str]:
    return []


_REGISTRY = (
    Engine(
        name="claude-code",
        model="required",
        runner="argv",
        argv=_claude_code_argv,
        transcript="claude-code.jsonl",
        transcript_is_stdout=True,
        host_binary=CLAUDE_CODE_BINARY,
    ),
    Engine(
        name="codex",
        model="required",
        runner="argv",
        argv=_codex_argv,
        transcript="codex.jsonl",
        transcript_is_stdout=True,
        platform_args=_CODEX_FLAGS,
        host_binary=CODEX_BINARY,
        harness_env=_codex_env,
        harness_files=_codex_files,
    ),
    Engine(name="command", model="optional", runner="argv", argv=_command_argv, recipe_command=True),
    Engine(
        name="synth-mini",
        model="required",
        runner="argv",
        argv=_synth_mini_argv,
        transcript="synth-mini.jsonl",
        platform_args=_SYNTH_MINI_FLAGS,
        uploads=(Upload(name="synth_mini", source=SYNTH_MINI_SOURCE, target=SYNTH_MINI_PATH),),
    ),
    Engine(name="oracle", model="ignored", runner="oracle", argv=_oracle_argv, takes_instruction=False),
    Engine(name="nop", model="ignored", runner="nothing", argv=_nop_argv, takes_instruction=False),
)
ENGINES: dict[str, Engine] = {engine.name: engine for engine in _REGISTRY}


def engine_get(name: str) -> Engine:
    """The engine called ``name``, or LaunchError (field ``engine.name``)."""
    engine = ENGINES.get(name)
    if engine is None:
        raise LaunchError(f"unknown engine {name!r}", field="engine.name")
    return engine

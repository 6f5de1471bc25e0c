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
* command runs the recipe's ``command`` + args; it may use a model the recipe binds.
* oracle is Harbor's oracle (the task's ``solution/solve.sh``); nop does nothing. Neither
  takes an instruction or talks to a model: a model binding in their recipe is ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from synth_launcher.plan import LaunchError

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
    with the directory of ``target`` first on PATH."""

    name: str
    target: str


# Not under /opt or /usr: those are read-only binds of the host's directories, so no mount
# point can be made in them; the sandbox root is a tmpfs where bubblewrap creates it.
CLAUDE_CODE_BINARY = HostBinary(name="claude", target="/synth/bin/claude")


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

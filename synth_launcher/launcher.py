"""The one recipe interpreter: a pinned recipe + this attempt's bindings -> a launch plan.

Every way of running an agent (the trials worker through Harbor, ``synth agent run``
locally) goes through :func:`launch_plan_build`, so a recipe means the same thing
everywhere. The plan is data: which files to write, which setup commands to run,
the working directory, the exact argv and environment of the engine, how the
instruction reaches it, which outputs are required and the deadlines. Executing it
is someone else's job (``synth_launcher.harbor_agent.RecipeAgent`` inside a Harbor trial).

Bindings. ``${task.<key>}``, ``${run.<key>}``, ``${attempt.<key>}`` and
``${model.<key>}`` are substituted in ``workdir``, ``args``, ``env`` values, ``setup``,
``command``, ``outputs`` and an ``instruction.via`` file path (see
:data:`BINDING_KEYS` for the keys); ``${credential}`` only in ``env`` values. Any
other ``${NAME}`` / ``${NAME:-default}`` is left for the shell. File contents are
written verbatim. An unknown binding, or one with no value for this launch, is a
:class:`LaunchError` naming the field.

The credential. The scoped per-attempt model credential is kept out of everything
that is stored or logged: the plan's ``env`` holds the literal marker
``${credential}`` where it goes, :meth:`LaunchPlan.to_dict` never contains it, and
only :meth:`LaunchPlan.exec_env` (called at the moment of launch) puts it in.

Platform variables. The launcher adds its own variables, which a recipe may never
set (a recipe that does is a LaunchError, and the platform value would win anyway):
``SYNTH_TRIAL_ID`` always, and when a model is bound the whole Claude Code routing
set (``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY`` = the credential, the model name in
``ANTHROPIC_MODEL`` and every alias/subagent variable, a correlation header in
``ANTHROPIC_CUSTOM_HEADERS``, ``IS_SANDBOX=1``, no nonessential traffic, no
autoupdater, ``CLAUDE_CONFIG_DIR`` under /logs/agent). They are given to every
engine that has a model, not only claude-code, so a ``command`` recipe that runs an
Anthropic client or wraps ``claude`` itself is routed through the proxy the same way.

Engines. claude-code runs ``claude`` headless (:data:`CLAUDE_CODE_ARGV` + args; its stdout
is the stream-json transcript). synth-mini runs the built-in minimal agent
(``synth_launcher/mini_agent.py``, uploaded by RecipeAgent to :data:`SYNTH_MINI_PATH`) with
the sandbox's python3: ``python3 -I /installed-agent/synth_mini.py --transcript
/logs/agent/synth-mini.jsonl <args> -- <instruction>`` (``--instruction-file <path>``
instead for ``file:`` delivery, nothing for stdin); it gets the same platform variables
as claude-code and writes its own transcript. command runs the recipe's argv; oracle
and nop take no instruction.

Pure Python: no Django models. The recipe is checked with
``apps.profiles.schema.recipe_validate`` first (imported lazily; that module needs
Django settings to be configured because its error type comes from the API layer).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from synth_common.canonical import canonical_digest
from synth_sandbox.sandbox import container_dir_problem

PLAN_FORMAT = "synth.launch-plan/1"
CREDENTIAL_MARKER = "${credential}"
AGENT_LOGS_DIR = "/logs/agent"
ARTIFACT_OUTPUTS_DIR = "/logs/artifacts/outputs"
ORACLE_SOLVE_PATH = "/solution/solve.sh"
DEFAULT_SETUP_TIMEOUT_SEC = 600.0
# The correlation header Claude Code adds to every model call (ANTHROPIC_CUSTOM_HEADERS),
# so the proxy can attribute a call to its trial even before it checks the credential.
TRIAL_HEADER = "x-synth-trial"

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
# The built-in minimal agent (synth_launcher/mini_agent.py, standard library only): RecipeAgent
# uploads it here during setup and the sandbox's own python3 runs it, isolated (-I: no
# PYTHONPATH, no user site, so nothing of the task's can shadow the standard library).
SYNTH_MINI_PATH = "/installed-agent/synth_mini.py"
SYNTH_MINI_ARGV = ("python3", "-I", SYNTH_MINI_PATH)
# Flags of synth-mini the platform sets: where the transcript it reads goes, and how the
# instruction arrives ("--" ends the options, so an instruction may start with "-").
SYNTH_MINI_RESERVED_ARGS = ("--transcript", "--instruction-file", "--")
ENGINES = ("claude-code", "command", "oracle", "nop", "synth-mini")
MODEL_ENGINES = ("claude-code", "synth-mini")  # driven by a model: a binding and a credential are required

BINDING_KEYS: dict[str, tuple[str, ...]] = {
    "task": ("name", "workdir", "instruction", "agent_timeout_sec", "id", "digest"),
    "run": ("id", "kind"),
    "attempt": ("trial_id", "index", "group_id"),
    "model": ("name", "base_url", "route", "checkpoint"),
}


class LaunchError(ValueError):
    """A recipe cannot be launched with these bindings; ``field`` names where (a recipe
    JSON path such as ``env.FOO`` / ``outputs[0]``, or ``bindings.<part>``)."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


# ---------------------------------------------------------------- bindings


@dataclass(frozen=True)
class TaskBinding:
    name: str
    workdir: str  # absolute, inside the sandbox, e.g. /app
    instruction: str  # as Harbor presents it (Task(task_dir).instruction: canary lines stripped)
    agent_timeout_sec: float | None = None  # the task's own [agent].timeout_sec
    id: str | None = None  # task version id (tv_...)
    digest: str | None = None


@dataclass(frozen=True)
class RunBinding:
    id: str
    kind: str  # evaluate | train | execute


@dataclass(frozen=True)
class AttemptBinding:
    trial_id: str  # the correlation id carried into every model call
    index: int
    group_id: str | None = None


@dataclass(frozen=True)
class ModelBinding:
    name: str  # the effective model name the harness asks for (ANTHROPIC_MODEL)
    base_url: str  # the model bridge as seen INSIDE the sandbox, e.g. http://127.0.0.1:8377
    route: str | None = None
    checkpoint: str | None = None


@dataclass(frozen=True)
class Bindings:
    """Everything about this attempt that a recipe may refer to or that the platform injects."""

    task: TaskBinding
    run: RunBinding
    attempt: AttemptBinding
    model: ModelBinding | None = None
    credential: str | None = None  # scoped to (org, run, attempt, model snapshot, expiry)
    # Where the sandbox's bridge forwards model traffic to (the capture proxy as seen from
    # the host: a URL or a unix socket path). Carried in the plan for the environment; the
    # agent never sees it.
    proxy_address: str | None = None


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True)
class PlanFile:
    path: str  # absolute
    content: str
    mode: str  # octal string, "0644"

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "content": self.content, "mode": self.mode}


@dataclass(frozen=True)
class LaunchPlan:
    """What to do in the sandbox for one attempt. Shape of :meth:`to_dict`::

        {"format": "synth.launch-plan/1", "engine": "claude-code", "engine_version": "2.1",
         "correlation_id": "<trial id>", "workdir": "/app",
         "files": [{"path": "/app/CLAUDE.md", "content": "...", "mode": "0644"}],
         "setup": ["..."], "setup_timeout_sec": 600.0,
         "argv": ["claude", "--print", ..., "<instruction when via argument>"],
         "env": {"ANTHROPIC_API_KEY": "${credential}", ...},
         "instruction": {"via": "argument|stdin|file|none", "path": null, "text": "..."},
         "outputs": ["/app/out.txt"], "timeout_sec": 1800.0, "max_model_calls": null,
         "fail_on_nonzero_exit": false,
         "log_path": "/logs/agent/claude-code.txt", "transcript_path": "/logs/agent/claude-code.jsonl",
         "model": {"name": ..., "base_url": ..., "route": ..., "checkpoint": ...} | null,
         "proxy_address": null}

    ``via`` "none" is for oracle and nop, which take no instruction. ``argv`` is empty
    for nop and ``["/solution/solve.sh"]`` (informational; Harbor's oracle runs it) for
    oracle. The credential is never part of it.
    """

    engine: str
    engine_version: str
    correlation_id: str
    workdir: str
    files: tuple[PlanFile, ...]
    setup: tuple[str, ...]
    setup_timeout_sec: float
    argv: tuple[str, ...]
    env: Mapping[str, str]
    instruction_via: str
    instruction_path: str | None
    instruction: str
    outputs: tuple[str, ...]
    timeout_sec: float
    max_model_calls: int | None
    fail_on_nonzero_exit: bool
    log_path: str
    transcript_path: str | None
    model: Mapping[str, str | None] | None
    proxy_address: str | None
    # Where the launch's own files go: the agent's logs, or a judge's under the verifier's.
    logs_dir: str = AGENT_LOGS_DIR
    # Not serialised, not compared, not printed: only exec_env() uses it.
    credential: str | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready and credential-free: safe to store as an artifact or pass as Harbor agent kwargs."""
        return {
            "format": PLAN_FORMAT,
            "engine": self.engine,
            "engine_version": self.engine_version,
            "correlation_id": self.correlation_id,
            "workdir": self.workdir,
            "files": [f.to_dict() for f in self.files],
            "setup": list(self.setup),
            "setup_timeout_sec": self.setup_timeout_sec,
            "argv": list(self.argv),
            "env": dict(sorted(self.env.items())),
            "instruction": {"via": self.instruction_via, "path": self.instruction_path, "text": self.instruction},
            "outputs": list(self.outputs),
            "timeout_sec": self.timeout_sec,
            "max_model_calls": self.max_model_calls,
            "fail_on_nonzero_exit": self.fail_on_nonzero_exit,
            "log_path": self.log_path,
            "transcript_path": self.transcript_path,
            "model": dict(self.model) if self.model is not None else None,
            "proxy_address": self.proxy_address,
            # Only when not the default, so that the plans (and digests) of agents stay as they were.
            **({"logs_dir": self.logs_dir} if self.logs_dir != AGENT_LOGS_DIR else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, credential: str | None = None) -> LaunchPlan:
        """Inverse of :meth:`to_dict`; ``credential`` is supplied separately because it is never stored."""
        if data.get("format") != PLAN_FORMAT:
            raise LaunchError(f"not a launch plan of format {PLAN_FORMAT!r}: {data.get('format')!r}", field="format")
        try:
            instruction = data["instruction"]
            return cls(
                engine=data["engine"],
                engine_version=data["engine_version"],
                correlation_id=data["correlation_id"],
                workdir=data["workdir"],
                files=tuple(PlanFile(path=f["path"], content=f["content"], mode=f["mode"]) for f in data["files"]),
                setup=tuple(data["setup"]),
                setup_timeout_sec=float(data["setup_timeout_sec"]),
                argv=tuple(data["argv"]),
                env=dict(data["env"]),
                instruction_via=instruction["via"],
                instruction_path=instruction["path"],
                instruction=instruction["text"],
                outputs=tuple(data["outputs"]),
                timeout_sec=float(data["timeout_sec"]),
                max_model_calls=data["max_model_calls"],
                fail_on_nonzero_exit=bool(data["fail_on_nonzero_exit"]),
                log_path=data["log_path"],
                transcript_path=data["transcript_path"],
                model=dict(data["model"]) if data["model"] is not None else None,
                proxy_address=data["proxy_address"],
                logs_dir=data.get("logs_dir", AGENT_LOGS_DIR),
                credential=credential,
            )
        except (KeyError, TypeError) as exc:
            raise LaunchError(f"launch plan is missing or mistypes {exc}", field=str(exc)) from None

    def digest(self) -> str:
        """sha256 of the canonical JSON of :meth:`to_dict` (stable: same inputs, same digest)."""
        return canonical_digest(self.to_dict())

    @property
    def needs_credential(self) -> bool:
        return any(CREDENTIAL_MARKER in value for value in self.env.values())

    def exec_env(self) -> dict[str, str]:
        """The environment to launch with: the plan's env with the credential put in."""
        if not self.needs_credential:
            return dict(self.env)
        if not self.credential:
            raise LaunchError(
                "the plan's env needs the scoped model credential, but none was supplied "
                "(LaunchPlan.from_dict(..., credential=...))",
                field="bindings.credential",
            )
        return {key: value.replace(CREDENTIAL_MARKER, self.credential) for key, value in self.env.items()}

    def redact(self, text: str) -> str:
        """``text`` with the credential (if any) masked: for anything that is logged or stored."""
        return text.replace(self.credential, "***") if self.credential else text


# ---------------------------------------------------------------- building


_BINDING = re.compile(r"\$\{([^}]*)\}")
_NAMESPACED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\.(.*)$")
# visible ASCII, no spaces: safe in a header and a URL. Used with fullmatch: "$" would
# also match before a trailing newline, which is exactly what must not get through.
_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")


def _binding_values(bindings: Bindings) -> dict[str, dict[str, str | None]]:
    def text(value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():
            return str(int(value))  # 600.0 -> "600": what a shell script or flag expects
        return str(value)

    model = bindings.model
    return {
        "task": {key: text(getattr(bindings.task, key)) for key in BINDING_KEYS["task"]},
        "run": {key: text(getattr(bindings.run, key)) for key in BINDING_KEYS["run"]},
        "attempt": {key: text(getattr(bindings.attempt, key)) for key in BINDING_KEYS["attempt"]},
        "model": {key: (text(getattr(model, key)) if model else None) for key in BINDING_KEYS["model"]},
    }


def _substitute(*, value: str, field: str, values: dict[str, dict[str, str | None]], in_env: bool) -> str:
    """Replace ``${ns.key}`` bindings in ``value``; ``${credential}`` stays as the marker (env only)."""

    def replace(match: re.Match[str]) -> str:
        inner = match.group(1)
        if inner == "credential":
            if not in_env:
                raise LaunchError(
                    f"{field}: ${{credential}} may only be used in env values (argv and files are visible "
                    "in process listings and transcripts)",
                    field=field,
                )
            return CREDENTIAL_MARKER
        namespaced = _NAMESPACED.match(inner)
        if namespaced is None:
            return match.group(0)  # ${HOME}, ${VAR:-default}: the shell's, not ours
        namespace, key = namespaced.groups()
        if key not in values.get(namespace, {}):
            known = ", ".join(f"${{{ns}.{k}}}" for ns, keys in BINDING_KEYS.items() for k in keys)
            raise LaunchError(
                f"{field}: unknown binding {match.group(0)} (known: {known}, ${{credential}})", field=field
            )
        bound = values[namespace][key]
        if bound is None:
            raise LaunchError(f"{field}: binding {match.group(0)} has no value for this launch", field=field)
        if in_env and CREDENTIAL_MARKER in bound:
            # The marker is how the credential is placed at launch; a bound value that
            # contains it literally would receive the credential where nobody put it.
            raise LaunchError(f"{field}: the value of {match.group(0)} contains {CREDENTIAL_MARKER}", field=field)
        return bound

    return _BINDING.sub(replace, value)


def _has_dotdot(path: str) -> bool:
    return ".." in path.split("/")


def _absolute(*, path: str, workdir: str, field: str, inside_workdir: bool) -> str:
    """``path`` resolved against ``workdir``; a '..' segment (even one a binding brought in) is an error."""
    if not path or "\x00" in path:
        raise LaunchError(f"{field}: {path!r} is not a path", field=field)
    if _has_dotdot(path):
        raise LaunchError(f"{field}: {path!r} may not contain a '..' segment", field=field)
    if inside_workdir and path.startswith("/"):
        raise LaunchError(f"{field}: {path!r} must be relative to the working directory", field=field)
    resolved = posixpath.normpath(posixpath.join(workdir, path))
    if inside_workdir and not (resolved + "/").startswith(workdir.rstrip("/") + "/"):
        raise LaunchError(f"{field}: {path!r} resolves outside the working directory", field=field)
    if resolved == workdir and not path.startswith("/"):
        raise LaunchError(f"{field}: {path!r} is the working directory itself, not a file in it", field=field)
    return resolved


def _bindings_check(bindings: Bindings) -> None:
    task, run, attempt = bindings.task, bindings.run, bindings.attempt
    if not task.name:
        raise LaunchError("the task name is empty", field="bindings.task.name")
    if not task.workdir.startswith("/") or _has_dotdot(task.workdir):
        raise LaunchError(
            f"the task workdir must be an absolute path without '..': {task.workdir!r}", field="bindings.task.workdir"
        )
    if task.agent_timeout_sec is not None and not task.agent_timeout_sec > 0:
        raise LaunchError("the task's agent timeout must be positive", field="bindings.task.agent_timeout_sec")
    if not run.id:
        raise LaunchError("the run id is empty", field="bindings.run.id")
    # The trial id goes into an HTTP header and env; a newline would forge headers.
    if not _HEADER_SAFE.fullmatch(attempt.trial_id or ""):
        raise LaunchError(
            f"the trial id must be non-empty visible ASCII: {attempt.trial_id!r}", field="bindings.attempt.trial_id"
        )
    if attempt.index < 0:
        raise LaunchError("the attempt index must be >= 0", field="bindings.attempt.index")
    model = bindings.model
    if model is not None:
        if not _HEADER_SAFE.fullmatch(model.name or ""):
            raise LaunchError(
                f"the model name must be non-empty visible ASCII: {model.name!r}", field="bindings.model.name"
            )
        if not re.fullmatch(r"https?://[\x21-\x7e]+", model.base_url or ""):
            raise LaunchError(
                f"the model base_url must be an http(s) URL (the bridge inside the sandbox): {model.base_url!r}",
                field="bindings.model.base_url",
            )
    if bindings.credential is not None and not _HEADER_SAFE.fullmatch(bindings.credential):
        # Never echo the value: it is a secret.
        raise LaunchError("the credential must be non-empty visible ASCII", field="bindings.credential")


def _platform_env(*, engine: str, bindings: Bindings, logs_dir: str) -> dict[str, str]:
    env = {"SYNTH_TRIAL_ID": bindings.attempt.trial_id}
    model = bindings.model
    if model is None or engine in ("oracle", "nop"):
        return env
    env.update(
        {
            "ANTHROPIC_BASE_URL": model.base_url,
            "ANTHROPIC_MODEL": model.name,
            # Every alias and the subagent model resolve to the same snapshot, so an
            # attempt's calls are one policy's and the proxy never sees "claude-haiku-...".
            "ANTHROPIC_DEFAULT_SONNET_MODEL": model.name,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": model.name,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model.name,
            "ANTHROPIC_DEFAULT_FABLE_MODEL": model.name,
            "ANTHROPIC_SMALL_FAST_MODEL": model.name,
            "CLAUDE_CODE_SUBAGENT_MODEL": model.name,
            # Claude Code sends these on every model call (research: anthropic-proxy.md §2).
            "ANTHROPIC_CUSTOM_HEADERS": f"{TRIAL_HEADER}: {bindings.attempt.trial_id}",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            # As root, bypassPermissions is refused unless IS_SANDBOX=1 (claude-code-observed.md).
            "IS_SANDBOX": "1",
            # Session files land with the agent's logs, which the trial collects.
            "CLAUDE_CONFIG_DIR": f"{logs_dir}/sessions",
        }
    )
    if bindings.credential is not None:
        env["ANTHROPIC_API_KEY"] = CREDENTIAL_MARKER
    return env


def _recipe_validate(recipe: Any) -> None:
    # Lazy: apps.profiles.schema imports the API error types, which need Django settings.
    from apps.core.errors import ValidationFailed
    from apps.profiles.schema import recipe_validate

    try:
        recipe_validate(recipe=recipe)
    except ValidationFailed as exc:
        raise LaunchError(exc.message, field=exc.field) from None


def launch_plan_build(*, recipe: dict[str, Any], bindings: Bindings, logs_dir: str = AGENT_LOGS_DIR) -> LaunchPlan:
    """Interpret ``recipe`` (a validated agent recipe) for one attempt; raise LaunchError naming the field.

    ``logs_dir`` is where the launch's logs, transcript and bookkeeping files go: the
    agent's logs directory, or for a judge a directory under the verifier's logs.

    Deterministic: the same recipe and bindings give an equal plan (and the same
    ``to_dict()`` and digest), so a stored plan shows exactly what was launched.
    """
    _recipe_validate(recipe)
    return _plan_build(recipe=recipe, bindings=bindings, logs_dir=logs_dir)


def _plan_build(*, recipe: dict[str, Any], bindings: Bindings, logs_dir: str) -> LaunchPlan:
    _bindings_check(bindings)
    engine = recipe["engine"]["name"]
    if engine not in ENGINES:
        raise LaunchError(f"unknown engine {engine!r}", field="engine.name")
    model_driven = engine in MODEL_ENGINES
    if model_driven and bindings.model is None:
        raise LaunchError(f"engine {engine!r} needs a model binding", field="bindings.model")
    if model_driven and not bindings.credential:
        raise LaunchError(f"engine {engine!r} needs the scoped model credential", field="bindings.credential")

    values = _binding_values(bindings)

    workdir = _substitute(value=recipe.get("workdir", "${task.workdir}"), field="workdir", values=values, in_env=False)
    if not workdir.startswith("/") or _has_dotdot(workdir):
        raise LaunchError(f"workdir: {workdir!r} must be an absolute path without '..'", field="workdir")
    workdir = posixpath.normpath(workdir)

    files: list[PlanFile] = []
    for i, spec in enumerate(recipe.get("files", [])):
        path = _absolute(path=spec["path"], workdir=workdir, field=f"files[{i}].path", inside_workdir=True)
        files.append(PlanFile(path=path, content=spec["content"], mode=spec.get("mode", "0644")))

    setup = tuple(
        _substitute(value=cmd, field=f"setup[{i}]", values=values, in_env=False)
        for i, cmd in enumerate(recipe.get("setup", []))
    )
    args = [
        _substitute(value=a, field=f"args[{i}]", values=values, in_env=False)
        for i, a in enumerate(recipe.get("args", []))
    ]

    platform = _platform_env(engine=engine, bindings=bindings, logs_dir=logs_dir)
    env: dict[str, str] = {}
    for name, value in recipe.get("env", {}).items():
        if name in platform or name.upper() in platform:
            raise LaunchError(
                f"env.{name} is set by the platform for this launch; a recipe may not set it", field=f"env.{name}"
            )
        env[name] = _substitute(value=value, field=f"env.{name}", values=values, in_env=True)
    if any(CREDENTIAL_MARKER in value for value in env.values()) and not bindings.credential:
        name = next(n for n, v in env.items() if CREDENTIAL_MARKER in v)
        raise LaunchError(f"env.{name}: binding ${{credential}} has no value for this launch", field=f"env.{name}")
    env.update(platform)  # the platform's value wins (and a clash was refused above)

    # Instruction delivery. oracle and nop take no instruction.
    via_spec = recipe.get("instruction", {}).get("via", "argument")
    instruction_path: str | None = None
    if engine in ("oracle", "nop"):
        via = "none"
    elif via_spec.startswith("file:"):
        via = "file"
        raw = _substitute(value=via_spec[len("file:") :], field="instruction.via", values=values, in_env=False)
        instruction_path = _absolute(path=raw, workdir=workdir, field="instruction.via", inside_workdir=False)
        if any(f.path == instruction_path for f in files):
            raise LaunchError(
                f"instruction.via: {instruction_path!r} is also one of the recipe's files", field="instruction.via"
            )
    else:
        via = via_spec

    transcript_path: str | None = None
    if engine == "claude-code":
        argv = [*CLAUDE_CODE_ARGV, *args]
        transcript_path = f"{logs_dir}/claude-code.jsonl"  # its stdout
    elif engine == "synth-mini":
        for i, arg in enumerate(args):
            if any(arg == flag or arg.startswith(flag + "=") for flag in SYNTH_MINI_RESERVED_ARGS):
                raise LaunchError(
                    f"args[{i}] ({arg!r}) is set by the platform for engine synth-mini", field=f"args[{i}]"
                )
        # It writes its JSONL transcript itself (its stdout is a short summary).
        transcript_path = f"{logs_dir}/synth-mini.jsonl"
        argv = [*SYNTH_MINI_ARGV, "--transcript", transcript_path, *args]
        if via == "file":
            argv += ["--instruction-file", instruction_path]
        elif via == "argument":
            argv.append("--")
    elif engine == "command":
        command = [
            _substitute(value=c, field=f"command[{i}]", values=values, in_env=False)
            for i, c in enumerate(recipe["command"])
        ]
        argv = [*command, *args]
    elif engine == "oracle":
        argv = [ORACLE_SOLVE_PATH]
    else:  # nop
        argv = []
    if via == "argument":
        argv.append(bindings.task.instruction)
    if bindings.credential and any(bindings.credential in part for part in [*argv, *setup]):
        # The schema keeps ${credential} out of argv; this catches a credential that
        # reached argv some other way (e.g. through a task binding).
        raise LaunchError("the credential would appear on a command line", field="bindings.credential")

    outputs: list[str] = []
    for i, raw in enumerate(recipe.get("outputs", [])):
        path = _absolute(
            path=_substitute(value=raw, field=f"outputs[{i}]", values=values, in_env=False),
            workdir=workdir,
            field=f"outputs[{i}]",
            inside_workdir=False,
        )
        if path == "/" or (ARTIFACT_OUTPUTS_DIR + "/").startswith(path + "/"):
            # Outputs are copied into /logs/artifacts/outputs/<path>: a directory that
            # contains that destination would be copied into itself.
            raise LaunchError(f"outputs[{i}]: {path!r} contains the artifacts directory", field=f"outputs[{i}]")
        if path not in outputs:  # "out.txt" and "/app/out.txt" are one output
            outputs.append(path)

    limits = recipe["limits"]
    timeout_sec = float(limits["timeout_sec"])
    if bindings.task.agent_timeout_sec is not None:
        # Neither the task's author nor the recipe's expects its budget to be exceeded;
        # a plan-level timeout_multiplier scales the result at the trial.
        timeout_sec = min(timeout_sec, float(bindings.task.agent_timeout_sec))

    log_name = "oracle" if engine == "oracle" else engine
    model = bindings.model
    return LaunchPlan(
        engine=engine,
        engine_version=recipe["engine"]["version"],  # informational: the installed harness is used
        correlation_id=bindings.attempt.trial_id,
        workdir=workdir,
        files=tuple(files),
        setup=setup,
        setup_timeout_sec=float(limits.get("setup_timeout_sec", DEFAULT_SETUP_TIMEOUT_SEC)),
        argv=tuple(argv),
        env=dict(sorted(env.items())),
        instruction_via=via,
        instruction_path=instruction_path,
        instruction=bindings.task.instruction if via != "none" else "",
        outputs=tuple(outputs),
        timeout_sec=timeout_sec,
        max_model_calls=limits.get("max_model_calls"),
        # Not in the recipe schema yet; until it is, a non-zero exit is recorded, not raised.
        fail_on_nonzero_exit=bool(limits.get("fail_on_nonzero_exit", False)),
        log_path=f"{logs_dir}/{log_name}.txt",
        transcript_path=transcript_path,
        model=(
            {"name": model.name, "base_url": model.base_url, "route": model.route, "checkpoint": model.checkpoint}
            if model is not None
            else None
        ),
        proxy_address=bindings.proxy_address,
        logs_dir=logs_dir,
        credential=bindings.credential,
    )


# ---------------------------------------------------------------- publishing


def _probe_bindings(recipe: dict[str, Any]) -> Bindings:
    """Ordinary bindings for ``recipe`` as the trials worker gives them: a task in /app, and
    the model the recipe names with its credential, except for the model-free engines."""
    model = recipe.get("model") or {}
    with_model = bool(model) and recipe["engine"]["name"] not in ("oracle", "nop")
    return Bindings(
        task=TaskBinding(
            name="probe", workdir="/app", instruction="probe", agent_timeout_sec=600.0, id="tv_probe", digest="0" * 64
        ),
        run=RunBinding(id="run_probe", kind="evaluate"),
        attempt=AttemptBinding(trial_id="trl_probe", index=0, group_id="grp_probe"),
        model=(
            ModelBinding(
                name=model.get("route") or "probe",
                base_url="http://127.0.0.1:18080",
                route=model.get("route") or "probe",
                checkpoint=model.get("checkpoint"),
            )
            if with_model
            else None
        ),
        credential="probe-credential" if with_model else None,
    )


def recipe_launch_check(*, recipe: dict[str, Any]) -> None:
    """Raise LaunchError (naming the field) when a schema-valid ``recipe`` can never launch.

    It is interpreted with ordinary bindings (:func:`_probe_bindings`): what fails there
    (an unknown binding such as ``${task.wrkdir}``, a binding with no value such as
    ``${model.name}`` in a recipe without a model, a relative workdir, an output of ``/``)
    fails for every attempt. So does a workdir or an instruction file in a directory the
    local sandbox provides read-only (``/``, ``/usr``, ``/etc``, ``/proc``, ...). Checked when
    a version is published, rather than found out by each attempt of a run.
    """
    plan = _plan_build(recipe=recipe, bindings=_probe_bindings(recipe), logs_dir=AGENT_LOGS_DIR)
    problem = container_dir_problem(plan.workdir)
    if problem:
        raise LaunchError(f"workdir: {plan.workdir!r} cannot be the working directory: {problem}", field="workdir")
    if plan.instruction_path is not None:
        problem = container_dir_problem(posixpath.dirname(plan.instruction_path))
        if problem:
            raise LaunchError(
                f"instruction.via: {plan.instruction_path!r} cannot be written in the sandbox: {problem}",
                field="instruction.via",
            )

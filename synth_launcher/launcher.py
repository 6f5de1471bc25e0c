"""The one recipe interpreter: a pinned recipe + this attempt's bindings -> a launch plan.

Every way of running an agent (the trials worker through Harbor, ``synth agent run``
locally) goes through :func:`launch_plan_build`, so a recipe means the same thing
everywhere. The plan (synth_launcher.plan) is data: which files to write, which setup
commands to run, the working directory, the exact argv and environment of the engine, how
the instruction reaches it, which outputs are required and the deadlines. Executing it is
someone else's job (``synth_launcher.harbor_agent.RecipeAgent`` inside a Harbor trial).
What each engine runs is the engine registry's (synth_launcher.engines).

Bindings. ``${task.<key>}``, ``${run.<key>}``, ``${attempt.<key>}`` and
``${model.<key>}`` are substituted in ``workdir``, ``args``, ``env`` values, ``setup``,
``command``, ``outputs`` and an ``instruction.via`` file path (see
:data:`BINDING_KEYS` for the keys); ``${credential}`` only in ``env`` values. Any
other ``${NAME}`` / ``${NAME:-default}`` is left for the shell. File contents are
written verbatim. An unknown binding, or one with no value for this launch, is a
:class:`LaunchError` naming the field.

Platform variables. The launcher adds its own variables, which a recipe may never
set (a recipe that does is a LaunchError, and the platform value would win anyway):
``SYNTH_TRIAL_ID`` always, and when a model is bound the whole Claude Code routing
set (``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY`` = the credential, the model name in
``ANTHROPIC_MODEL`` and every alias/subagent variable, a correlation header in
``ANTHROPIC_CUSTOM_HEADERS``, ``IS_SANDBOX=1``, no nonessential traffic, no
autoupdater, ``CLAUDE_CONFIG_DIR`` under /logs/agent). They are given to every
engine that uses a model, not only claude-code, so a ``command`` recipe that runs an
Anthropic client or wraps ``claude`` itself is routed through the proxy the same way.
An engine may add its own (the registry's ``harness_env``: for codex ``CODEX_HOME`` and the
variable its config names for the credential) and configuration files the launcher writes
into the plan (``harness_files``: Codex's ``config.toml``), which a recipe cannot replace.

Pure Python, no Django: the recipe is checked with synth_launcher.recipe first.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any

from synth_launcher.engines import ArgvRequest, Engine, HarnessRequest, engine_get
from synth_launcher.plan import (
    AGENT_LOGS_DIR,
    ARTIFACT_OUTPUTS_DIR,
    BINDING_KEYS,
    CREDENTIAL_MARKER,
    DEFAULT_SETUP_TIMEOUT_SEC,
    PLAN_FORMAT,
    TRIAL_HEADER,
    AttemptBinding,
    Bindings,
    LaunchError,
    LaunchPlan,
    ModelBinding,
    PlanFile,
    RunBinding,
    TaskBinding,
)
from synth_launcher.recipe import recipe_validate
from synth_sandbox.sandbox import container_dir_problem

# The plan's types are the launcher's interface: callers import them from here.
__all__ = [
    "AGENT_LOGS_DIR",
    "ARTIFACT_OUTPUTS_DIR",
    "BINDING_KEYS",
    "CREDENTIAL_MARKER",
    "PLAN_FORMAT",
    "TRIAL_HEADER",
    "AttemptBinding",
    "Bindings",
    "LaunchError",
    "LaunchNeeds",
    "LaunchPlan",
    "ModelBinding",
    "PlanFile",
    "RunBinding",
    "TaskBinding",
    "launch_needs",
    "launch_plan_build",
    "recipe_launch_check",
]


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


def _platform_env(*, engine: Engine, bindings: Bindings, logs_dir: str) -> dict[str, str]:
    env = {"SYNTH_TRIAL_ID": bindings.attempt.trial_id}
    model = bindings.model
    if model is None or not engine.uses_model:
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
            # Claude Code sends these headers on every model call: the proxy attributes
            # the call to its trial by them.
            "ANTHROPIC_CUSTOM_HEADERS": f"{TRIAL_HEADER}: {bindings.attempt.trial_id}",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            # As root, Claude Code refuses bypassPermissions unless IS_SANDBOX=1.
            "IS_SANDBOX": "1",
            # Session files land with the agent's logs, which the trial collects.
            "CLAUDE_CONFIG_DIR": f"{logs_dir}/sessions",
        }
    )
    if bindings.credential is not None:
        env["ANTHROPIC_API_KEY"] = CREDENTIAL_MARKER
    if engine.harness_env is not None:
        env.update(engine.harness_env(_harness_request(bindings=bindings, model=model, logs_dir=logs_dir)))
    return env


def _harness_request(*, bindings: Bindings, model: ModelBinding, logs_dir: str) -> HarnessRequest:
    return HarnessRequest(
        model=model, trial_id=bindings.attempt.trial_id, logs_dir=logs_dir, credential=bindings.credential is not None
    )


def _harness_files(*, engine: Engine, bindings: Bindings, logs_dir: str) -> list[PlanFile]:
    """The configuration files the launcher writes for ``engine`` (Codex's config.toml)."""
    if engine.harness_files is None or bindings.model is None:
        return []
    return list(engine.harness_files(_harness_request(bindings=bindings, model=bindings.model, logs_dir=logs_dir)))


# ---------------------------------------------------------------- what a launch needs


@dataclass(frozen=True)
class LaunchNeeds:
    """What the trial host must provide before a recipe's plan can be built: the engine
    (whether it uses a model, which host executable it binds) and the deadlines a model
    credential must outlive. The plan's own deadlines are these."""

    engine: Engine
    agent_timeout_sec: float  # the recipe's limit, capped by the task's own
    setup_timeout_sec: float  # each setup command's
    setup_commands: int

    @property
    def setup_budget_sec(self) -> float:
        return self.setup_timeout_sec * self.setup_commands


def launch_needs(*, recipe: dict[str, Any], task_agent_timeout_sec: float | None) -> LaunchNeeds:
    """The needs of a schema-valid ``recipe`` on a task whose agent deadline is
    ``task_agent_timeout_sec`` (None: the task sets none); LaunchError for an unknown engine."""
    limits = recipe["limits"]
    timeout_sec = float(limits["timeout_sec"])
    if task_agent_timeout_sec is not None:
        # Neither the task's author nor the recipe's expects its budget to be exceeded;
        # a plan-level timeout_multiplier scales the result at the trial.
        timeout_sec = min(timeout_sec, float(task_agent_timeout_sec))
    return LaunchNeeds(
        engine=engine_get(recipe["engine"]["name"]),
        agent_timeout_sec=timeout_sec,
        setup_timeout_sec=float(limits.get("setup_timeout_sec", DEFAULT_SETUP_TIMEOUT_SEC)),
        setup_commands=len(recipe.get("setup", [])),
    )


# ---------------------------------------------------------------- the plan


def launch_plan_build(*, recipe: dict[str, Any], bindings: Bindings, logs_dir: str = AGENT_LOGS_DIR) -> LaunchPlan:
    """Interpret ``recipe`` (a validated agent recipe) for one attempt; raise LaunchError naming the field.

    ``logs_dir`` is where the launch's logs, transcript and bookkeeping files go: the
    agent's logs directory, or for a judge a directory under the verifier's logs.

    Deterministic: the same recipe and bindings give an equal plan (and the same
    ``to_dict()`` and digest), so a stored plan shows exactly what was launched.
    """
    recipe_validate(recipe=recipe)  # its RecipeInvalid is a LaunchError
    return _plan_build(recipe=recipe, bindings=bindings, logs_dir=logs_dir)


def _plan_build(*, recipe: dict[str, Any], bindings: Bindings, logs_dir: str) -> LaunchPlan:
    _bindings_check(bindings)
    needs = launch_needs(recipe=recipe, task_agent_timeout_sec=bindings.task.agent_timeout_sec)
    engine = needs.engine
    if engine.needs_model and bindings.model is None:
        raise LaunchError(f"engine {engine.name!r} needs a model binding", field="bindings.model")
    if engine.needs_model and not bindings.credential:
        raise LaunchError(f"engine {engine.name!r} needs the scoped model credential", field="bindings.credential")

    values = _binding_values(bindings)

    workdir = _substitute(value=recipe.get("workdir", "${task.workdir}"), field="workdir", values=values, in_env=False)
    if not workdir.startswith("/") or _has_dotdot(workdir):
        raise LaunchError(f"workdir: {workdir!r} must be an absolute path without '..'", field="workdir")
    workdir = posixpath.normpath(workdir)

    files: list[PlanFile] = []
    for i, spec in enumerate(recipe.get("files", [])):
        path = _absolute(path=spec["path"], workdir=workdir, field=f"files[{i}].path", inside_workdir=True)
        files.append(PlanFile(path=path, content=spec["content"], mode=spec.get("mode", "0644")))

    for harness_file in _harness_files(engine=engine, bindings=bindings, logs_dir=logs_dir):
        if any(f.path == harness_file.path for f in files):
            index = next(i for i, f in enumerate(files) if f.path == harness_file.path)
            raise LaunchError(
                f"files[{index}].path: {harness_file.path!r} is written by the platform for engine {engine.name!r}",
                field=f"files[{index}].path",
            )
        files.append(harness_file)

    setup = tuple(
        _substitute(value=cmd, field=f"setup[{i}]", values=values, in_env=False)
        for i, cmd in enumerate(recipe.get("setup", []))
    )
    args = tuple(
        _substitute(value=a, field=f"args[{i}]", values=values, in_env=False)
        for i, a in enumerate(recipe.get("args", []))
    )

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

    # Instruction delivery (oracle and nop take none).
    via_spec = recipe.get("instruction", {}).get("via", "argument")
    instruction_path: str | None = None
    if not engine.takes_instruction:
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

    transcript_path = f"{logs_dir}/{engine.transcript}" if engine.transcript else None
    command = tuple(
        _substitute(value=c, field=f"command[{i}]", values=values, in_env=False)
        for i, c in enumerate(recipe["command"] if engine.recipe_command else ())
    )
    argv = engine.argv(
        ArgvRequest(
            args=args, via=via, instruction_path=instruction_path, transcript_path=transcript_path, command=command
        )
    )
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
    model = bindings.model
    return LaunchPlan(
        engine=engine.name,
        engine_version=recipe["engine"]["version"],  # informational: the installed harness is used
        correlation_id=bindings.attempt.trial_id,
        workdir=workdir,
        files=tuple(files),
        setup=setup,
        setup_timeout_sec=needs.setup_timeout_sec,
        argv=tuple(argv),
        env=dict(sorted(env.items())),
        instruction_via=via,
        instruction_path=instruction_path,
        instruction=bindings.task.instruction if via != "none" else "",
        outputs=tuple(outputs),
        timeout_sec=needs.agent_timeout_sec,
        max_model_calls=limits.get("max_model_calls"),
        # By default a non-zero exit is recorded and the verifier decides (see the schema).
        fail_on_nonzero_exit=bool(limits.get("fail_on_nonzero_exit", False)),
        log_path=f"{logs_dir}/{engine.name}.txt",
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
    the model the recipe names with its credential, except for the engines that use none."""
    model = recipe.get("model") or {}
    with_model = bool(model) and engine_get(recipe["engine"]["name"]).uses_model
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

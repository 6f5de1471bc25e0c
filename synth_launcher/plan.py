"""A launch plan and what it is built from: the attempt's bindings.

:class:`Bindings` is everything about one attempt that a recipe may refer to
(``${task.<key>}``, ``${run.<key>}``, ``${attempt.<key>}``, ``${model.<key>}``; see
:data:`BINDING_KEYS`) or that the platform injects (the scoped credential, the proxy's
address). :class:`LaunchPlan` is what synth_launcher.launcher makes of a recipe and its
bindings, as data; synth_launcher.harbor_agent.RecipeAgent carries it out.

The credential is kept out of everything that is stored or logged: the plan's ``env`` holds
the literal marker ``${credential}`` where it goes, :meth:`LaunchPlan.to_dict` never
contains it, and only :meth:`LaunchPlan.exec_env` (called at the moment of launch) puts it in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from synth_common.canonical import canonical_digest

PLAN_FORMAT = "synth.launch-plan/1"
CREDENTIAL_MARKER = "${credential}"
AGENT_LOGS_DIR = "/logs/agent"
ARTIFACT_OUTPUTS_DIR = "/logs/artifacts/outputs"
DEFAULT_SETUP_TIMEOUT_SEC = 600.0
# The correlation header a harness adds to every model call (Claude Code through
# ANTHROPIC_CUSTOM_HEADERS, Codex through its provider's http_headers), so the proxy can
# attribute a call to its trial even before it checks the credential.
TRIAL_HEADER = "x-synth-trial"

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

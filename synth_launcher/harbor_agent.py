"""The Harbor agent that executes a launch plan (see synth_launcher.launcher).

One class for every engine: the recipe was already interpreted by the launcher, so
this only carries the plan out inside a Harbor environment, as the engine registry
(synth_launcher.engines) says the plan's engine runs::

    plan = launch_plan_build(recipe=recipe, bindings=bindings)
    config = TrialConfig(task=..., agent=recipe_agent_config(plan=plan), environment=...)

or by hand: ``AgentConfig(import_path="synth_launcher.harbor_agent:RecipeAgent",
kwargs={"launch_plan": plan.to_dict()}, env={CREDENTIAL_ENV: credential})``.

The credential travels in ``AgentConfig.env`` (never in kwargs): Harbor redacts
sensitive env names when it writes the trial config and scrubs their values from every
file of the trial directory, whereas kwargs are written verbatim.

setup: the plan's files, the instruction file and the engine's uploads (for synth-mini the
built-in agent, synth_launcher/mini_agent.py, to /installed-agent/synth_mini.py) are
uploaded, then each setup command runs in the working directory with its own deadline. run:
oracle is Harbor's OracleAgent (the task's solution is uploaded to /solution and solve.sh
runs), nop does nothing, any other engine runs the plan's argv in the working directory with
the plan's env; stdout+stderr go to /logs/agent/<engine>.txt (unless the engine's stdout is
its transcript: claude-code's goes to /logs/agent/claude-code.jsonl, codex's to
/logs/agent/codex.jsonl; synth-mini writes its own, /logs/agent/synth-mini.jsonl), the exit code to
/logs/agent/exit-code.txt. A non-zero exit is recorded, not raised (verification decides
the reward) unless the plan says so. Then the required outputs must exist
(``RequiredOutputMissing`` otherwise) and are copied to /logs/artifacts/outputs/<path>,
which Harbor collects as artifacts.

The agent's deadline is Harbor's (``AgentConfig.override_timeout_sec`` =
``plan.timeout_sec``, scaled by the trial's timeout multiplier), so it is not enforced
a second time here.
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harbor.agents.base import BaseAgent
from harbor.agents.installed.base import NonZeroAgentExitCodeError
from harbor.agents.oracle import OracleAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext
from harbor.models.trial.config import AgentConfig

from synth_launcher.engines import engine_get
from synth_launcher.plan import ARTIFACT_OUTPUTS_DIR, LaunchError, LaunchPlan
from synth_sandbox.boundary import GIT_SANITIZE_SCRIPT

IMPORT_PATH = "synth_launcher.harbor_agent:RecipeAgent"
# Harbor treats a name containing CREDENTIAL as sensitive (redacted in config.json,
# scrubbed from the trial directory).
CREDENTIAL_ENV = "SYNTH_MODEL_CREDENTIAL"
# Bookkeeping files, under the launch plan's logs_dir (/logs/agent for an agent, a
# directory under /logs/verifier for a judge). argument / stdin delivery read the
# instruction from its file, so a long instruction never has to fit into the `bash -c`
# string (one argument is limited to 128 KiB on Linux).
EXIT_CODE_FILE = "exit-code.txt"
PLAN_FILE = "launch-plan.json"
INSTRUCTION_FILE = "instruction.txt"
_TAIL_CHARS = 2000
# Besides the workdir, where a task's environment may keep repositories (sanitize_git).
SANITIZE_GIT_ROOTS = ("/testbed", "/workspace", "/repo", "/srv", "/home", "/root", "/tmp")
_SETUP_GRACE_SEC = 120.0


# Directories a harness writes its own state into (sessions, settings, SQLite): made before
# the uploads and owned by the agent's user.
STATE_DIR_ENV = ("CLAUDE_CONFIG_DIR", "CODEX_HOME", "MSWEA_GLOBAL_CONFIG_DIR")


class RequiredOutputMissing(RuntimeError):
    """The agent finished but a required output (recipe ``outputs``) does not exist."""

    def __init__(self, paths: list[str]) -> None:
        super().__init__("required output(s) missing after the agent ran: " + ", ".join(paths))
        self.paths = paths


class SetupCommandFailed(RuntimeError):
    """A recipe setup command exited non-zero or overran its deadline."""


def recipe_agent_config(*, plan: LaunchPlan, task_dir: Path | str | None = None) -> AgentConfig:
    """The Harbor AgentConfig that runs ``plan``, with its deadlines and its credential.

    ``task_dir`` is only needed for the oracle engine when the environment's definition
    does not live in ``<task_dir>/environment`` (RecipeAgent finds the task from there).
    """
    kwargs: dict[str, Any] = {"launch_plan": plan.to_dict()}
    if task_dir is not None:
        kwargs["task_dir"] = str(task_dir)
    return AgentConfig(
        import_path=IMPORT_PATH,
        kwargs=kwargs,
        env={CREDENTIAL_ENV: plan.credential} if plan.credential else {},
        override_timeout_sec=plan.timeout_sec,
        # Each setup command has its own deadline; Harbor's phase deadline must cover them all.
        override_setup_timeout_sec=max(
            RecipeAgent.DEFAULT_SETUP_TIMEOUT_SEC, plan.setup_timeout_sec * len(plan.setup) + _SETUP_GRACE_SEC
        ),
    )


def _q(value: str) -> str:
    return shlex.quote(value)


class RecipeAgent(BaseAgent):
    """Runs a launch plan (``kwargs={"launch_plan": plan.to_dict()}``); see the module docstring."""

    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        *,
        launch_plan: dict[str, Any],
        task_dir: Path | str | None = None,
        sanitize_git: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(logs_dir=logs_dir, model_name=model_name, **kwargs)
        self.sanitize_git = sanitize_git
        self.plan = LaunchPlan.from_dict(launch_plan, credential=self._extra_env.get(CREDENTIAL_ENV) or None)
        self.engine = engine_get(self.plan.engine)
        if self.plan.needs_credential and not self.plan.credential:
            # Fail at Trial.create, not minutes later inside the sandbox.
            raise LaunchError(
                f"the launch plan needs the scoped model credential in AgentConfig.env[{CREDENTIAL_ENV!r}]",
                field="bindings.credential",
            )
        self._task_dir = Path(task_dir) if task_dir is not None else None
        self._digest = self.plan.digest()
        logs = self.plan.logs_dir
        self._exit_code_path = f"{logs}/{EXIT_CODE_FILE}"
        self._plan_path = f"{logs}/{PLAN_FILE}"
        self._instruction_path = f"{logs}/{INSTRUCTION_FILE}"

    @staticmethod
    def name() -> str:
        return "synth-recipe"

    def version(self) -> str:
        return f"{self.plan.engine}@{self.plan.engine_version}"

    # ------------------------------------------------------------ setup

    async def _root(self, environment: BaseEnvironment, command: str, *, timeout_sec: int = 60) -> None:
        result = await environment.exec(command, timeout_sec=timeout_sec, user="root")
        if result.return_code != 0:
            raise SetupCommandFailed(
                f"{command!r} exited {result.return_code}: {self._tail(result.stdout, result.stderr)}"
            )

    async def _git_sanitize(self, environment: BaseEnvironment) -> None:
        roots = [self.plan.workdir, *SANITIZE_GIT_ROOTS]
        result = await environment.exec(
            f"bash -c {_q(GIT_SANITIZE_SCRIPT)} sanitize-git " + " ".join(_q(r) for r in roots),
            timeout_sec=600,
            user="root",
        )
        if result.return_code != 0:
            raise SetupCommandFailed(
                f"sanitize_git exited {result.return_code}: {self._tail(result.stdout, result.stderr)}"
            )
        self.logger.info("%s", (result.stdout or "").strip())

    async def _upload_texts(
        self, environment: BaseEnvironment, *, files: list[tuple[str, str, str]], then: Sequence[str] = ()
    ) -> None:
        """Upload each (path, content, mode), then set every mode, and run ``then``, in one
        command as root (each exec is a process spawned into the environment)."""
        # upload_file rather than a heredoc in exec: content can be anything (quotes,
        # NULs aside) and large, and it never appears in a command line or exec log.
        with tempfile.TemporaryDirectory() as tmp:
            for i, (path, content, _) in enumerate(files):
                source = Path(tmp) / str(i)
                source.write_text(content, encoding="utf-8")
                await environment.upload_file(source_path=source, target_path=path)
        by_mode: dict[str, list[str]] = {}
        for path, _, mode in files:
            by_mode.setdefault(mode, []).append(path)
        modes = [f"chmod {mode} " + " ".join(_q(p) for p in paths) for mode, paths in sorted(by_mode.items())]
        await self._root(environment, " && ".join([*modes, *then]))

    async def setup(self, environment: BaseEnvironment) -> None:
        plan = self.plan
        if self.sanitize_git:
            # First, before any command of the recipe can read the history.
            await self._git_sanitize(environment)
        uploads = [(f.path, f.content, f.mode) for f in plan.files]
        uploads += [(u.target, u.source.read_text(encoding="utf-8"), u.mode) for u in self.engine.uploads]
        if plan.instruction_via == "file":
            uploads.append((plan.instruction_path, plan.instruction, "0644"))
        elif plan.instruction_via in ("argument", "stdin"):
            uploads.append((self._instruction_path, plan.instruction, "0644"))
        state_dirs = [plan.env[name] for name in STATE_DIR_ENV if name in plan.env]
        dirs = {plan.logs_dir, plan.workdir, *state_dirs, *(str(Path(path).parent) for path, _, _ in uploads)}
        await self._root(environment, "mkdir -p " + " ".join(_q(d) for d in sorted(dirs)))
        plan_file = (self._plan_path, json.dumps(plan.to_dict(), indent=2, sort_keys=True), "0644")
        owner: list[str] = []
        user = environment.default_user
        if user not in (None, "root", 0):
            # Uploads land as root; the agent (the task's [agent].user) must own its files.
            owned = [plan.workdir, *(path for path, _, _ in uploads), *state_dirs]
            owner.append(f"chown -R {_q(str(user))} " + " ".join(_q(p) for p in owned))
        await self._upload_texts(environment, files=[plan_file, *uploads], then=owner)

        env = plan.exec_env()
        for i, command in enumerate(plan.setup):
            script = f"cd {_q(plan.workdir)} || exit $?\n{command}"
            try:
                result = await environment.exec(script, env=env, timeout_sec=math.ceil(plan.setup_timeout_sec))
            except TimeoutError as exc:  # asyncio.TimeoutError is TimeoutError on 3.11+
                raise SetupCommandFailed(
                    f"setup[{i}] {plan.redact(command)!r} did not finish within {plan.setup_timeout_sec:g}s"
                ) from exc
            if result.return_code != 0:
                raise SetupCommandFailed(
                    f"setup[{i}] {plan.redact(command)!r} exited {result.return_code}: "
                    f"{plan.redact(self._tail(result.stdout, result.stderr))}"
                )

    @staticmethod
    def _tail(stdout: str | None, stderr: str | None) -> str:
        text = "\n".join(part for part in (stdout, stderr) if part).strip()
        return ("..." + text[-_TAIL_CHARS:]) if len(text) > _TAIL_CHARS else (text or "(no output)")

    # ------------------------------------------------------------ run

    def _command(self) -> str:
        """The shell command that runs the engine: cd, argv, instruction, redirections, exit code."""
        plan = self.plan
        argv = [_q(part) for part in plan.argv]
        if plan.instruction_via == "argument":
            # The plan's last argv element is the instruction; read it from the uploaded
            # file instead of inlining it (same value, no command-line size limit).
            argv[-1] = f'"$(cat {_q(self._instruction_path)})"'
        stdin = self._instruction_path if plan.instruction_via == "stdin" else "/dev/null"
        if plan.transcript_path and self.engine.transcript_is_stdout:
            outputs = f"> {_q(plan.transcript_path)} 2> {_q(plan.log_path)}"
        else:
            outputs = f"> {_q(plan.log_path)} 2>&1"
        # stdin is never inherited: `claude --print` would wait on an open pipe.
        return (
            f"cd {_q(plan.workdir)} && {' '.join(argv)} < {_q(stdin)} {outputs}; "
            f"rc=$?; echo $rc > {_q(self._exit_code_path)}; exit $rc"
        )

    def _argv_for_record(self) -> list[str]:
        argv = [self.plan.redact(part) for part in self.plan.argv]
        if self.plan.instruction_via == "argument" and argv:
            argv[-1] = f"<instruction: {len(self.plan.instruction)} chars>"
        return argv

    def _find_task_dir(self, environment: BaseEnvironment) -> Path:
        # Harbor hands task_dir only to its own "oracle"; an import-path agent finds the
        # task through the environment definition, <task>/environment.
        candidates = [self._task_dir] if self._task_dir is not None else []
        candidates.append(Path(environment.environment_dir).parent)
        for candidate in candidates:
            if (candidate / "task.toml").is_file():
                return candidate
        raise LaunchError(
            "engine oracle: cannot find the task directory (pass task_dir in the agent kwargs)", field="engine.name"
        )

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        plan = self.plan
        if plan.instruction_via != "none" and instruction.strip() != plan.instruction.strip():
            # The plan is what was decided (and stored); it is what the agent gets.
            self.logger.warning("trial instruction differs from the launch plan's; delivering the plan's")
        metadata: dict[str, Any] = {
            "engine": plan.engine,
            "engine_version": plan.engine_version,
            "argv": self._argv_for_record(),
            "launch_plan_digest": self._digest,
            "correlation_id": plan.correlation_id,
            "exit_code": None,
        }
        for upload in self.engine.uploads:
            metadata[f"{upload.name}_sha256"] = hashlib.sha256(upload.source.read_bytes()).hexdigest()
        context.metadata = {**(context.metadata or {}), **metadata}

        exit_code: int | None = None
        if self.engine.runner == "oracle":
            oracle = OracleAgent(
                logs_dir=self.logs_dir,
                task_dir=self._find_task_dir(environment),
                trial_paths=environment.trial_paths,
                logger=self.logger,
            )
            await oracle.run(instruction, environment, context)
            # OracleAgent writes the exit code on the host side, and only when non-zero.
            host_exit = self.logs_dir / "exit-code.txt"
            exit_code = int(host_exit.read_text().strip()) if host_exit.is_file() else 0
        elif self.engine.runner == "argv":
            result = await environment.exec(self._command(), env=plan.exec_env())
            exit_code = result.return_code
            if result.stdout or result.stderr:
                # The engine's own output is redirected to its log, so anything here is
                # the launch itself failing (no such workdir, command not found, ...).
                context.metadata["launch_output"] = plan.redact(self._tail(result.stdout, result.stderr))
                self.logger.warning("launch of %s: %s", plan.engine, context.metadata["launch_output"])
        context.metadata["exit_code"] = exit_code

        await self._outputs_collect(environment)
        if exit_code and plan.fail_on_nonzero_exit:
            raise NonZeroAgentExitCodeError(f"{plan.engine} exited {exit_code} (the recipe fails on a non-zero exit)")

    async def _outputs_collect(self, environment: BaseEnvironment) -> None:
        missing = []
        for path in self.plan.outputs:
            probe = await environment.exec(f"test -e {_q(path)}", timeout_sec=30)
            if probe.return_code != 0:
                missing.append(path)
        # Copy what exists even when something is missing: partial outputs help debugging.
        for path in self.plan.outputs:
            if path in missing:
                continue
            target = f"{ARTIFACT_OUTPUTS_DIR}/{path.lstrip('/')}"
            await self._root(
                environment,
                f"mkdir -p {_q(str(Path(target).parent))} && rm -rf {_q(target)} && cp -a {_q(path)} {_q(target)}",
                timeout_sec=300,
            )
        if missing:
            raise RequiredOutputMissing(missing)


class RestoreAgent(BaseAgent):
    """A regrade's agent: no model, no instruction; it replaces the workdir with the files
    a finished attempt left there (its retained ``artifacts/workdir``), so that the judge
    assesses exactly that work. File modes are not retained: files come back 0644."""

    def __init__(
        self, logs_dir: Path, model_name: str | None = None, *, source_dir: str, workdir: str, source_trial: str,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(logs_dir=logs_dir, model_name=model_name, **kwargs)
        self._source_dir = Path(source_dir)
        self._workdir = workdir
        self._source_trial = source_trial

    @staticmethod
    def name() -> str:
        return "synth-restore"

    def version(self) -> str:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        files = [p for p in self._source_dir.rglob("*") if p.is_file()]
        # Empty it rather than remove it: the workdir may be a mount point of the sandbox.
        workdir = _q(self._workdir)
        result = await environment.exec(
            f"mkdir -p {workdir} && find {workdir} -mindepth 1 -maxdepth 1 -exec rm -rf {{}} +",
            timeout_sec=120,
            user="root",
        )
        if result.return_code != 0:
            raise SetupCommandFailed(f"cannot reset {self._workdir}: {RecipeAgent._tail(result.stdout, result.stderr)}")
        if files:
            await environment.upload_dir(source_dir=self._source_dir, target_dir=self._workdir)
        user = environment.default_user
        if user not in (None, "root", 0):
            await environment.exec(f"chown -R {_q(str(user))} {_q(self._workdir)}", timeout_sec=120, user="root")
        context.metadata = {
            **(context.metadata or {}),
            "restored_from": self._source_trial,
            "files": len(files),
            "workdir": self._workdir,
        }

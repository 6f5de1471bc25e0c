"""Harbor environment provider backed by the local sandbox (the platform's default).

Use it from Harbor with::

    EnvironmentConfig(
        import_path="synth_sandbox.environment:LocalSandboxEnvironment",
        kwargs={"model_socket": "/run/synth/proxy.sock"},
    )

or on the command line ``harbor run -e synth_sandbox.environment:LocalSandboxEnvironment
--ek model_socket=/run/synth/proxy.sock ...``.  Harbor's absolute paths work unchanged:
the workdir (``[environment].workdir``, default ``/app``), ``/logs/{agent,verifier,artifacts}``,
``/tests`` and ``/solution`` are per-sandbox host directories bound at those paths, and Harbor's
uploads/downloads are (symlink-safe) host-side copies.  The environment's Dockerfile is
applied at start (build.py; refused before start when it cannot be applied faithfully), its
``ENV`` is the base of every exec's environment.  See sandbox.py, mounts.py and execs.py for
the isolation model and docs/sandbox.md for the operator's view.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import secrets
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path, PurePath
from typing import Any, ClassVar, Literal

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.config import ResourceMode
from harbor.models.trial.paths import TrialPaths
from pydantic import Field

from synth_sandbox.bridge import DEFAULT_MAX_CONNECTIONS
from synth_sandbox.build import apply_build
from synth_sandbox.buildcache import DEFAULT_KEEP, BuildCache
from synth_sandbox.cgroups import detect_hierarchies, make_plan
from synth_sandbox.errors import SandboxError, SandboxPathError
from synth_sandbox.hooks import CHECK_HOOK, HOOKS_IN_SANDBOX
from synth_sandbox.limits import DEFAULT_PIDS_MAX, SandboxLimits
from synth_sandbox.paths import DEFAULT_HOST_DIRS, MODEL_SOCKET_IN_SANDBOX, SANDBOX_PATH
from synth_sandbox.processes import find_tools
from synth_sandbox.sandbox import DEFAULT_MODEL_PORT, Sandbox
from synth_sandbox.support import (
    APP_DIR_NAME,
    DEFAULT_ALLOWED_IMAGES,
    DEFAULT_WORKDIR,
    SupportReport,
    UnsupportedTaskError,
    bundled_image_problem,
    check_environment_supported,
    dockerfile_workdir,
)

DEFAULT_MEMORY_MB = 2048
DEFAULT_CPUS = 1.0
DEFAULT_STORAGE_MB = 4096
BUILD_CACHE_DIR_NAME = ".build-cache"
BuildSource = Literal["none", "applied", "built", "cache"]


def default_sandbox_root() -> Path:
    return Path(tempfile.gettempdir()) / "synth-sandboxes"


# ------------------------------------------------------------------ phases
# Harbor makes a trial's environments itself (the agent's, and a separate verifier's when the
# task asks for one), so the phase a trial is in is kept per trial directory: the trial's
# boundary (synth_sandbox.boundary) moves it, and each environment of that trial reads it.


@dataclass(frozen=True)
class Phase:
    name: str = "agent"  # agent | verifier
    checked: bool = False  # record missing commands (the task's own tests, not a judge)


@dataclass
class PhaseObservations:
    """What a phase tried and could not have: names it looked up, commands bash did not find."""

    network: list[str] = field(default_factory=list)
    missing_commands: list[str] = field(default_factory=list)


_TRIAL_PHASES: dict[Path, Phase] = {}
_TRIAL_ENVIRONMENTS: dict[Path, list[LocalSandboxEnvironment]] = {}


def _trial_key(trial_dir: Path) -> Path:
    return Path(trial_dir).resolve()


def trial_phase_set(*, trial_dir: Path, phase: Phase) -> None:
    _TRIAL_PHASES[_trial_key(trial_dir)] = phase


def trial_observations(*, trial_dir: Path, phase: str) -> PhaseObservations:
    """What every local sandbox of the trial observed during ``phase``."""
    out = PhaseObservations()
    for env in _TRIAL_ENVIRONMENTS.get(_trial_key(trial_dir), []):
        seen = env.observations(phase=phase)
        out.network += [n for n in seen.network if n not in out.network]
        out.missing_commands += [c for c in seen.missing_commands if c not in out.missing_commands]
    return out


def trial_forget(*, trial_dir: Path) -> None:
    _TRIAL_PHASES.pop(_trial_key(trial_dir), None)
    _TRIAL_ENVIRONMENTS.pop(_trial_key(trial_dir), None)


class LocalSandboxOptions(EnvironmentOptions):
    """Constructor kwargs (``EnvironmentConfig.kwargs`` / ``--ek``) of LocalSandboxEnvironment."""

    model_socket: str | None = Field(
        default=None, description="Unix socket of the model proxy; bridged to 127.0.0.1:model_port inside."
    )
    model_port: int = Field(default=DEFAULT_MODEL_PORT, ge=1, le=65535)
    model_max_connections: int = Field(
        default=DEFAULT_MAX_CONNECTIONS, ge=1, description="Connections the bridge forwards at once (more wait)."
    )
    sandbox_root: str | None = Field(default=None, description="Host directory holding the sandboxes.")
    sandbox_uid: int | None = Field(default=None, ge=1, description="Host uid mapped to root inside (when root).")
    pids_max: int | None = Field(default=DEFAULT_PIDS_MAX, ge=8)
    cpu_time_sec: int | None = Field(default=None, ge=1, description="RLIMIT_CPU of every process.")
    default_memory_mb: int | None = Field(default=DEFAULT_MEMORY_MB, ge=16)
    default_cpus: float | None = Field(default=DEFAULT_CPUS, gt=0)
    default_storage_mb: int | None = Field(default=DEFAULT_STORAGE_MB, ge=1)
    storage_backend: Literal["tmpfs", "disk"] = "tmpfs"
    cgroup_parent: str | None = None
    host_dirs: list[str] | None = Field(default=None, description="Host top-level directories bound read-only.")
    extra_ro_binds: list[str] = Field(default_factory=list, description="'src' or 'src:dst', bound read-only.")
    extra_writable_dirs: list[str] = Field(default_factory=list)
    allowed_images: list[str] | None = Field(default=None, description="fnmatch patterns of acceptable base images.")
    build_cache_dir: str | None = Field(
        default=None, description="Host directory of built Dockerfiles (default: sandbox_root/.build-cache)."
    )
    build_cache_entries: int = Field(default=DEFAULT_KEEP, ge=1, description="Built Dockerfiles kept (LRU).")


_BASE_PARAMS = frozenset(inspect.signature(BaseEnvironment.__init__).parameters) - {"self", "args", "kwargs"}


@cache
def _host_resource_capabilities() -> EnvironmentResourceCapabilities:
    try:
        plan = make_plan(detect_hierarchies())
        controllers = set(plan.by_controller)
    except OSError:
        controllers = set()
    return EnvironmentResourceCapabilities(
        cpu_limit="cpu" in controllers,
        memory_limit="memory" in controllers,
        fractional_cpus=True,
    )


class LocalSandboxEnvironment(BaseEnvironment):
    """A Harbor environment that runs the task in a bubblewrap sandbox on this host."""

    options_model: ClassVar[type[EnvironmentOptions] | None] = LocalSandboxOptions

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: TrialPaths,
        task_env_config: EnvironmentConfig,
        logger: logging.Logger | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        # Our options are validated (and coerced: --ek passes strings) by the options model,
        # before BaseEnvironment.__init__ runs _validate_definition, which needs them.
        # Everything that is not a BaseEnvironment parameter is an option: unknown names are
        # rejected by the model (extra="forbid"), as for Harbor's built-in providers.
        own = {name: kwargs.pop(name) for name in list(kwargs) if name not in _BASE_PARAMS}
        options = self._parse_options_model(
            LocalSandboxOptions, {"auto_mounting": kwargs.get("auto_mounting", False), **own}
        )
        assert isinstance(options, LocalSandboxOptions)
        self.options = options
        self.sandbox_options = options
        self._allowed_images = tuple(options.allowed_images or DEFAULT_ALLOWED_IMAGES)
        self._host_dirs = tuple(options.host_dirs or DEFAULT_HOST_DIRS)
        self._sandbox: Sandbox | None = None
        self._warned_users: set[str] = set()
        self.support_report = SupportReport()
        # A separate verifier's environment is made during verification: it starts in that phase.
        self._trial_key = _trial_key(trial_paths.trial_dir)
        self.phase = _TRIAL_PHASES.get(self._trial_key, Phase())
        self._phase_env: dict[str, str] = {}
        self._missing_commands: dict[str, list[str]] = {}
        _TRIAL_ENVIRONMENTS.setdefault(self._trial_key, []).append(self)
        self._dockerfile_workdir: str | None = None
        # How start() set the sandbox up from the Dockerfile: not at all, step by step, by
        # running its build, or from the build cache.
        self.build_source: BuildSource = "none"
        super().__init__(
            environment_dir, environment_name, session_id, trial_paths, task_env_config, logger, *args, **kwargs
        )
        # Fails at construction (i.e. Trial.create), not in the middle of a run.
        find_tools()

    @staticmethod
    def type() -> str:
        return "synth-local"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # Always no network (network_mode no-network is trivially honoured; "public" tasks get
        # no network either, except the model bridge).  Not "mounted": Harbor's output dirs are
        # copied out rather than bound, so no sandbox process ever writes into the trial dir.
        return EnvironmentCapabilities(disable_internet=True)

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities | None:
        return _host_resource_capabilities()

    # ------------------------------------------------------------------ validation

    def _validate_definition(self) -> None:
        # Harbor's separate verifier is this same provider on tests/ ("bundled tests": built
        # from tests/Dockerfile, which copies them to /tests), checked and built the same way.
        report = check_environment_supported(
            self.task_env_config,
            self.environment_dir,
            allowed_images=self._allowed_images,
            host_dirs=self._host_dirs,
            extra_writable_dirs=self.sandbox_options.extra_writable_dirs,
            label=f"the environment ({self.environment_dir.name}/)",
        )
        if not self._enable_environment_dir_upload and self.task_env_config.docker_image:
            report.problems.append(bundled_image_problem(image=self.task_env_config.docker_image))
        self.support_report = report
        build = report.build
        self._dockerfile_workdir = (
            build.plan.workdir if build else dockerfile_workdir(environment_dir=self.environment_dir)
        )
        if report.problems:
            raise UnsupportedTaskError(report.message())
        for warning in report.warnings:
            self.logger.warning("local sandbox: %s", warning)

    # ------------------------------------------------------------------ properties

    @property
    def workdir(self) -> str:
        return self.task_env_config.workdir or self._dockerfile_workdir or DEFAULT_WORKDIR

    @property
    def image_env(self) -> dict[str, str]:
        """The Dockerfile's ENV: the base of every exec's environment."""
        build = self.support_report.build
        return dict(build.plan.env) if build is not None else {}

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            raise SandboxError("the environment has not been started")
        return self._sandbox

    @property
    def enforced_limits(self) -> dict[str, int | float]:
        """Limits actually in force (name -> value); empty before start()."""
        return dict(self._sandbox.enforced_limits) if self._sandbox else {}

    @property
    def unenforced_limits(self) -> dict[str, str]:
        """Requested limits this host could not enforce (name -> reason)."""
        return dict(self._sandbox.unenforced_limits) if self._sandbox else {}

    @property
    def model_base_url(self) -> str | None:
        """``http://127.0.0.1:<port>`` inside the sandbox when a model socket was given."""
        if self._sandbox is not None and self._sandbox.model_base_url:
            return self._sandbox.model_base_url
        if self.sandbox_options.model_socket:
            return f"http://127.0.0.1:{self.sandbox_options.model_port}"
        return None

    @property
    def model_socket_in_sandbox(self) -> str | None:
        return MODEL_SOCKET_IN_SANDBOX if self.sandbox_options.model_socket else None

    def _limits(self) -> SandboxLimits:
        opts = self.sandbox_options
        memory: int | None = None
        if self._memory_resource_mode != ResourceMode.IGNORE:
            memory = self.task_env_config.memory_mb or opts.default_memory_mb
        cpus: float | None = None
        if self._cpu_resource_mode != ResourceMode.IGNORE:
            cpus = float(self.task_env_config.cpus or opts.default_cpus or 0) or None
        return SandboxLimits(
            memory_mb=memory,
            cpus=cpus,
            storage_mb=self.task_env_config.storage_mb or opts.default_storage_mb,
            pids_max=opts.pids_max,
            cpu_time_sec=opts.cpu_time_sec,
        )

    # ------------------------------------------------------------------ life cycle

    async def start(self, force_build: bool) -> None:
        # force_build has no meaning here: a build's cache entry is keyed by its content.
        opts = self.sandbox_options
        build = self.support_report.build
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.session_id).strip("._-")[:80] or "sandbox"
        sandbox = Sandbox(
            name=f"{slug}-{secrets.token_hex(4)}",
            base_dir=Path(opts.sandbox_root) if opts.sandbox_root else default_sandbox_root(),
            workdir=self.workdir,
            limits=self._limits(),
            model_socket=Path(opts.model_socket) if opts.model_socket else None,
            model_port=opts.model_port,
            model_max_connections=opts.model_max_connections,
            sandbox_uid=opts.sandbox_uid,
            host_dirs=self._host_dirs,
            extra_ro_binds=opts.extra_ro_binds,
            extra_writable_dirs=[*opts.extra_writable_dirs, *(build.writable_dirs if build else ())],
            storage_backend=opts.storage_backend,
            cgroup_parent=opts.cgroup_parent,
            log=self.logger,
        )
        self._sandbox = sandbox
        await sandbox.start()
        try:
            self._require_enforced(sandbox)
            await self._set_up_files(sandbox)
            # After the set-up: what the Dockerfile's build looked up is not the phase's doing.
            self._phase_enter(self.phase)
        except BaseException:
            await sandbox.stop(delete=True)
            raise

    async def _set_up_files(self, sandbox: Sandbox) -> None:
        build = self.support_report.build
        if build is None:
            # No Dockerfile to apply: environment/app/ is the workdir's initial content, or
            # (prebuilt docker_image) Harbor's own convention of uploading environment/.
            app_dir = self.environment_dir / APP_DIR_NAME
            if app_dir.is_dir():
                await sandbox.upload_dir(app_dir, self.workdir)
            else:
                await self._upload_environment_dir_after_start()
            return
        if not build.plan.has_run:
            await apply_build(sandbox=sandbox, build=build)
            self.build_source = "applied"
            return
        opts = self.sandbox_options
        cache_dir = Path(opts.build_cache_dir) if opts.build_cache_dir else sandbox.base_dir / BUILD_CACHE_DIR_NAME
        cache = BuildCache(root=cache_dir, keep=opts.build_cache_entries)
        # Hashing the build context reads every file of it: not on the event loop.
        key = await asyncio.to_thread(
            build.cache_key, layout=sandbox.writable_dirs, host_dirs=[*self._host_dirs, *opts.extra_ro_binds]
        )

        async def build_and_export(target: Path) -> None:
            await apply_build(sandbox=sandbox, build=build)
            await sandbox.export_files(target)

        hit = await cache.fetch_or_build(key, restore=sandbox.import_files, build=build_and_export)
        self.build_source = "cache" if hit else "built"
        self.logger.info(
            "local sandbox: %s %s (build %s)",
            build.plan.file,
            "restored from the build cache" if hit else "built",
            key[:12],
        )

    def _require_enforced(self, sandbox: Sandbox) -> None:
        # An explicit "limit"/"guarantee" policy must be enforced or the run refused; "auto"
        # degrades and records the fact (enforced_limits / unenforced_limits).
        for mode, key in ((self._memory_resource_mode, "memory_mb"), (self._cpu_resource_mode, "cpus")):
            if mode in (ResourceMode.LIMIT, ResourceMode.GUARANTEE) and key in sandbox.unenforced_limits:
                raise SandboxError(f"{key} limit requested but not enforceable here: {sandbox.unenforced_limits[key]}")

    async def stop(self, delete: bool) -> None:
        if self._sandbox is not None:
            self._phase_record()  # the sandbox's directory, where the hooks write, is going
            await self._sandbox.stop(delete=delete)

    # ------------------------------------------------------------------ phases

    async def phase_begin(self, phase: Phase) -> None:
        """A new phase of the trial starts in this environment (verification after the agent)."""
        self._phase_record()
        self.phase = phase
        if self._sandbox is not None:
            self._phase_enter(phase)

    def _phase_enter(self, phase: Phase) -> None:
        sandbox = self.sandbox
        sandbox.observed_reset()
        if sandbox.dns is not None:
            sandbox.dns.phase = phase.name
        self._phase_env = {"BASH_ENV": f"{HOOKS_IN_SANDBOX}/{CHECK_HOOK}"} if phase.checked else {}

    def _phase_record(self) -> None:
        if self._sandbox is not None and self.phase.checked:
            self._missing_commands[self.phase.name] = self._sandbox.missing_commands()

    async def end_processes(self) -> int:
        """Kill every process left in the sandbox (the agent phase is over); see Sandbox.end_processes."""
        return await self.sandbox.end_processes()

    def observations(self, *, phase: str) -> PhaseObservations:
        missing = self._missing_commands.get(phase, [])
        if self._sandbox is not None and self.phase.name == phase and self.phase.checked and self._sandbox.running:
            missing = self._sandbox.missing_commands()
        dns = self._sandbox.dns if self._sandbox is not None else None
        return PhaseObservations(network=dns.names(phase=phase) if dns else [], missing_commands=missing)

    # ------------------------------------------------------------------ exec and files

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        effective_user = self._resolve_user(user)
        if effective_user not in (None, "root", 0, "0") and str(effective_user) not in self._warned_users:
            # The user namespace maps a single uid, so there is nobody else to become.
            self._warned_users.add(str(effective_user))
            self.logger.warning("local sandbox: running as root instead of user %r", effective_user)
        result = await self.sandbox.exec(
            command,
            cwd=cwd or self.workdir,
            env=self._exec_env(env),
            timeout_sec=timeout_sec,
            on_output=self._output_callback(),
        )
        # Like the docker provider: empty streams are None.
        return ExecResult(stdout=result.stdout or None, stderr=result.stderr or None, return_code=result.return_code)

    def _exec_env(self, env: dict[str, str] | None) -> dict[str, str]:
        # The image's ENV is the lowest layer, as in a container: the task's and the trial's
        # variables override it.  A PATH the platform built by prefixing the default one (e.g.
        # Claude Code's directory) is applied on top of the image's PATH instead of hiding it.
        image = self.image_env
        merged = self._merge_env(env) or {}
        # The phase's hooks (BASH_ENV while the verifier is checked) sit above the image.
        result = {**image, **self._phase_env, **merged}
        path = merged.get("PATH")
        if "PATH" in image and path and path != image["PATH"] and path.endswith(SANDBOX_PATH):
            result["PATH"] = path[: -len(SANDBOX_PATH)] + image["PATH"]
        return result

    async def is_dir(self, path: str, user: str | int | None = None) -> bool:
        # Harbor probes with `test -d` (one exec, i.e. a process spawned into the sandbox,
        # per probe). Inside a writable directory the host answers instead, never through a
        # symlink: a path the host-side copies would refuse is not a directory to them either.
        try:
            return await self.sandbox.is_dir(path)
        except SandboxPathError:
            return await super().is_dir(path, user=user)

    async def empty_dirs(self, dirs: Sequence[str | PurePath], *, chmod: bool = True) -> ExecResult | None:
        # Harbor empties them with a shell command spawned into the sandbox (before every
        # verification, among others). Inside the writable directories the host does it,
        # as that command does (a symlink or file in the way replaced by a directory, the
        # content removed, never through a symlink, mode 777 with ``chmod``); others are
        # left to the command.
        rest = []
        for path in dirs:
            try:
                await self.sandbox.empty_dir(str(path), mode=0o777 if chmod else None)
            except SandboxPathError:
                rest.append(path)
        if rest:
            return await super().empty_dirs(rest, chmod=chmod)
        return ExecResult(stdout=None, stderr=None, return_code=0) if dirs else None

    async def is_file(self, path: str, user: str | int | None = None) -> bool:
        try:
            return await self.sandbox.is_file(path)
        except SandboxPathError:
            return await super().is_file(path, user=user)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self.sandbox.upload_file(source_path, str(target_path))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self.sandbox.upload_dir(source_dir, str(target_dir))

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await self.sandbox.download_file(str(source_path), target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self.sandbox.download_dir(str(source_dir), target_dir)

    async def download_dir_with_exclusions(
        self, *, source_dir: str, target_dir: Path | str, exclude: list[str]
    ) -> None:
        # Harbor packs the directory with `tar --exclude` inside the sandbox, fetches and
        # unpacks the archive, then removes it: two processes spawned into the sandbox and a
        # gzip round trip. Inside a writable directory the host copies it instead, the same
        # entries excluded, never through a symlink (as download_dir).
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        try:
            await self.sandbox.download_dir(str(source_dir), target, exclude=exclude)
        except SandboxPathError:
            await super().download_dir_with_exclusions(source_dir=source_dir, target_dir=target, exclude=exclude)

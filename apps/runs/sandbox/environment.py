"""Harbor environment provider backed by the local sandbox (the platform's default).

Use it from Harbor with::

    EnvironmentConfig(
        import_path="apps.runs.sandbox.environment:LocalSandboxEnvironment",
        kwargs={"model_socket": "/run/synth/proxy.sock"},
    )

or on the command line ``harbor run -e apps.runs.sandbox.environment:LocalSandboxEnvironment
--ek model_socket=/run/synth/proxy.sock ...``.  Harbor's absolute paths work unchanged:
the workdir (``[environment].workdir``, default ``/app``), ``/logs/{agent,verifier,artifacts}``,
``/tests`` and ``/solution`` are per-sandbox host directories bound at those paths, and Harbor's
uploads/downloads are (symlink-safe) host-side copies.  See sandbox.py for the isolation
model and docs/sandbox.md for the operator's view.
"""

from __future__ import annotations

import inspect
import logging
import re
import secrets
import tempfile
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Literal

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.config import ResourceMode
from harbor.models.trial.paths import TrialPaths
from pydantic import Field

from apps.runs.sandbox.bridge import DEFAULT_MAX_CONNECTIONS
from apps.runs.sandbox.cgroups import detect_hierarchies, make_plan
from apps.runs.sandbox.sandbox import (
    DEFAULT_HOST_DIRS,
    DEFAULT_MODEL_PORT,
    DEFAULT_PIDS_MAX,
    MODEL_SOCKET_IN_SANDBOX,
    Sandbox,
    SandboxError,
    SandboxLimits,
    find_tools,
)
from apps.runs.sandbox.support import (
    APP_DIR_NAME,
    DEFAULT_ALLOWED_IMAGES,
    SupportReport,
    UnsupportedTaskError,
    check_environment_supported,
    parse_dockerfile,
)

DEFAULT_MEMORY_MB = 2048
DEFAULT_CPUS = 1.0
DEFAULT_STORAGE_MB = 4096
DEFAULT_WORKDIR = "/app"


def default_sandbox_root() -> Path:
    return Path(tempfile.gettempdir()) / "synth-sandboxes"


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
        report = check_environment_supported(
            self.task_env_config,
            self.environment_dir,
            allowed_images=self._allowed_images,
            host_dirs=self._host_dirs,
        )
        if not self._enable_environment_dir_upload and (self.environment_dir / "Dockerfile").exists():
            # Harbor's "bundled tests" verifier: the image built from tests/Dockerfile carries them.
            report.problems.append(
                "the verifier image bundles the tests (tests/Dockerfile), which local mode cannot build"
            )
        self.support_report = report
        if report.problems:
            raise UnsupportedTaskError(report.message())
        for warning in report.warnings:
            self.logger.warning("local sandbox: %s", warning)

    # ------------------------------------------------------------------ properties

    @property
    def workdir(self) -> str:
        if self.task_env_config.workdir:
            return self.task_env_config.workdir
        dockerfile = self.environment_dir / "Dockerfile"
        if dockerfile.is_file():
            workdir = parse_dockerfile(dockerfile.read_text(errors="replace")).workdir
            if workdir:
                return workdir
        return DEFAULT_WORKDIR

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
        # force_build has no meaning here: nothing is built.
        opts = self.sandbox_options
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
            extra_writable_dirs=opts.extra_writable_dirs,
            storage_backend=opts.storage_backend,
            cgroup_parent=opts.cgroup_parent,
            log=self.logger,
        )
        self._sandbox = sandbox
        await sandbox.start()
        try:
            self._require_enforced(sandbox)
            app_dir = self.environment_dir / APP_DIR_NAME
            if app_dir.is_dir():
                await sandbox.upload_dir(app_dir, self.workdir)
            else:
                await self._upload_environment_dir_after_start()
        except BaseException:
            await sandbox.stop(delete=True)
            raise

    def _require_enforced(self, sandbox: Sandbox) -> None:
        # An explicit "limit"/"guarantee" policy must be enforced or the run refused; "auto"
        # degrades and records the fact (enforced_limits / unenforced_limits).
        for mode, key in ((self._memory_resource_mode, "memory_mb"), (self._cpu_resource_mode, "cpus")):
            if mode in (ResourceMode.LIMIT, ResourceMode.GUARANTEE) and key in sandbox.unenforced_limits:
                raise SandboxError(f"{key} limit requested but not enforceable here: {sandbox.unenforced_limits[key]}")

    async def stop(self, delete: bool) -> None:
        if self._sandbox is not None:
            await self._sandbox.stop(delete=delete)

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
            env=self._merge_env(env),
            timeout_sec=timeout_sec,
            on_output=self._output_callback(),
        )
        # Like the docker provider: empty streams are None.
        return ExecResult(stdout=result.stdout or None, stderr=result.stderr or None, return_code=result.return_code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self.sandbox.upload_file(source_path, str(target_path))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self.sandbox.upload_dir(source_dir, str(target_dir))

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await self.sandbox.download_file(str(source_path), target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self.sandbox.download_dir(str(source_dir), target_dir)

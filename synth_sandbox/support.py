"""Which Harbor tasks the local sandbox can run, decided before anything starts.

Local mode has no image: commands run on the host's own programs (``/usr``, ``/etc``,
``/opt`` read-only) and ``environment/Dockerfile`` is applied by interpreting it (build.py,
dockerfiles.py).  A task is rejected, with every reason named, when it needs what the host
cannot stand in for:

* ``environment/docker-compose.yaml`` (several services, sidecars);
* ``[environment].docker_image`` (or the ``FROM`` of ``environment/Dockerfile``, or of a
  separate verifier's ``tests/Dockerfile``) that is not in the allow-list of "generic" base
  images (python, debian, ubuntu by default) whose role the host can play;
* a Dockerfile instruction that cannot be applied faithfully (``USER app``, ``SHELL``,
  multi-stage builds, ``ADD`` of a URL, heredocs, a ``COPY`` into ``/usr`` or of a file the
  build context lacks, ...), named with its line;
* GPUs, TPUs, Windows, an allowlisted network (the sandbox has no network at all);
* a workdir the sandbox cannot provide (inside the host's read-only system directories).

A ``RUN`` that fails can only be known by running it: that is a build error at start
(``SandboxBuildFailedError``), never a reward.  Without a Dockerfile, the convention for
initial workdir contents is the ``environment/`` directory's ``app/`` folder.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harbor.models.task.config import EnvironmentConfig, NetworkMode, TaskConfig, TaskOS
from harbor.models.task.paths import TaskPaths
from harbor.models.task.verifier_mode import (
    resolve_effective_verifier_env_config,
    resolve_verifier_environment_definition,
)

from synth_sandbox.build import DOCKERFILE_NAME, EnvironmentBuild, prepare_build
from synth_sandbox.dockerfiles import dockerfile_plan
from synth_sandbox.paths import DEFAULT_HOST_DIRS, DEFAULT_WRITABLE_DIRS, container_dir_problem

# Base images whose job the host's own userland can do (fnmatch patterns, matched against
# the image name without registry "docker.io/" and "library/" prefixes).
DEFAULT_ALLOWED_IMAGES: tuple[str, ...] = (
    "python",
    "python:3*",
    "debian",
    "debian:*",
    "ubuntu",
    "ubuntu:*",
    "buildpack-deps:*",
)
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
APP_DIR_NAME = "app"  # without a Dockerfile: environment/app/ -> workdir
DEFAULT_WORKDIR = "/app"


class UnsupportedTaskError(ValueError):
    """The task cannot run in the local sandbox (raised before anything starts)."""


@dataclass
class SupportReport:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # What start() applies: the checked Dockerfile (None: none, or a prebuilt docker_image).
    build: EnvironmentBuild | None = None

    @property
    def supported(self) -> bool:
        return not self.problems

    def message(self) -> str | None:
        if not self.problems:
            return None
        return (
            "local sandbox cannot run this task: "
            + "; ".join(self.problems)
            + " (use a container provider such as docker, daytona or modal)"
        )

    def as_json(self) -> dict[str, object]:
        """The verdict as stored with a task version at import."""
        return {"version": 1, "supported": self.supported, "problems": self.problems, "warnings": self.warnings}


def normalize_image(image: str) -> str:
    name = image.strip()
    for prefix in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    if name.startswith("library/"):
        name = name[len("library/") :]
    return name.split("@", 1)[0]


def image_allowed(image: str, allowed: Sequence[str] = DEFAULT_ALLOWED_IMAGES) -> bool:
    name = normalize_image(image)
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in allowed)


def bundled_image_problem(*, image: str) -> str:
    return (
        f"the verifier runs in the prebuilt image {image!r} that bundles the tests ([verifier.environment]"
        ".docker_image); local mode cannot provide that image's /tests"
    )


def dockerfile_workdir(*, environment_dir: Path) -> str | None:
    """The last WORKDIR of environment_dir/Dockerfile, if it has one."""
    dockerfile = environment_dir / DOCKERFILE_NAME
    if not dockerfile.is_file():
        return None
    return dockerfile_plan(text=dockerfile.read_text(errors="replace")).workdir


def task_workdir(*, task_dir: Path) -> str:
    """The task's working directory: ``[environment].workdir``, else the Dockerfile's WORKDIR,
    else /app (what LocalSandboxEnvironment uses as the default cwd)."""
    config = TaskConfig.model_validate_toml((Path(task_dir) / "task.toml").read_text())
    return (
        config.environment.workdir
        or dockerfile_workdir(environment_dir=Path(task_dir) / "environment")
        or DEFAULT_WORKDIR
    )


def _check_resources(report: SupportReport, env: EnvironmentConfig, *, label: str, host_dirs: Sequence[str]) -> None:
    if env.os == TaskOS.WINDOWS:
        report.problems.append(f"{label} requires Windows")
    if env.gpus:
        report.problems.append(f"{label} requires {env.gpus} GPU(s)")
    if env.tpu is not None:
        report.problems.append(f"{label} requires a TPU")
    if env.network_mode == NetworkMode.ALLOWLIST:
        report.problems.append(
            f"{label} asks for an allowlisted network; the local sandbox has no network at all (only the model bridge)"
        )
    if env.workdir:
        problem = container_dir_problem(env.workdir, host_dirs)
        if problem:
            report.problems.append(f"{label} workdir {env.workdir!r}: {problem}")
    if env.mcp_servers:
        report.warnings.append(f"{label} declares MCP servers; only those reachable without network will work")


def _check_environment(
    report: SupportReport,
    env: EnvironmentConfig,
    environment_dir: Path | None,
    *,
    label: str,
    allowed_images: Sequence[str],
    host_dirs: Sequence[str],
    extra_writable_dirs: Sequence[str] = (),
) -> EnvironmentBuild | None:
    _check_resources(report, env, label=label, host_dirs=host_dirs)
    if env.docker_image and not image_allowed(env.docker_image, allowed_images):
        report.problems.append(
            f"{label} needs the image {env.docker_image!r}, which local mode cannot provide "
            f"(allowed base images: {', '.join(allowed_images)})"
        )
    if environment_dir is None or not environment_dir.is_dir():
        return None
    for name in COMPOSE_FILES:
        if (environment_dir / name).exists():
            report.problems.append(
                f"{label} is defined by {environment_dir.name}/{name} (Docker Compose services), which local mode cannot run"
            )
    if env.docker_image:
        if (environment_dir / DOCKERFILE_NAME).is_file():
            # As with Docker: a prebuilt image is used as it is, its Dockerfile is not built.
            report.warnings.append(
                f"{label}: {environment_dir.name}/Dockerfile is not applied ([environment].docker_image is set)"
            )
        return None
    build = prepare_build(
        environment_dir=environment_dir,
        writable_dirs=[*DEFAULT_WRITABLE_DIRS, *extra_writable_dirs],
        host_dirs=host_dirs,
    )
    if build is not None:
        _check_build(report, build, env, label=label, allowed_images=allowed_images, host_dirs=host_dirs)
    return build


def _check_build(
    report: SupportReport,
    build: EnvironmentBuild,
    env: EnvironmentConfig,
    *,
    label: str,
    allowed_images: Sequence[str],
    host_dirs: Sequence[str],
) -> None:
    plan = build.plan
    if plan.base_image is not None and not image_allowed(plan.base_image, allowed_images):
        report.problems.append(
            f"{plan.file} builds FROM {plan.base_image!r}, which local mode cannot provide "
            f"(allowed base images: {', '.join(allowed_images)})"
        )
    report.problems.extend(build.problems)
    if not env.workdir and plan.workdir:
        problem = container_dir_problem(plan.workdir, host_dirs)
        if problem:
            report.problems.append(f"{label}: {plan.file} WORKDIR {plan.workdir!r}: {problem}")
    if plan.ignored:
        lines = ", ".join(f"{i.text.split()[0].upper()} (line {i.line})" for i in plan.ignored)
        report.warnings.append(f"{plan.file}: instructions with no effect on a running sandbox are ignored: {lines}")


def describe_task_support(
    task: Path | str | TaskConfig,
    *,
    allowed_images: Sequence[str] = DEFAULT_ALLOWED_IMAGES,
    host_dirs: Sequence[str] = DEFAULT_HOST_DIRS,
    config: TaskConfig | None = None,
) -> SupportReport:
    """Problems (reasons to reject) and warnings for running a task in the local sandbox.

    ``task`` is a task directory (all checks) or a parsed TaskConfig (no file checks).
    With a directory, ``config`` is its task.toml already parsed (an import has parsed
    it once; parsing it again is a good part of the cost of a check).
    """
    report = SupportReport()
    task_dir: Path | None = None
    if isinstance(task, TaskConfig):
        config = task
    else:
        task_dir = Path(task)
        if config is None:
            config = TaskConfig.model_validate_toml((task_dir / "task.toml").read_text())
    options = {"allowed_images": allowed_images, "host_dirs": host_dirs}
    env_dir = task_dir / "environment" if task_dir is not None else None
    _check_environment(report, config.environment, env_dir, label="the task environment", **options)
    # A separate verifier environment (Harbor's "separate" mode) is another sandbox here,
    # built like any other from its own definition (e.g. tests/Dockerfile, tests bundled).
    if task_dir is not None:
        definition = resolve_verifier_environment_definition(config, TaskPaths(task_dir), validate_inputs=False)
        if definition is not None and definition.bundled_tests and definition.config.docker_image:
            report.problems.append(bundled_image_problem(image=definition.config.docker_image))
        elif definition is not None:
            _check_environment(
                report, definition.config, definition.directory, label="the verifier environment", **options
            )
    else:
        verifier_env = resolve_effective_verifier_env_config(config, None)
        if verifier_env is not None:
            _check_environment(report, verifier_env, None, label="the verifier environment", **options)
    for role, user in (("agent", config.agent.user), ("verifier", config.verifier.user)):
        if user not in (None, "root", 0, "0"):
            report.warnings.append(f"[{role}].user={user!r} is not honoured: everything runs as the sandbox's root")
    # De-duplicate while keeping order (the verifier may share the task environment).
    report.problems = list(dict.fromkeys(report.problems))
    report.warnings = list(dict.fromkeys(report.warnings))
    return report


def check_task_supported(
    task: Path | str | TaskConfig,
    *,
    allowed_images: Sequence[str] = DEFAULT_ALLOWED_IMAGES,
    host_dirs: Sequence[str] = DEFAULT_HOST_DIRS,
) -> str | None:
    """None if the local sandbox can run the task, else a message saying why not."""
    return describe_task_support(task, allowed_images=allowed_images, host_dirs=host_dirs).message()


def check_environment_supported(
    env: EnvironmentConfig,
    environment_dir: Path | None,
    *,
    allowed_images: Sequence[str] = DEFAULT_ALLOWED_IMAGES,
    host_dirs: Sequence[str] = DEFAULT_HOST_DIRS,
    extra_writable_dirs: Sequence[str] = (),
    label: str = "the task environment",
) -> SupportReport:
    """The same checks for one environment definition (used by the Harbor environment); the
    report's ``build`` is what its start() applies."""
    report = SupportReport()
    report.build = _check_environment(
        report,
        env,
        environment_dir,
        label=label,
        allowed_images=allowed_images,
        host_dirs=host_dirs,
        extra_writable_dirs=extra_writable_dirs,
    )
    return report

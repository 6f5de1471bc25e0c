"""Which Harbor tasks the local sandbox can run, decided before anything starts.

Local mode does not build images: commands run on the host's own programs (``/usr``,
``/etc``, ``/opt`` read-only).  A task is therefore rejected when it *needs* an image or
hardware the host cannot stand in for:

* ``environment/docker-compose.yaml`` (several services, sidecars);
* ``[environment].docker_image`` (or the ``FROM`` of ``environment/Dockerfile``, or of a
  separate verifier's ``tests/Dockerfile``) that is not in the allow-list of "generic" base
  images (python, debian, ubuntu by default) whose role the host can play;
* GPUs, TPUs, Windows, an allowlisted network (the sandbox has no network at all);
* a workdir the sandbox cannot provide (inside the host's read-only system directories).

``environment/Dockerfile`` is otherwise informational: its ``RUN``/``COPY`` steps are not
executed (reported as warnings).  The convention for initial workdir contents is the
``environment/app/`` directory of the task, copied into the workdir at start.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harbor.models.task.config import EnvironmentConfig, NetworkMode, TaskConfig, TaskOS
from harbor.models.task.verifier_mode import resolve_effective_verifier_env_config

from apps.runs.sandbox.sandbox import DEFAULT_HOST_DIRS, container_dir_problem

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
APP_DIR_NAME = "app"  # environment/app/ -> workdir


class UnsupportedTaskError(ValueError):
    """The task cannot run in the local sandbox (raised before anything starts)."""


@dataclass
class SupportReport:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

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


@dataclass
class DockerfileSummary:
    base_image: str | None  # FROM of the final stage (None if absent or unresolvable)
    instructions: list[str]  # instruction keywords of the final stage, e.g. ["WORKDIR", "RUN"]
    workdir: str | None


def parse_dockerfile(text: str) -> DockerfileSummary:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    if current:
        lines.append(current)
    base: str | None = None
    instructions: list[str] = []
    workdir: str | None = None
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            args = [a for a in rest.split() if not a.startswith("--")]
            base = args[0] if args else None
            if base and "$" in base:
                base = None  # depends on a build ARG: cannot be judged
            instructions = []
            workdir = None
        elif keyword:
            instructions.append(keyword)
            if keyword == "WORKDIR":
                workdir = rest.strip().strip("\"'") or None
    return DockerfileSummary(base_image=base, instructions=instructions, workdir=workdir)


def _check_environment(
    report: SupportReport,
    env: EnvironmentConfig,
    environment_dir: Path | None,
    *,
    label: str,
    allowed_images: Sequence[str],
    host_dirs: Sequence[str],
) -> None:
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
    if env.docker_image and not image_allowed(env.docker_image, allowed_images):
        report.problems.append(
            f"{label} needs the image {env.docker_image!r}, which local mode cannot provide "
            f"(allowed base images: {', '.join(allowed_images)})"
        )
    if env.workdir:
        problem = container_dir_problem(env.workdir, host_dirs)
        if problem:
            report.problems.append(f"{label} workdir {env.workdir!r}: {problem}")
    if env.mcp_servers:
        report.warnings.append(f"{label} declares MCP servers; only those reachable without network will work")
    if environment_dir is None or not environment_dir.is_dir():
        return
    for name in COMPOSE_FILES:
        if (environment_dir / name).exists():
            report.problems.append(
                f"{label} is defined by {environment_dir.name}/{name} (Docker Compose services), which local mode cannot run"
            )
    dockerfile = environment_dir / "Dockerfile"
    if dockerfile.is_file():
        summary = parse_dockerfile(dockerfile.read_text(errors="replace"))
        if summary.base_image is None:
            report.problems.append(f"{label}: {environment_dir.name}/Dockerfile has no FROM that local mode can judge")
        elif not image_allowed(summary.base_image, allowed_images):
            report.problems.append(
                f"{label}: {environment_dir.name}/Dockerfile builds FROM {summary.base_image!r}, which local mode cannot "
                f"provide (allowed base images: {', '.join(allowed_images)})"
            )
        ignored = sorted({i for i in summary.instructions if i in ("RUN", "ADD", "USER", "ENTRYPOINT", "CMD")})
        if ignored:
            report.warnings.append(
                f"{label}: Dockerfile {', '.join(ignored)} instructions are not executed in local mode "
                f"(the host's tools are used; initial files come from {environment_dir.name}/{APP_DIR_NAME}/)"
            )
        if not env.workdir and summary.workdir:
            problem = container_dir_problem(summary.workdir, host_dirs)
            if problem:
                report.problems.append(f"{label}: Dockerfile WORKDIR {summary.workdir!r}: {problem}")


def describe_task_support(
    task: Path | str | TaskConfig,
    *,
    allowed_images: Sequence[str] = DEFAULT_ALLOWED_IMAGES,
    host_dirs: Sequence[str] = DEFAULT_HOST_DIRS,
) -> SupportReport:
    """Problems (reasons to reject) and warnings for running a task in the local sandbox.

    ``task`` is a task directory (all checks) or a parsed TaskConfig (no file checks).
    """
    report = SupportReport()
    task_dir: Path | None = None
    if isinstance(task, TaskConfig):
        config = task
    else:
        task_dir = Path(task)
        config = TaskConfig.model_validate_toml((task_dir / "task.toml").read_text())
    env_dir = task_dir / "environment" if task_dir is not None else None
    _check_environment(
        report,
        config.environment,
        env_dir,
        label="the task environment",
        allowed_images=allowed_images,
        host_dirs=host_dirs,
    )
    # A separate verifier environment (Harbor's "separate" mode) is another sandbox here.
    verifier_env = resolve_effective_verifier_env_config(config, None)
    if verifier_env is not None:
        tests_dir = task_dir / "tests" if task_dir is not None else None
        if tests_dir is not None and any((tests_dir / n).is_file() for n in ("Dockerfile", *COMPOSE_FILES)):
            report.problems.append(
                "the verifier runs in an image built from tests/Dockerfile (tests bundled into the image), "
                "which local mode cannot build"
            )
        _check_environment(
            report,
            verifier_env,
            None,
            label="the verifier environment",
            allowed_images=allowed_images,
            host_dirs=host_dirs,
        )
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
) -> SupportReport:
    """The same checks for one environment definition (used by the Harbor environment)."""
    report = SupportReport()
    _check_environment(
        report, env, environment_dir, label="the task environment", allowed_images=allowed_images, host_dirs=host_dirs
    )
    return report

"""Harbor task folders -> parsed config + canonical archive. Pure: no database, no store.

Parsing and validation are delegated to the `harbor` package's own models
(`TaskConfig`, `Task`, `DatasetSpec`) so that whatever Harbor accepts at run time is
what we accept at import time; this module only turns Harbor's exceptions into
messages that name the file and the problem ("hello/task.toml: line 3: ...").
task.toml's own checks are in apps.datasets.task_config, the archive's bytes in
apps.datasets.task_archives.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from apps.datasets.errors import TaskFormatError
from apps.datasets.task_archives import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_TASK_BYTES,
    ArchiveEntry,
    canonical_tar,
    task_entries_collect,
)
from apps.datasets.task_config import loc_format, pydantic_problems, task_config_parse
from synth_common.canonical import canonical_digest, sha256_hex

TASK_NAME_MAX = 200
DOCKER_IMAGE_MAX = 300


@dataclass(frozen=True)
class ParsedTask:
    """Everything the database needs about one task, computed from its folder."""

    name: str
    config: Any  # harbor.models.task.config.TaskConfig
    config_json: dict[str, Any]
    instruction: str
    has_dockerfile: bool
    has_solution: bool
    archive: bytes
    digest: str  # sha256 of `archive`
    files: tuple[str, ...] = field(default=())
    # The local sandbox's verdict (synth_sandbox.support): a task it cannot run is still
    # imported (other environments may run it), and runs in the local sandbox refuse it early.
    local_support: dict[str, Any] = field(default_factory=dict)

    @property
    def agent_timeout_sec(self) -> float | None:
        return self.config.agent.timeout_sec

    @property
    def verifier_timeout_sec(self) -> float:
        return float(self.config.verifier.timeout_sec)

    @property
    def cpus(self) -> float:
        cpus = self.config.environment.cpus
        return float(cpus) if cpus is not None else 1.0

    @property
    def memory_mb(self) -> int:
        return self.config.environment.memory_mb or 2048

    @property
    def storage_mb(self) -> int:
        return self.config.environment.storage_mb or 10240

    @property
    def docker_image(self) -> str:
        return self.config.environment.docker_image or ""


# ---------------------------------------------------------------------------
# One task
# ---------------------------------------------------------------------------
def _read_text(path: Path, *, where: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TaskFormatError(where, "not valid UTF-8 text") from None
    except IsADirectoryError:
        raise TaskFormatError(where, "is a directory, expected a file") from None


def task_dir_parse(
    task_dir: Path,
    *,
    label: str | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_task_bytes: int = DEFAULT_MAX_TASK_BYTES,
) -> ParsedTask:
    """Validate a Harbor task folder and build its canonical archive.

    `label` prefixes every message (default: the folder name), so that a problem in a
    dataset of many tasks reads "hello/tests/test.sh: missing".
    """
    from harbor.models.task.file_filter import TaskFileFilter
    from harbor.models.task.paths import TaskPaths
    from harbor.models.task.task import Task, strip_canary

    from synth_sandbox.support import describe_task_support

    task_dir = Path(task_dir)
    label = label or task_dir.name
    if not task_dir.is_dir():
        raise TaskFormatError(label, "not a directory")
    paths = TaskPaths(task_dir)

    if not paths.config_path.is_file():
        raise TaskFormatError(f"{label}/task.toml", "missing")
    config, config_json = task_config_parse(
        _read_text(paths.config_path, where=f"{label}/task.toml"), where=f"{label}/task.toml"
    )

    if not config.environment.docker_image and not paths.environment_dir.is_dir():
        raise TaskFormatError(f"{label}/environment/", "missing (required unless [environment].docker_image is set)")
    if not config.steps:
        if not paths.instruction_path.is_file():
            raise TaskFormatError(f"{label}/instruction.md", "missing")
        _read_text(paths.instruction_path, where=f"{label}/instruction.md")

    # Walk before Harbor looks at the tree, so an escaping symlink is reported by us
    # (with the file name) rather than as a resolved absolute path from Harbor.
    skipped: list[str] = []
    entries = task_entries_collect(
        task_dir, label=label, max_file_bytes=max_file_bytes, max_task_bytes=max_task_bytes, skipped=skipped
    )

    # Harbor's own checks, on the config parsed above: the ones Task(task_dir) and
    # Task.is_valid_dir (its discovery predicate) make, each made once. Building a Task
    # would parse task.toml again and walk the inputs twice more.
    resolved = TaskPaths(task_dir.resolve())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not _harbor_checks_trivially_pass(config, resolved, entries=entries, skipped=skipped):
                file_filter = TaskFileFilter(resolved.task_dir)
                Task._validate_input_paths(config, resolved, file_filter=file_filter)
                Task._validate_tests(config, resolved, file_filter=file_filter)
            instruction = "" if config.steps else strip_canary(resolved.instruction_path.read_text())
    except FileNotFoundError as exc:
        raise _harbor_missing(exc, config=config, paths=paths, label=label) from None
    except (ValueError, OSError, RuntimeError) as exc:
        raise TaskFormatError(label, _relabel(str(exc), task_dir, label)) from None

    name = str(config.task.name if config.task is not None else resolved.task_dir.name)
    if len(name) > TASK_NAME_MAX:
        raise TaskFormatError(f"{label}/task.toml", f"[task].name is longer than {TASK_NAME_MAX} characters")
    if len(config.environment.docker_image or "") > DOCKER_IMAGE_MAX:
        raise TaskFormatError(
            f"{label}/task.toml", f"[environment].docker_image is longer than {DOCKER_IMAGE_MAX} characters"
        )

    archive = canonical_tar(entries)
    return ParsedTask(
        name=name,
        config=config,
        config_json=config_json,
        instruction=instruction,
        has_dockerfile=(paths.environment_dir / "Dockerfile").is_file(),
        has_solution=paths.discovered_solve_path_for(config.environment.os) is not None,
        archive=archive,
        digest=sha256_hex(archive),
        files=tuple(e.path for e in entries if e.kind == "file"),
        local_support=describe_task_support(task_dir, config=config).as_json(),
    )


def _harbor_checks_trivially_pass(config: Any, paths: Any, *, entries: list[ArchiveEntry], skipped: list[str]) -> bool:
    """True when Harbor's input checks (Task._validate_input_paths, Task._validate_tests)
    cannot fail on this task, so that their walks (a resolve() and an ignore-rules match
    per path, the larger part of a task's parse) can be left out.

    That holds for a single-step task whose tree, as walked by task_entries_collect, has
    no symlink, no .harborignore and nothing left out of the walk, and whose test script
    Harbor finds: without links every input resolves inside the task and no directory
    link can cycle; without ignore rules nothing is excluded, so the test script is
    included. Anything else returns False and Harbor's own checks run (and word the
    error), so the outcome is Harbor's either way.
    """
    from harbor.models.task.file_filter import TaskFileFilter
    from harbor.models.task.verifier_mode import resolve_verifier_environment_definition

    if config.steps or skipped:
        return False
    for entry in entries:
        if entry.kind == "symlink" or entry.path.rsplit("/", 1)[-1] == TaskFileFilter.IGNORE_FILENAME:
            return False
    # Task._validate_tests, single-step branch, with the input walks it would make known
    # to pass (above).
    if not paths.instruction_path.exists():
        return False
    definition = resolve_verifier_environment_definition(config, paths, validate_inputs=False)
    if definition is not None and definition.bundled_tests:
        return True
    verifier_os = definition.config.os if definition else config.environment.os
    return paths.discovered_test_path_for(verifier_os) is not None


def task_dir_parse_in_worker(task_dir: Path, label: str, limits: dict[str, int]) -> ParsedTask:
    """`task_dir_parse` with positional arguments, as a process pool's map passes them."""
    return task_dir_parse(task_dir, label=label, **limits)


def task_dirs_parse_in_worker(
    task_dirs: list[Path], labels: list[str], limits: dict[str, int]
) -> list[ParsedTask | TaskFormatError]:
    """`task_dir_parse` of each folder, in a worker process: a refused folder's error is
    returned in its place, so the caller can name the first refused one in its own order."""
    out: list[ParsedTask | TaskFormatError] = []
    for task_dir, label in zip(task_dirs, labels, strict=True):
        try:
            out.append(task_dir_parse(task_dir, label=label, **limits))
        except TaskFormatError as exc:
            out.append(exc)
    return out


def _relabel(message: str, task_dir: Path, label: str) -> str:
    """Harbor's messages carry absolute paths of (possibly temporary) folders; show the label."""
    for prefix in {str(task_dir.resolve()), str(task_dir.absolute()), str(task_dir)}:
        message = message.replace(prefix, label)
    return message


def _harbor_missing(exc: FileNotFoundError, *, config: Any, paths: Any, label: str) -> TaskFormatError:
    """Turn Harbor's FileNotFoundError into "<label>/<file>: missing" where we can tell which."""
    if not config.steps:
        test_path = paths.discovered_test_path_for(config.environment.os)
        if test_path is None:
            expected = paths.test_path_for(config.environment.os).relative_to(paths.task_dir)
            return TaskFormatError(f"{label}/{expected.as_posix()}", "missing")
    return TaskFormatError(label, _relabel(str(exc), paths.task_dir, label))


# ---------------------------------------------------------------------------
# Folders of tasks, registries
# ---------------------------------------------------------------------------
def task_dirs_discover(path: Path) -> list[Path]:
    """Immediate subfolders holding a task.toml, sorted by name (Harbor's local dataset order).

    A subfolder with task.toml that Harbor would reject is returned too (and then fails
    to parse with a message): silently dropping a broken task would change the dataset.
    """
    path = Path(path)
    if not path.is_dir():
        raise TaskFormatError(str(path), "not a directory")
    found = [
        child
        for child in sorted(path.iterdir(), key=lambda p: p.name)
        if child.is_dir() and not child.name.startswith(".") and (child / "task.toml").is_file()
    ]
    if not found:
        hint = " (this folder is itself a task; import its parent folder)" if (path / "task.toml").is_file() else ""
        raise TaskFormatError(path.name or str(path), f"no task folders found (a task folder holds task.toml){hint}")
    return found


@dataclass(frozen=True)
class RegistryTask:
    name: str
    path: Path


def registry_parse(data: bytes, *, where: str = "registry.json") -> list[Any]:
    """A Harbor legacy registry (JSON list of DatasetSpec), validated with Harbor's model."""
    from harbor.models.registry import DatasetSpec

    try:
        raw = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise TaskFormatError(where, "not valid UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise TaskFormatError(where, f"line {exc.lineno}, column {exc.colno}: invalid JSON: {exc.msg}") from None
    if not isinstance(raw, list):
        raise TaskFormatError(where, "expected a JSON list of datasets ({name, version, description, tasks})")
    specs = []
    for i, row in enumerate(raw):
        try:
            specs.append(DatasetSpec.model_validate(row))
        except ValidationError as exc:
            loc, message = pydantic_problems(exc, row)[0]
            raise TaskFormatError(where, f"{loc_format((i, *loc))}: {message}") from None
    return specs


def registry_tasks_resolve(
    specs: list[Any],
    *,
    name: str,
    version: str,
    base_dir: Path,
    confine_to: Path | None = None,
    where: str = "registry.json",
) -> list[RegistryTask]:
    """The local task folders of the dataset `name@version` in a registry.

    The spec is chosen by name and version; a registry holding exactly one dataset is
    taken whatever its label (the caller names the imported version). Paths are relative
    to the registry file; with `confine_to` (uploads) they must stay inside that folder.
    """
    chosen = [s for s in specs if s.name == name and s.version == version]
    if not chosen and len(specs) == 1:
        chosen = specs
    if not chosen:
        available = ", ".join(f"{s.name}@{s.version}" for s in specs) or "none"
        raise TaskFormatError(where, f"no dataset {name}@{version} (available: {available})")
    spec = chosen[0]
    tasks: list[RegistryTask] = []
    for i, entry in enumerate(spec.tasks):
        at = f"{where}: {spec.name}@{spec.version}: tasks[{i}] ({entry.name})"
        if entry.git_url:
            raise TaskFormatError(
                at,
                f"git_url {entry.git_url} is not supported (no network access at import); "
                "check the task out and reference it with a local path",
            )
        path = Path(entry.path)
        path = path if path.is_absolute() else base_dir / path
        resolved = path.resolve()
        if confine_to is not None and not resolved.is_relative_to(confine_to.resolve()):
            raise TaskFormatError(at, f"path {entry.path} points outside the uploaded archive")
        if not resolved.is_dir():
            raise TaskFormatError(at, f"path {entry.path} is not a folder")
        tasks.append(RegistryTask(name=entry.name, path=resolved))
    if not tasks:
        raise TaskFormatError(where, f"dataset {spec.name}@{spec.version} lists no tasks")
    return tasks


def dataset_digest(task_digests: list[str]) -> str:
    """sha256 over the canonical JSON list of task digests, in dataset order."""
    return canonical_digest(list(task_digests))

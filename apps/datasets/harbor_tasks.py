"""Harbor task folders -> parsed config + canonical archive. Pure: no database, no store.

Parsing and validation are delegated to the `harbor` package's own models
(`TaskConfig`, `Task`, `DatasetSpec`) so that whatever Harbor accepts at run time is
what we accept at import time; this module only turns Harbor's exceptions into
messages that name the file and the problem ("hello/task.toml: line 3: ...").

The canonical archive is a plain (uncompressed) POSIX tar whose bytes depend only on
the task's content: entries sorted by path, mtime 0, uid/gid 0, no owner names, and
modes normalised to 0755 (directories, executables) / 0644 (other files). Plain tar
rather than tar.gz because compressed bytes depend on the zlib build, which would
make the same task hash differently on two machines.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import stat
import tarfile
import tomllib
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from synth_common.canonical import canonical_digest, sha256_hex

# Defaults for the size limits; the services read the effective values from settings.
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_TASK_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_ARCHIVE_MEMBERS = 100_000

ARCHIVE_CONTENT_TYPE = "application/x-tar"

# Left out of the archive: they change with every checkout or interpreter run (pyc files
# embed source mtimes) without changing the task, and would otherwise break digest
# stability. Harbor's own packager ignores the same kind of files.
_SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
_SKIP_FILES = frozenset({".DS_Store"})
_SKIP_SUFFIXES = (".pyc", ".pyo")

TASK_NAME_MAX = 200
DOCKER_IMAGE_MAX = 300
_NOT_TEXT = re.compile("[\x00\ud800-\udfff]")


class TaskFormatError(ValueError):
    """A task (or registry) that Harbor would not accept; str() is the user-facing message."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


@dataclass(frozen=True)
class ArchiveEntry:
    path: str  # posix, relative to the task root
    kind: str  # "dir" | "file" | "symlink"
    mode: int
    data: bytes = b""
    link: str = ""


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
# task.toml
# ---------------------------------------------------------------------------
_TOML_POS = re.compile(r"^(?P<msg>.*?)\s*\(at line (?P<line>\d+), column (?P<col>\d+)\)$")
_TOML_HEADER = re.compile(r"^\s*\[\[?\s*(?P<name>[^\]]+?)\s*\]\]?\s*(#.*)?$")
_TOML_KEY = re.compile(r"""^\s*(?P<key>[A-Za-z0-9_\-]+|"[^"]*"|'[^']*')\s*=""")


def _toml_key_line(text: str, path: tuple[str, ...]) -> int | None:
    """Best-effort line number of the key at `path` ("environment", "cpus") in TOML text.

    Pydantic reports a location in the parsed data, not in the file; users want a line.
    Only `[table]` headers and bare or quoted keys are recognised, which covers task.toml
    as Harbor documents it; anything else falls back to the enclosing table, or no line.
    """
    if not path:
        return None
    lines = text.splitlines()
    table, key = ".".join(path[:-1]), path[-1]
    current = ""
    for number, line in enumerate(lines, start=1):
        header = _TOML_HEADER.match(line)
        if header:
            current = ".".join(part.strip().strip("\"'") for part in header["name"].split("."))
            if current == ".".join(path):
                return number
            continue
        match = _TOML_KEY.match(line)
        if match and current == table and match["key"].strip("\"'") == key:
            return number
    return _toml_key_line(text, path[:-1])


def _data_path(data: Any, loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Split a pydantic loc into (the part that exists in the input, the rest).

    For a union field pydantic appends the member it tried (`cpus.int`, `cpus.float`);
    those tags are not keys of the input and are reported as "expected int or float".
    """
    real: list[Any] = []
    node = data
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            return tuple(real), tuple(loc[i:])
        real.append(part)
    return tuple(real), ()


def _format_loc(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def pydantic_problems(exc: ValidationError, data: Any) -> list[tuple[tuple[Any, ...], str]]:
    """(input location, message) pairs, one per offending input value, in order."""
    grouped: dict[tuple[Any, ...], list[tuple[tuple[Any, ...], dict[str, Any]]]] = {}
    for error in exc.errors():
        real, rest = _data_path(data, tuple(error["loc"]))
        grouped.setdefault(real, []).append((rest, error))
    problems: list[tuple[tuple[Any, ...], str]] = []
    for real, errors in grouped.items():
        rest, first = errors[0]
        value = first.get("input")
        got = f" (got {value!r})" if isinstance(value, (str, int, float, bool)) else ""
        if first["type"] == "missing":
            # The missing key is not in the input, so it is in `rest`.
            problems.append((real + rest, "required but missing"))
        elif len(errors) > 1 and all(len(r) == 1 and isinstance(r[0], str) for r, _ in errors):
            tags = " or ".join(dict.fromkeys(str(r[0]) for r, _ in errors))
            problems.append((real, f"expected {tags}{got}"))
        else:
            message = str(first["msg"]).removeprefix("Value error, ")
            # Harbor's own validators often quote the value already.
            problems.append((real, message if str(value) in message else f"{message}{got}"))
    return problems


def task_config_parse(text: str, *, where: str) -> tuple[Any, dict[str, Any]]:
    """Parse task.toml text with Harbor's TaskConfig; raise TaskFormatError naming the line."""
    from harbor.models.task.config import TaskConfig

    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = _TOML_POS.match(str(exc))
        if match:
            raise TaskFormatError(
                where, f"line {match['line']}, column {match['col']}: invalid TOML: {match['msg']}"
            ) from None
        raise TaskFormatError(where, f"invalid TOML: {exc}") from None
    try:
        with warnings.catch_warnings():
            # Legacy keys (memory = "2G", allow_internet) are accepted with a warning.
            warnings.simplefilter("ignore")
            config = TaskConfig.model_validate(raw)
    except ValidationError as exc:
        messages = []
        for loc, message in pydantic_problems(exc, raw):
            str_loc = tuple(str(p) for p in loc)
            line = _toml_key_line(text, str_loc) if str_loc else None
            prefix = f"line {line}: " if line else ""
            label = _toml_label(loc)
            messages.append(f"{prefix}{label}: {message}" if label else f"{prefix}{message}")
        raise TaskFormatError(where, "; ".join(messages)) from None
    except ValueError as exc:  # a model validator that raised outside pydantic's wrapping
        raise TaskFormatError(where, str(exc)) from None
    _numbers_check(config.model_dump(), text=text, where=where)
    return config, config.model_dump(mode="json")


# Harbor's models take any number here; a task that asks for -1 MB or a 0 s timeout can
# never run, so it is refused at import, naming the key. Every *_sec is a duration.
_POSITIVE_KEYS = frozenset({"cpus", "memory_mb", "storage_mb"})
_NON_NEGATIVE_KEYS = frozenset({"gpus", "retries", "start_period_sec"})
_MEGABYTES_MAX = 2**31 - 1  # memory_mb and storage_mb are stored as 32-bit integers


def _numbers(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], float]]:
    """(location, value) of every number in a dumped config."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _numbers(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _numbers(value, (*path, i))
    elif isinstance(node, int | float) and not isinstance(node, bool):
        yield path, node


def _number_problem(path: tuple[Any, ...], value: float) -> str | None:
    if not math.isfinite(value):
        return "must be a finite number"  # TOML has inf and nan; JSON (and the database) has not
    key = path[-1] if isinstance(path[-1], str) else ""
    if path[0] == "metadata":
        return None  # the author's own data
    if key in _NON_NEGATIVE_KEYS:
        return "must not be negative" if value < 0 else None
    if key in _POSITIVE_KEYS or key.endswith("_sec"):
        if value <= 0:
            return "must be positive"
    if key.endswith("_mb") and value > _MEGABYTES_MAX:
        return f"must be at most {_MEGABYTES_MAX}"
    return None


def _numbers_check(dumped: dict[str, Any], *, text: str, where: str) -> None:
    messages = []
    for path, value in _numbers(dumped):
        problem = _number_problem(path, value)
        if problem:
            line = _toml_key_line(text, tuple(str(p) for p in path))
            prefix = f"line {line}: " if line else ""
            messages.append(f"{prefix}{_toml_label(path)}: {problem} (got {value!r})")
    if messages:
        raise TaskFormatError(where, "; ".join(messages))


def _toml_label(loc: tuple[Any, ...]) -> str:
    """("environment", "cpus") -> "[environment].cpus"; ("steps", 0, "name") -> "steps[0].name"."""
    if not loc:
        return ""
    if len(loc) == 1 or any(isinstance(p, int) for p in loc):
        return _format_loc(loc)
    return f"[{'.'.join(str(p) for p in loc[:-1])}].{loc[-1]}"


# ---------------------------------------------------------------------------
# Walking the task folder -> canonical archive
# ---------------------------------------------------------------------------
def _skipped(name: str, is_dir: bool) -> bool:
    if is_dir:
        return name in _SKIP_DIRS
    return name in _SKIP_FILES or name.endswith(_SKIP_SUFFIXES)


def task_entries_collect(
    task_dir: Path,
    *,
    label: str,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_task_bytes: int = DEFAULT_MAX_TASK_BYTES,
) -> list[ArchiveEntry]:
    """Every file, directory and internal symlink of the task, sorted by path.

    Symlinks are kept as links (relative, so they still work after extraction) only when
    they point inside the task; a link that escapes the task, or dangles, is rejected
    because its meaning would depend on the importing machine.
    """
    root = task_dir.resolve()
    entries: list[ArchiveEntry] = []
    total = 0
    stack = [root]
    while stack:
        directory = stack.pop()
        with os.scandir(directory) as it:
            children = sorted(it, key=lambda e: e.name)
        for child in children:
            path = Path(child.path)
            rel = path.relative_to(root).as_posix()
            where = f"{label}/{rel}"
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                raise TaskFormatError(where, "file name is not valid UTF-8") from None
            st = child.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(path)
                resolved = (path.parent / target).resolve()
                if not resolved.is_relative_to(root):
                    raise TaskFormatError(where, f"symlink points outside the task ({target})")
                if not resolved.exists():
                    raise TaskFormatError(where, f"symlink target does not exist ({target})")
                link = os.path.relpath(resolved, path.parent.resolve())
                entries.append(ArchiveEntry(path=rel, kind="symlink", mode=0o777, link=Path(link).as_posix()))
            elif stat.S_ISDIR(st.st_mode):
                if _skipped(child.name, True):
                    continue
                entries.append(ArchiveEntry(path=rel, kind="dir", mode=0o755))
                stack.append(path)
            elif stat.S_ISREG(st.st_mode):
                if _skipped(child.name, False):
                    continue
                if st.st_size > max_file_bytes:
                    raise TaskFormatError(
                        where, f"file is {st.st_size} bytes, over the limit of {max_file_bytes} bytes"
                    )
                total += st.st_size
                if total > max_task_bytes:
                    raise TaskFormatError(label, f"task content is over the limit of {max_task_bytes} bytes")
                data = path.read_bytes()
                mode = 0o755 if st.st_mode & 0o111 else 0o644
                entries.append(ArchiveEntry(path=rel, kind="file", mode=mode, data=data))
            else:
                raise TaskFormatError(where, "not a regular file, directory or symlink")
    entries.sort(key=lambda e: e.path)
    return entries


def canonical_tar(entries: Iterable[ArchiveEntry]) -> bytes:
    """The deterministic tar of `entries` (already sorted): same content -> same bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.path)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = entry.mode
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = entry.link
                tar.addfile(info)
            else:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
    return buf.getvalue()


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
    from harbor.models.task.paths import TaskPaths
    from harbor.models.task.task import Task

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
    entries = task_entries_collect(task_dir, label=label, max_file_bytes=max_file_bytes, max_task_bytes=max_task_bytes)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            task = Task(task_dir)
    except FileNotFoundError as exc:
        raise _harbor_missing(exc, config=config, paths=paths, label=label) from None
    except (ValueError, OSError, RuntimeError) as exc:
        raise TaskFormatError(label, _relabel(str(exc), task_dir, label)) from None
    # Harbor's own discovery predicate; a folder it would silently skip is not a task.
    if not Task.is_valid_dir(task_dir):
        raise TaskFormatError(label, "not a valid Harbor task directory")

    name = str(task.name)
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
        instruction=task.instruction,
        has_dockerfile=(paths.environment_dir / "Dockerfile").is_file(),
        has_solution=paths.discovered_solve_path_for(config.environment.os) is not None,
        archive=archive,
        digest=sha256_hex(archive),
        files=tuple(e.path for e in entries if e.kind == "file"),
        local_support=describe_task_support(task_dir).as_json(),
    )


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
# Folders of tasks, registries, uploaded archives
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
            raise TaskFormatError(where, f"{_format_loc((i, *loc))}: {message}") from None
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


def archive_extract(
    fileobj: IO[bytes],
    dest: Path,
    *,
    max_member_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_total_bytes: int = DEFAULT_MAX_TASK_BYTES,
    max_members: int = DEFAULT_MAX_ARCHIVE_MEMBERS,
    where: str = "archive",
) -> Path:
    """Safely unpack an uploaded tar / tar.gz into `dest` and return the dataset root.

    Sizes are checked from the headers before anything is written (a small gzip can
    expand enormously); Python's "data" extraction filter refuses absolute paths, `..`,
    links leaving `dest` and device files. A single top-level folder is descended into,
    since `tar czf x.tgz mytasks/` is the natural way to pack a folder of tasks.
    """
    try:
        with tarfile.open(fileobj=fileobj, mode="r:*") as tar:
            members = []
            total = 0
            for member in tar:
                _member_names_check(member, where=where)
                members.append(member)
                if len(members) > max_members:
                    raise TaskFormatError(where, f"more than {max_members} entries")
                if member.isfile():
                    if member.size > max_member_bytes:
                        raise TaskFormatError(
                            f"{where}: {member.name}",
                            f"file is {member.size} bytes, over the limit of {max_member_bytes} bytes",
                        )
                    total += member.size
                    if total > max_total_bytes:
                        raise TaskFormatError(where, f"content is over the limit of {max_total_bytes} bytes")
            for member in members:
                try:
                    tar.extract(member, dest, filter="data")
                except tarfile.FilterError as exc:
                    raise TaskFormatError(f"{where}: {member.name}", _filter_reason(exc)) from None
    except tarfile.ReadError as exc:
        raise TaskFormatError(where, f"not a readable tar or tar.gz file ({exc})") from None
    except EOFError:
        raise TaskFormatError(where, "truncated archive") from None
    return archive_root(dest)


def _member_names_check(member: tarfile.TarInfo, *, where: str) -> None:
    """A name that is not UTF-8 (tarfile keeps its bytes as lone surrogates) or holds a NUL
    could not be stored, shown or extracted; it is refused, shown with its bytes escaped."""
    for label, name in (("file name", member.name), ("link target", member.linkname)):
        match = _NOT_TEXT.search(name)
        if match:
            problem = "contains a NUL character" if match.group() == "\x00" else "is not valid UTF-8"
            raise TaskFormatError(f"{where}: {_escaped(name)}", f"{label} {problem}")


def _escaped(name: str) -> str:
    """The name's bytes as text, undecodable ones escaped ("caf\\xe9")."""
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that is not an undecodable byte
        return name.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace").replace("\x00", "\\x00")


def _filter_reason(exc: tarfile.FilterError) -> str:
    if isinstance(exc, (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError)):
        return "link points outside the archive"
    if isinstance(exc, (tarfile.AbsolutePathError, tarfile.OutsideDestinationError)):
        return "path points outside the archive"
    if isinstance(exc, tarfile.SpecialFileError):
        return "special files (devices, fifos) are not allowed"
    return str(exc)


def archive_root(dest: Path) -> Path:
    """`dest`, or its only child folder when the archive wrapped everything in one."""
    children = [c for c in dest.iterdir() if not c.name.startswith(".")]
    if (
        len(children) == 1
        and children[0].is_dir()
        and not children[0].is_symlink()
        and not (children[0] / "task.toml").exists()
    ):
        return children[0]
    return dest


def dataset_digest(task_digests: list[str]) -> str:
    """sha256 over the canonical JSON list of task digests, in dataset order."""
    return canonical_digest(list(task_digests))


def archive_unpack(data: bytes, dest: Path) -> Path:
    """Materialise a canonical task archive (e.g. for a sandbox) into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        tar.extractall(dest, filter="data")
    return dest

"""Building a local sandbox from a Dockerfile: the build context, the checks made before
anything starts, and the steps applied at environment set-up.

The build context is the directory holding the Dockerfile (``environment/``, or ``tests/``
for Harbor's separate verifier), filtered by its ``.dockerignore`` with Docker's rules.
Before start (``prepare_build``) every refusal is known: instructions the sandbox cannot
apply (dockerfiles.py), ``COPY`` sources missing from the context or outside it, and
destinations inside the host's read-only system directories.  A destination in another
top-level directory (``/data``, ``/srv``, ...) becomes a writable directory of the sandbox.
At start (``apply_build``) the steps run in order inside the started sandbox: ``WORKDIR``
creates its directory, ``COPY``/``ADD`` copy host-side (symlink-safe, see hostfs.py), ``RUN``
executes with no network and its leftover processes killed, as when a build step ends.
A failing ``RUN`` raises Harbor's ``SandboxBuildFailedError`` (an environment error, never
graded) naming the instruction and the end of its output.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import re
import shlex
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from harbor.environments.base import SandboxBuildFailedError

from synth_common.canonical import canonical_digest, sha256_hex
from synth_sandbox.dockerfiles import CopyStep, DockerfilePlan, RunStep, WorkdirStep, dockerfile_plan
from synth_sandbox.paths import SANDBOX_PATH, container_dir_problem
from synth_sandbox.sandbox import Sandbox

DOCKERFILE_NAME = "Dockerfile"
DOCKERIGNORE_NAME = ".dockerignore"
OUTPUT_TAIL_LINES = 20
_GLOB_CHARS = re.compile(r"[*?\[]")
_REGEX_SPECIALS = frozenset(".+()|{}$^")

EntryKind = Literal["dir", "file", "symlink"]


class BuildContextError(ValueError):
    """A COPY/ADD source that is not in the build context."""


# --------------------------------------------------------------------------- .dockerignore


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as moby's patternmatcher compiles it (``**`` any depth,
    ``*``/``?`` never across ``/``, ``\\`` escapes the next character)."""
    out = ["^"]
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        i += 1
        if ch == "*" and pattern[i : i + 1] == "*":
            i += 1
            if pattern[i : i + 1] == "/":
                i += 1
            out.append(".*" if i >= len(pattern) else "(.*/)?")
        elif ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "\\" and i < len(pattern):
            out.append(re.escape(pattern[i]))
            i += 1
        elif ch in _REGEX_SPECIALS or ch == "\\":
            out.append("\\" + ch)
        else:
            out.append(ch)
    out.append("$")
    return re.compile("".join(out))


@dataclass(frozen=True)
class IgnoreRules:
    """The patterns of a .dockerignore file: the last matching one decides (``!`` re-includes),
    and a pattern matching a parent directory matches what is inside it."""

    patterns: tuple[tuple[re.Pattern[str], bool], ...] = ()  # (regex, exclusion)

    @classmethod
    def parse(cls, text: str) -> IgnoreRules:
        patterns = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            invert = line.startswith("!")
            line = line[1:].strip() if invert else line
            if not line:
                continue
            cleaned = posixpath.normpath(line)
            if len(cleaned) > 1 and cleaned.startswith("/"):
                cleaned = cleaned.lstrip("/")
            patterns.append((_pattern_regex(cleaned), invert))
        return cls(tuple(patterns))

    def excluded(self, rel: str) -> bool:
        parts = rel.split("/")
        parents = ["/".join(parts[: i + 1]) for i in range(len(parts) - 1)]
        matched = False
        for regex, invert in self.patterns:
            if invert != matched:
                continue  # cannot change the outcome
            if regex.match(rel) or any(regex.match(p) for p in parents):
                matched = not invert
        return matched


# --------------------------------------------------------------------------- build context


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """Go's filepath.Match as a regex over a whole relative path (``*`` never crosses ``/``)."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        i += 1
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                raise BuildContextError(f"bad pattern {pattern!r} (unclosed '[')")
            body = pattern[i:end]
            out.append("[" + ("^" + body[1:] if body.startswith(("^", "!")) else body).replace("\\", "\\\\") + "]")
            i = end + 1
        elif ch == "\\" and i < len(pattern):
            out.append(re.escape(pattern[i]))
            i += 1
        else:
            out.append(re.escape(ch))
    return re.compile("".join(out))


class BuildContext:
    """The directory of a Dockerfile as Docker sends it: every entry .dockerignore keeps."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        ignore_file = self.root / DOCKERIGNORE_NAME
        text = ignore_file.read_text(errors="replace") if ignore_file.is_file() else ""
        self.ignore = IgnoreRules.parse(text)
        self.entries: dict[str, EntryKind] = {"": "dir"}
        self._scan()

    def _scan(self) -> None:
        # Paths as strings: a dataset push scans every task's context, and pathlib joins
        # per entry cost more than the lstat they wrap.
        prefix = os.path.join(str(self.root), "")
        for dirpath, dirnames, filenames in os.walk(self.root):
            base = os.path.join(dirpath, "")[len(prefix) :].rstrip("/")
            for name in [*dirnames, *filenames]:
                rel = f"{base}/{name}" if base else name
                kind = _kind(os.path.join(dirpath, name))
                if kind is None or self.ignore.excluded(rel):
                    continue
                self.entries[rel] = kind
                # A re-included entry of an excluded directory still has its parents.
                parent = posixpath.dirname(rel)
                while parent and parent not in self.entries:
                    self.entries[parent] = "dir"
                    parent = posixpath.dirname(parent)

    def resolve(self, source: str) -> list[str]:
        """The context entries a COPY/ADD source names (relative paths; "" is the context)."""
        rel = posixpath.normpath(source.lstrip("/")) if source.strip("/") else "."
        rel = "" if rel == "." else rel
        if rel == ".." or rel.startswith("../"):
            raise BuildContextError(f"{source}: outside the build context")
        if _GLOB_CHARS.search(rel):
            regex = _glob_regex(rel)
            matches = sorted(e for e in self.entries if e and regex.fullmatch(e))
            if not matches:
                raise BuildContextError(f"{source}: no file in the build context matches")
            return matches
        if rel not in self.entries:
            why = "excluded by .dockerignore" if (self.root / rel).exists() else "not found in the build context"
            raise BuildContextError(f"{source}: {why}")
        self.followed(rel)  # a symlink source must lead to something inside the context
        return [rel]

    def followed(self, rel: str) -> tuple[str, EntryKind]:
        """The entry a top-level source names and its kind, following a symlink (Docker does)."""
        if self.entries.get(rel) != "symlink":
            return rel, self.entries[rel]
        root = self.root.resolve()
        target = (self.root / rel).resolve()
        if not target.is_relative_to(root):
            raise BuildContextError(f"{rel}: a symlink that leads outside the build context")
        target_rel = target.relative_to(root).as_posix()
        target_rel = "" if target_rel == "." else target_rel
        kind = self.entries.get(target_rel)
        if kind not in ("dir", "file"):
            raise BuildContextError(f"{rel}: a symlink to nothing the build context holds")
        return target_rel, kind

    def below(self, rel: str) -> list[str]:
        """Entries strictly inside directory rel, parents first (relative to rel)."""
        prefix = f"{rel}/" if rel else ""
        return sorted(e[len(prefix) :] for e in self.entries if e and e.startswith(prefix) and e != rel)

    def fingerprint(self) -> list[list[str | int]]:
        """Every entry with its mode and content digest (files) or target (links)."""
        rows: list[list[str | int]] = []
        for rel in sorted(self.entries):
            path = self.root / rel
            kind = self.entries[rel]
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            detail = (
                sha256_hex(path.read_bytes()) if kind == "file" else (os.readlink(path) if kind == "symlink" else "")
            )
            rows.append([rel, kind, mode, detail])
        return rows


def _kind(path: str | Path) -> EntryKind | None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else None


# --------------------------------------------------------------------------- before start


@dataclass
class EnvironmentBuild:
    """A Dockerfile checked against a sandbox layout: what start() will apply."""

    plan: DockerfilePlan
    context: BuildContext
    problems: list[str] = field(default_factory=list)
    writable_dirs: list[str] = field(default_factory=list)  # top-level dirs it adds to the sandbox

    def cache_key(self, *, layout: Sequence[str], host_dirs: Sequence[str]) -> str:
        """The build's identity: the interpreted Dockerfile, its context's content, the
        sandbox's layout and the host system standing in for the base image."""
        return canonical_digest(
            {
                "format": 1,
                "plan": self.plan.to_json(),
                "context": self.context.fingerprint(),
                "layout": sorted(layout),
                "host_dirs": sorted(host_dirs),
                "host": _host_identity(),
            }
        )


def _host_identity() -> str:
    try:
        return sha256_hex(Path("/etc/os-release").read_bytes())
    except OSError:
        return ""


def _inside(path: str, dirs: Sequence[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def prepare_build(
    *,
    environment_dir: Path,
    writable_dirs: Sequence[str],
    host_dirs: Sequence[str],
) -> EnvironmentBuild | None:
    """Read and check ``environment_dir/Dockerfile`` (None if there is none).

    ``writable_dirs`` are the sandbox's writable directories before the Dockerfile adds any.
    The top-level directory of every ``WORKDIR`` and destination is added (``/srv`` for
    ``WORKDIR /srv/app``), so that a ``RUN`` can write next to them as it would in an image.
    """
    dockerfile = environment_dir / DOCKERFILE_NAME
    if not dockerfile.is_file():
        return None
    label = f"{environment_dir.name}/{DOCKERFILE_NAME}"
    plan = dockerfile_plan(text=dockerfile.read_text(errors="replace"), file=label, base_env={"PATH": SANDBOX_PATH})
    build = EnvironmentBuild(plan=plan, context=BuildContext(environment_dir), problems=list(plan.refusals))
    writable = list(writable_dirs)
    workdirs: list[str] = []  # directories that exist once the WORKDIRs so far are made
    for step in plan.steps:
        if isinstance(step, CopyStep):
            _check_copy(build, step, writable=writable, workdirs=workdirs, host_dirs=host_dirs)
        elif isinstance(step, WorkdirStep):
            if not _host_dir_exists(step.path, host_dirs):
                _require_writable(build, step.path, step=step, writable=writable, host_dirs=host_dirs)
            workdirs.append(step.path)
    return build


def _check_copy(
    build: EnvironmentBuild, step: CopyStep, *, writable: list[str], workdirs: list[str], host_dirs: Sequence[str]
) -> None:
    items: list[str] = []
    for source in step.sources:
        try:
            items += build.context.resolve(source)
        except BuildContextError as exc:
            build.problems.append(f"{step.at.describe(build.plan.file)}: {exc}")
    top_level = posixpath.dirname(step.dest) == "/"
    exists = _inside(step.dest, writable) or step.dest in workdirs
    if top_level and not step.dest_is_dir and not exists and _one_plain_file(build, step, items):
        # Docker would create the file /name; here every top-level path is a directory.
        build.problems.append(
            f"{step.at.describe(build.plan.file)}: cannot create the file {step.dest} at the top level (the "
            f"sandbox's root is read-only); copy it into a directory, e.g. {step.dest}/ or /app/"
        )
        return
    _require_writable(build, step.dest, step=step, writable=writable, host_dirs=host_dirs)


def _one_plain_file(build: EnvironmentBuild, step: CopyStep, items: list[str]) -> bool:
    if len(items) != 1:
        return False
    try:
        target, kind = build.context.followed(items[0])
    except BuildContextError:
        return False
    return kind == "file" and not (step.add and tarfile.is_tarfile(build.context.root / target))


def _host_dir_exists(path: str, host_dirs: Sequence[str]) -> bool:
    # WORKDIR of a directory the read-only part of the sandbox already has: nothing to create.
    top = path.strip("/").split("/")[0]
    return path == "/" or (top in host_dirs and os.path.isdir(path))


def _require_writable(
    build: EnvironmentBuild, path: str, *, step: CopyStep | WorkdirStep, writable: list[str], host_dirs: Sequence[str]
) -> None:
    if _inside(path, [*writable, *build.writable_dirs]):
        return
    problem = container_dir_problem(path, host_dirs)
    if problem is not None:
        build.problems.append(f"{step.at.describe(build.plan.file)}: cannot write {path}: {problem}")
        return
    build.writable_dirs.append(posixpath.join("/", path.strip("/").split("/")[0]))


# --------------------------------------------------------------------------- at start


async def apply_build(*, sandbox: Sandbox, build: EnvironmentBuild) -> None:
    """Apply the build's steps, in order, to a started sandbox."""
    for step in build.plan.steps:
        if isinstance(step, WorkdirStep):
            if _inside(step.path, sandbox.writable_dirs):
                await sandbox.make_dir(step.path)
        elif isinstance(step, CopyStep):
            await _apply_copy(sandbox=sandbox, build=build, step=step)
        else:
            await _apply_run(sandbox=sandbox, build=build, step=step)


async def _apply_run(*, sandbox: Sandbox, build: EnvironmentBuild, step: RunStep) -> None:
    # Output and errors interleaved, as a build log shows them.
    command = f"exec {shlex.join(step.argv)} 2>&1"
    result = await sandbox.exec(command, cwd=step.cwd, env=dict(step.env), kill_leftovers=True)
    if result.return_code != 0:
        tail = "\n".join((result.stdout + result.stderr).rstrip().splitlines()[-OUTPUT_TAIL_LINES:])
        raise SandboxBuildFailedError(
            f"{step.at.describe(build.plan.file)}: exited with status {result.return_code} in the local sandbox "
            f"(no network; the host's system directories are read-only); last lines of its output:\n"
            f"{tail or '(no output)'}"
        )


async def _apply_copy(*, sandbox: Sandbox, build: EnvironmentBuild, step: CopyStep) -> None:
    items = [rel for source in step.sources for rel in build.context.resolve(source)]
    into_dir = step.dest_is_dir or len(items) > 1 or await sandbox.is_dir(step.dest)
    with tempfile.TemporaryDirectory(prefix="synth-copy-") as tmp:
        staging = Path(tmp) / "stage"
        single = await asyncio.to_thread(_stage_copy, build, step, items, into_dir=into_dir, staging=staging)
        if single is not None:
            await sandbox.upload_file(single, step.dest)
        else:
            await sandbox.upload_dir(staging, step.dest)


def _stage_copy(
    build: EnvironmentBuild, step: CopyStep, items: list[str], *, into_dir: bool, staging: Path
) -> Path | None:
    """Lay out what the step copies in a host directory; the file, when it copies one file to a file."""
    context = build.context
    staging.mkdir()
    single: Path | None = None
    for rel in items:
        target, kind = context.followed(rel)
        path = context.root / target
        if kind == "dir":
            _stage_dir(context, target, staging)
        elif step.add and tarfile.is_tarfile(path):
            _extract(path, staging, step=step, file=build.plan.file)
        elif into_dir:
            shutil.copy2(path, staging / posixpath.basename(rel))
        else:
            single = staging / "file"
            shutil.copy2(path, single)
    if step.chmod is not None:
        _chmod_tree(staging, step.chmod)
    return single


def _stage_dir(context: BuildContext, rel: str, staging: Path) -> None:
    source = context.root / rel
    for sub in context.below(rel):
        inner = context.entries[f"{rel}/{sub}" if rel else sub]
        target = staging / sub
        if inner == "dir":
            target.mkdir(exist_ok=True)
        elif inner == "symlink":
            target.unlink(missing_ok=True)
            os.symlink(os.readlink(source / sub), target)
        else:
            shutil.copy2(source / sub, target)


def _extract(archive: Path, staging: Path, *, step: CopyStep, file: str) -> None:
    # Docker's ADD of a local tar archive (plain, gzip, bzip2, xz) unpacks it; the "data"
    # filter refuses absolute paths, '..', links leaving the destination and device files.
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise SandboxBuildFailedError(f"{step.at.describe(file)}: cannot unpack {archive.name}: {exc}") from exc


def _chmod_tree(root: Path, mode: int) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            if not path.is_symlink():
                os.chmod(path, mode)

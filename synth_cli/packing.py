"""Pack a folder of Harbor tasks (or a registry.json's tasks) as a deterministic tar.gz.

Deterministic: entries sorted by path, mtime 0, owner 0/0 with no names, modes reduced
to 0755/0644, and a gzip header without name or time. The same folder therefore gives
the same bytes on every machine, which keeps uploads reproducible and easy to compare.
The server builds its own canonical per-task archive (and digest) from what it unpacks;
the files left out here are the ones it leaves out too (VCS folders, caches, .pyc).
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from synth_cli.errors import UsageError
from synth_cli.inputs import json_file_load

SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
SKIP_FILES = frozenset({".DS_Store"})
SKIP_SUFFIXES = (".pyc", ".pyo")


@dataclass(frozen=True)
class Packed:
    archive: bytes
    files: int
    tasks: list[str]  # top-level task folders (directory push) or registry task paths
    registry: bytes | None = None


def _walk(root: Path, arc_prefix: PurePosixPath | None) -> list[tuple[str, Path, os.stat_result]]:
    """(archive path, file, lstat) for everything under `root`, skipping caches."""
    found: list[tuple[str, Path, os.stat_result]] = []
    if arc_prefix is not None:
        found.append((arc_prefix.as_posix(), root, root.lstat()))
    for directory, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        base = Path(directory)
        files = sorted(f for f in filenames if f not in SKIP_FILES and not f.endswith(SKIP_SUFFIXES))
        for name in [*dirnames, *files]:
            path = base / name
            rel = PurePosixPath(path.relative_to(root).as_posix())
            arc = arc_prefix / rel if arc_prefix is not None else rel
            found.append((arc.as_posix(), path, path.lstat()))
    return found


def _tar_gz(entries: list[tuple[str, Path, os.stat_result]]) -> bytes:
    buf = io.BytesIO()
    # filename="" and mtime=0 keep the gzip header free of local names and times.
    with gzip.GzipFile(fileobj=buf, mode="wb", filename="", mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for arcname, path, st in sorted(entries, key=lambda e: e[0]):
                info = tarfile.TarInfo(arcname)
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if stat.S_ISDIR(st.st_mode):
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
                elif stat.S_ISLNK(st.st_mode):
                    # Kept as a link; the server refuses one that leaves its task.
                    info.type = tarfile.SYMTYPE
                    info.mode = 0o777
                    info.linkname = os.readlink(path)
                    tar.addfile(info)
                elif stat.S_ISREG(st.st_mode):
                    info.mode = 0o755 if st.st_mode & 0o111 else 0o644
                    data = path.read_bytes()
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                else:
                    raise UsageError(f"{path}: not a regular file, folder or symlink; cannot pack it")
    return buf.getvalue()


def pack_folder(folder: Path) -> Packed:
    """A folder of task folders; a single task folder is wrapped so it is a one-task dataset."""
    if not folder.is_dir():
        raise UsageError(f"{folder}: not a folder")
    if (folder / "task.toml").is_file():
        name = folder.resolve().name
        entries = _walk(folder, PurePosixPath(name))
        tasks = [name]
    else:
        entries = _walk(folder, None)
        tasks = sorted(
            p.name
            for p in folder.iterdir()
            if p.is_dir() and not p.name.startswith(".") and (p / "task.toml").is_file()
        )
    if not tasks:
        raise UsageError(f"{folder}: no task folders found (a task folder holds task.toml)")
    return Packed(
        archive=_tar_gz(entries), files=sum(1 for e in entries if not stat.S_ISDIR(e[2].st_mode)), tasks=tasks
    )


def _registry_task_paths(registry: object, *, where: str, name: str, version: str) -> list[str]:
    """The local task paths of dataset name@version (or of the only dataset) in a registry."""
    if not isinstance(registry, list) or not all(isinstance(d, dict) for d in registry):
        raise UsageError(f"{where}: expected a JSON list of datasets ({{name, version, tasks}})")
    chosen = [d for d in registry if d.get("name") == name and str(d.get("version")) == version]
    if not chosen and len(registry) == 1:
        chosen = registry
    if not chosen:
        available = ", ".join(f"{d.get('name')}@{d.get('version')}" for d in registry) or "none"
        raise UsageError(f"{where}: no dataset {name}@{version} (available: {available})")
    paths: list[str] = []
    for i, task in enumerate(chosen[0].get("tasks") or []):
        path = task.get("path") if isinstance(task, dict) else None
        if not isinstance(path, str) or not path:
            raise UsageError(f"{where}: tasks[{i}] has no local path (git tasks are not supported)")
        paths.append(path)
    if not paths:
        raise UsageError(f"{where}: dataset {name}@{version} lists no tasks")
    return paths


def pack_registry(registry_file: Path, *, name: str, version: str) -> Packed:
    """The task folders a registry.json references, at their paths relative to it."""
    where = registry_file.name
    registry = json_file_load(str(registry_file))
    base = registry_file.resolve().parent
    entries: list[tuple[str, Path, os.stat_result]] = []
    seen: set[str] = set()
    tasks = _registry_task_paths(registry, where=where, name=name, version=version)
    for path_text in tasks:
        task_dir = (base / path_text).resolve()
        if not task_dir.is_relative_to(base) or task_dir == base:
            raise UsageError(
                f"{where}: task path {path_text} is outside the registry's folder; only that folder is uploaded"
            )
        if not task_dir.is_dir():
            raise UsageError(f"{where}: task path {path_text} is not a folder")
        rel = PurePosixPath(task_dir.relative_to(base).as_posix())
        # Parent folders first, so the archive unpacks with ordinary permissions.
        for parent in reversed(rel.parents[:-1]):
            if parent.as_posix() not in seen:
                seen.add(parent.as_posix())
                entries.append((parent.as_posix(), base / parent, (base / parent).lstat()))
        for entry in _walk(task_dir, rel):
            if entry[0] not in seen:
                seen.add(entry[0])
                entries.append(entry)
    return Packed(
        archive=_tar_gz(entries),
        files=sum(1 for e in entries if not stat.S_ISDIR(e[2].st_mode)),
        tasks=tasks,
        registry=registry_file.read_bytes(),  # sent as given: the server parses it
    )

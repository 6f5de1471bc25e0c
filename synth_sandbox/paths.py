"""The sandbox's file system as its processes see it: which host directories are visible,
which directories are writable, and which container paths may become writable."""

from __future__ import annotations

import hashlib
import os
import posixpath
import tempfile
from collections.abc import Sequence
from pathlib import Path

from synth_sandbox.errors import SandboxPathError

# Host directories visible (read-only) inside: the system's programs and libraries.
DEFAULT_HOST_DIRS: tuple[str, ...] = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt")
# Writable directories (each a per-sandbox host directory bound at this path); the workdir is added.
DEFAULT_WRITABLE_DIRS: tuple[str, ...] = (
    "/logs",
    "/tests",
    "/solution",
    "/tmp",
    "/var/tmp",
    "/root",
    "/installed-agent",
    "/runtime",
)
PRECREATED_DIRS = ("/logs/agent", "/logs/verifier", "/logs/artifacts")
STICKY_DIRS = ("/tmp", "/var/tmp")
_RESERVED_TOP = frozenset({"proc", "dev", "sys", "run"})
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MODEL_SOCKET_IN_SANDBOX = "/run/synth/model.sock"


def normalize_container_path(path: str) -> str:
    if not path or not path.startswith("/"):
        raise SandboxPathError(f"container path must be absolute: {path!r}")
    return posixpath.normpath(path).replace("//", "/")


def container_dir_problem(path: str, host_dirs: Sequence[str] = DEFAULT_HOST_DIRS) -> str | None:
    """Why path cannot be a writable directory of the sandbox (None if it can)."""
    try:
        norm = normalize_container_path(path)
    except SandboxPathError as exc:
        return str(exc)
    if norm == "/":
        return "the root directory cannot be writable"
    top = norm.strip("/").split("/")[0]
    if top in _RESERVED_TOP:
        return f"{norm} is inside /{top}, which the sandbox provides itself"
    if top in host_dirs:
        return f"{norm} is inside the host's read-only /{top}; use a directory such as /app"
    return None


def top_level(dirs: Sequence[str]) -> list[str]:
    """Drop directories nested inside another one of the list."""
    result: list[str] = []
    for d in sorted(set(dirs), key=lambda p: (p.count("/"), p)):
        if not any(d == r or d.startswith(r + "/") for r in result):
            result.append(d)
    return result


def harnesses_default_dir(*, repo: Path) -> Path:
    """Where the Python harnesses' venvs live by default: ``<repo>/.harnesses``, or, when the
    repository sits below a directory other users cannot enter (a 0700 home or ``mktemp -d``),
    a directory of the system temp dir named after the repository. The sandbox's uid is
    unprivileged, so a venv it cannot reach could not be bound; at ~700 MB, building it where
    it can be reached beats copying it there."""
    repo = repo.resolve()
    if all(os.stat(d).st_mode & 0o001 for d in (repo, *repo.parents)):
        return repo / ".harnesses"
    digest = hashlib.sha256(str(repo).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"synth-harnesses-{digest}"

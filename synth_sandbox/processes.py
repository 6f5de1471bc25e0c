"""Host-side processes: the helper programs the sandbox runs, and host pids read from /proc."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from synth_sandbox.errors import SandboxUnavailableError

# The only environment of host-side helper processes (sh, nsenter, setpriv, bwrap).
HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


@dataclass
class HostTools:
    sh: str
    bwrap: str
    nsenter: str
    setpriv: str
    bash: str


def _which(name: str) -> str | None:
    return shutil.which(name, path=HOST_ENV["PATH"])


def find_tools() -> HostTools:
    """Locate the host tools; raise SandboxUnavailableError with an install hint if missing."""
    missing: list[str] = []
    found: dict[str, str | None] = {}
    for name, package in (
        ("sh", "dash"),
        ("bwrap", "bubblewrap"),
        ("nsenter", "util-linux"),
        ("setpriv", "util-linux"),
        ("bash", "bash"),
        ("sleep", "coreutils"),
    ):
        found[name] = _which(name)
        if found[name] is None:
            missing.append(f"{name} (package {package})")
    if missing:
        raise SandboxUnavailableError("the local sandbox needs these host programs: " + ", ".join(missing))
    return HostTools(
        sh=found["sh"] or "",
        bwrap=found["bwrap"] or "",
        nsenter=found["nsenter"] or "",
        setpriv=found["setpriv"] or "",
        bash=found["bash"] or "",
    )


def kill_pid(pid: int) -> None:
    # os.kill rather than Process.kill(): Popen.send_signal() polls first and would reap the
    # child behind asyncio's child watcher (which then reports exit status 255).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def process_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def pid_namespace(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True  # gone


def namespace_members(namespace: int) -> set[int]:
    """Host pids of the live processes in the PID namespace ``namespace`` (an inode number)."""
    members: set[int] = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and pid_namespace(int(entry.name)) == namespace and not is_zombie(int(entry.name)):
            members.add(int(entry.name))
    return members

"""Helpers for the local sandbox tests (plain pytest, no database)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import sys
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import pytest

from synth_sandbox.limits import SandboxLimits
from synth_sandbox.sandbox import Sandbox

# Under the system temp dir (searchable by the sandbox uid), not pytest's 0700 tmp_path.
BASE_DIR = Path("/tmp/synth-sandbox-tests")

requires_sandbox = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("bwrap") is None,
    reason="the local sandbox needs Linux with bubblewrap (apt-get install bubblewrap)",
)
requires_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (cgroups, tmpfs, uid mapping)")


def run[T](coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@contextlib.asynccontextmanager
async def started_sandbox(**kwargs: Any) -> AsyncIterator[Sandbox]:
    limits = kwargs.pop("limits", SandboxLimits(memory_mb=512, cpus=1, storage_mb=256, pids_max=256))
    sandbox = Sandbox(
        name=f"t-{secrets.token_hex(5)}", base_dir=kwargs.pop("base_dir", BASE_DIR), limits=limits, **kwargs
    )
    await sandbox.start()
    try:
        yield sandbox
    finally:
        await sandbox.stop(delete=True)


def require_limit(sandbox: Sandbox, name: str) -> None:
    if name not in sandbox.enforced_limits:
        pytest.skip(f"{name} is not enforced on this host: {sandbox.unenforced_limits.get(name)}")


def processes_with_marker(marker: str) -> list[int]:
    """Host pids whose command line contains marker (scans all of /proc)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


def new_marker() -> str:
    return f"synthmarker{secrets.token_hex(6)}"

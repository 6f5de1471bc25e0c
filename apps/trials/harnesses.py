"""The trials host's Python harnesses: a virtual environment per engine, bound read-only.

``deploy/harnesses.sh`` builds ``$SYNTH_HARNESSES_DIR/<engine>`` (default ``.harnesses/``) from
the engine's hash-pinned lock, ``deploy/harnesses/<engine>.txt``, with an interpreter of the
host's ``/usr`` (or ``/opt``), and stamps it with the lock's sha256. The local sandbox sees the
host's ``/usr`` read-only, so the venv works there once bound at the engine's target (its
``bin/python`` links to that interpreter; sys.prefix follows the link's location). Before a
trial gets one, :func:`harness_tree_resolve` checks what would otherwise fail inside the
sandbox, minutes later and less clearly: installed, built from the current lock, an
interpreter the sandbox can see, readable by the sandbox's unprivileged uid.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from django.conf import settings

from synth_launcher.engines import HarnessTree
from synth_sandbox.paths import DEFAULT_HOST_DIRS

LOCKS_DIR = Path(settings.BASE_DIR) / "deploy" / "harnesses"
STAMP = ".lock.sha256"


class HarnessUnavailable(RuntimeError):
    """The engine's harness cannot be bound into a sandbox; the message says what to do."""


def harness_tree_resolve(*, tree: HarnessTree) -> Path:
    """The host directory to bind at ``tree.target``, or HarnessUnavailable."""
    home = Path(settings.SYNTH_HARNESSES_DIR) / tree.name
    rebuild = "run `bash deploy/harnesses.sh` (deploy/setup.sh does), or set SYNTH_HARNESSES_DIR"
    python = home / "bin" / "python"
    stamp = home / STAMP
    if not python.exists() or not stamp.is_file():
        raise HarnessUnavailable(f"{tree.name} is not installed at {home}: {rebuild}")
    lock = LOCKS_DIR / f"{tree.name}.txt"
    want = hashlib.sha256(lock.read_bytes()).hexdigest() if lock.is_file() else None
    if want is not None and not stamp.read_text().startswith(want):
        raise HarnessUnavailable(f"{tree.name} at {home} was built from another lock than {lock}: {rebuild}")
    interpreter = python.resolve()
    top = interpreter.parts[1] if len(interpreter.parts) > 1 else ""
    if top not in DEFAULT_HOST_DIRS:
        raise HarnessUnavailable(
            f"{tree.name}'s interpreter {interpreter} is not visible in the sandbox, which sees only the host's "
            f"{', '.join('/' + d for d in DEFAULT_HOST_DIRS)}: rebuild it with SYNTH_HARNESS_PYTHON set to a Python "
            "there (deploy/harnesses.sh)"
        )
    for directory in (home, *home.parents):
        mode = directory.stat().st_mode
        if mode & 0o001 == 0 or (directory == home and mode & 0o004 == 0):
            raise HarnessUnavailable(
                f"{tree.name} cannot be bound into the sandbox, whose uid is unprivileged: {directory} is not "
                "readable by other users. Install it where other users can read it (SYNTH_HARNESSES_DIR)"
            )
    return Path(os.path.realpath(home))

"""Phase hooks: scripts a phase's shells may source (read-only inside), and what they observe
(written by the sandbox, read by the host)."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

HOOKS_IN_SANDBOX = "/run/synth/hooks"
OBSERVED_IN_SANDBOX = "/run/synth/observed"
# For BASH_ENV: sourced by every non-interactive bash of a phase that asks for it. A command that
# does not exist is recorded before bash reports it as usual (exit 127), so that "the verifier
# needs a tool this host lacks" is a fact, not a guess from its output.
CHECK_HOOK = "check.sh"
_CHECK_HOOK_SCRIPT = f"""command_not_found_handle() {{
  printf '%s\\n' "$1" >> {OBSERVED_IN_SANDBOX}/missing-commands 2>/dev/null
  printf 'bash: %s: command not found\\n' "$1" >&2
  return 127
}}
"""
_OBSERVED_MAX_BYTES = 64 << 10


def hooks_make(*, sandbox_dir: Path, owner: tuple[int, int] | None) -> None:
    """Create ``hooks/`` (bound read-only) and ``observed/`` (writable by the sandbox uid)."""
    # Outside fs/: neither part of the storage limit nor of anything copied out.
    (sandbox_dir / "hooks").mkdir(mode=0o755)
    (sandbox_dir / "hooks" / CHECK_HOOK).write_text(_CHECK_HOOK_SCRIPT)
    os.chmod(sandbox_dir / "hooks" / CHECK_HOOK, 0o644)
    (sandbox_dir / "observed").mkdir(mode=0o755)
    if owner is not None:
        os.chown(sandbox_dir / "observed", *owner)


def observed_reset(*, sandbox_dir: Path) -> None:
    """Forget what the phase hooks observed so far."""
    with contextlib.suppress(FileNotFoundError):
        (sandbox_dir / "observed" / "missing-commands").unlink()


def missing_commands(*, sandbox_dir: Path) -> list[str]:
    """Commands that bash could not find in a phase using CHECK_HOOK (in order, once each)."""
    # The sandbox writes this file: never follow a link it made, never block on a FIFO.
    try:
        fd = os.open(sandbox_dir / "observed" / "missing-commands", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        data = f.read(_OBSERVED_MAX_BYTES)
    names = (line.strip() for line in data.decode(errors="replace").splitlines())
    return list(dict.fromkeys(name[:200] for name in names if name))

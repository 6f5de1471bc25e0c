"""What a trial keeps on its worker's host, and who cleans it up when its process dies.

A trial unpacks its task (instruction, tests, solution) and Harbor's trial directory
under ``SYNTH_WORK_DIR/<trial>.<fence>``, and runs in sandboxes under the sandbox root
(tmpfs mounts, cgroups: synth_sandbox). Both record their owner, the pool process
(pid and start time). The owner removes them when the trial ends; when it was killed
(SIGKILL, the OOM killer), ``host_reap`` does, from the next pool process that starts or
the next trial on the host. A live sibling's directories are never touched.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from synth_sandbox.sandbox import owner_alive, owner_record, reap_stale_sandboxes

logger = logging.getLogger(__name__)

OWNER_FILE = "owner.json"


def work_dir_make(*, root: Path, name: str) -> Path:
    """A new work directory owned by this process."""
    path = root / name
    path.mkdir(parents=True)
    (path / OWNER_FILE).write_text(json.dumps(owner_record()))
    return path


def work_dirs_reap(*, root: Path) -> list[str]:
    """Remove the work directories whose owner process is gone; returns their names.
    A directory without an owner record is left alone: it may be in the making."""
    removed: list[str] = []
    if not root.is_dir():
        return removed
    for path in sorted(root.iterdir()):
        try:
            owner = json.loads((path / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(owner, dict) or owner_alive(owner):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    return removed


def host_reap(*, work_root: Path) -> list[str]:
    """Remove what dead trial processes left on this host: sandboxes (processes, tmpfs
    mounts, cgroups, directories) and work directories. Returns what was removed."""
    from synth_sandbox.environment import default_sandbox_root

    removed = [f"sandbox {name}" for name in reap_stale_sandboxes(default_sandbox_root())]
    removed += [f"work dir {name}" for name in work_dirs_reap(root=work_root)]
    if removed:
        logger.warning("removed what dead trial processes left: %s", ", ".join(removed[:10]))
    return removed

"""Who holds a record: an identity for this very process, and whether one is still alive.

A pid alone is reused; the pid with the process' start time (in clock ticks since boot)
and the boot id is not, so a holder recorded as ``host/boot/pid/start`` can be checked
from any process on the same host after the holder died, even across a reboot.
"""

from __future__ import annotations

import os
import socket
from functools import cache
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@cache
def _boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()[:8]
    except OSError:
        return "noboot"


def _stat_fields(*, pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields follow the last ")".
    return stat.rsplit(")", 1)[1].split()


def _start_ticks(*, pid: int) -> str | None:
    fields = _stat_fields(pid=pid)
    return fields[19] if fields else None


def process_identity() -> str:
    """This process, as ``host/boot/pid/start`` (not cached: a forked child is another)."""
    pid = os.getpid()
    return f"{socket.gethostname()}/{_boot_id()}/{pid}/{_start_ticks(pid=pid) or '0'}"


def process_alive(*, identity: str) -> bool | None:
    """True or False for a holder on this host; None when it is another host's (unknown)."""
    parts = identity.split("/")
    if len(parts) != 4:
        return None
    host, boot, pid, start = parts
    if host != socket.gethostname() or start == "0":
        return None  # another host's, or recorded where /proc could not tell a start time
    if boot != _boot_id() or not pid.isdigit():
        return False
    fields = _stat_fields(pid=int(pid))
    if fields is None or fields[19] != start:
        return False
    # A killed process whose parent died too may stay a zombie for good where the init process
    # does not reap orphans (containers): it runs nothing and holds nothing, so it is gone.
    return fields[0] not in ("Z", "X")

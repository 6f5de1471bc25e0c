"""Reads of the bench itself while a scenario runs: through a database that may be
restarting, and a watcher that samples sandboxes and heartbeats."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from bench.fault_injection.cluster import Host
from bench.fault_injection.common import wait_until


def db(fn: Callable[[], Any]) -> Any:
    """A read of the bench itself, through a database that may be restarting."""
    from django.db import InterfaceError, OperationalError, close_old_connections
    from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

    retrying = Retrying(
        retry=retry_if_exception_type((OperationalError, InterfaceError)),
        wait=wait_fixed(0.2),
        stop=stop_after_delay(60),
        before_sleep=lambda _: close_old_connections(),
        reraise=True,
    )
    return retrying(fn)


def now() -> datetime:
    from django.utils import timezone

    return timezone.now()


def run_get(run_id: str) -> Any:
    from apps.runs.models import Run

    return db(lambda: Run.objects.get(pk=run_id))


def run_wait(run_id: str, *, timeout: float) -> Any:
    return wait_until(
        lambda: (r := run_get(run_id)).is_terminal and r, timeout=timeout, what=f"run {run_id}", interval=0.5
    )


def trials_of(run_id: str, **filters: Any) -> list[Any]:
    from apps.runs.models import Trial

    return db(lambda: list(Trial.objects.filter(run_id=run_id, **filters).order_by("id")))


def running(run_id: str, *, count: int, for_s: float = 1.0) -> list[Any]:
    """Wait until ``count`` trials have been running for ``for_s`` seconds."""

    def ready() -> list[Any]:
        trials = trials_of(run_id, status="running")
        old = [t for t in trials if t.started_at and (now() - t.started_at).total_seconds() >= for_s]
        return old if len(old) >= count else []

    return wait_until(ready, timeout=120, what=f"{count} running trials of {run_id}")


class Watch(threading.Thread):
    """Samples, while a scenario runs: the sandboxes on each host (their cgroups, to check
    later that none is left) and the first heartbeat after the fault of affected trials."""

    def __init__(self, *, hosts: list[Host]) -> None:
        super().__init__(daemon=True)
        self.hosts = hosts
        self.cgroups: set[str] = set()
        self.fault_end: datetime | None = None
        self.affected: list[str] = []
        self.heartbeats: dict[str, datetime] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        from django.db import connections

        try:
            while not self._halt.wait(0.2):
                self._sample()
        finally:
            connections.close_all()

    def _sample(self) -> None:
        for host in self.hosts:
            for meta in host.sandbox_root.glob("*/meta.json"):
                with contextlib.suppress(OSError, ValueError):
                    self.cgroups.update(json.loads(meta.read_text()).get("cgroups") or [])
        if self.fault_end is None or not self.affected:
            return
        from django.db import DatabaseError, close_old_connections

        from apps.runs.models import Lease

        units = {f"trial:{t}": t for t in self.affected if t not in self.heartbeats}
        try:
            beats = Lease.objects.filter(unit__in=units, heartbeat_at__gt=self.fault_end).values_list(
                "unit", "heartbeat_at"
            )
            for unit, at in beats:
                self.heartbeats.setdefault(units[unit], at)
        except DatabaseError:
            close_old_connections()

    def fault(self, *, affected: list[str]) -> None:
        """The fault is over (the kill or restart returned): heartbeats from now on count."""
        self.affected = affected
        self.fault_end = now()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)

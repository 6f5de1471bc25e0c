"""The thread that keeps a trial's lease alive while its attempt runs.

It heartbeats the lease; it is also how cancellation reaches a running trial (the
heartbeat answers `cancel_requested`) and how a worker learns it lost the trial to another
(a stale lease): then the trial stops without writing anything more. The trial's progress
events go through it too, under the lease and numbered for deduplication.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.conf import settings

from apps.accounts.models import WorkerIdentity
from apps.core.db import TRANSIENT_DB_ERRORS, db_retry, db_side_run
from apps.core.errors import StaleLease
from apps.runs.leases import lease_heartbeat, lease_report
from apps.runs.models import Lease

logger = logging.getLogger(__name__)

# After a failed heartbeat, the next one comes this soon (on a new connection), not a
# whole interval later: a restarted database is back within a second or two.
HEARTBEAT_RETRY_SECONDS = 0.25


class LeaseKeeper(threading.Thread):
    """Heartbeats a lease until stopped; records cancellation and loss. Only a stale
    lease stops it: a database that is down or restarting is beaten again until it is back."""

    def __init__(self, *, worker: WorkerIdentity, lease: Lease) -> None:
        super().__init__(name=f"lease-{lease.id}", daemon=True)
        self.worker = worker
        self.lease = lease
        # Frequent enough that a cancel reaches a running trial within seconds.
        self.interval = max(0.2, min(settings.SYNTH_LEASE_TTL_SECONDS / 3, 2.0))
        self.cancelled = threading.Event()
        self.lost = threading.Event()
        self._halt = threading.Event()
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._beaten_at = time.monotonic()  # the last heartbeat that reached the database

    @property
    def should_stop(self) -> bool:
        return self.cancelled.is_set() or self.lost.is_set()

    def next_seq(self) -> int:
        with self._seq_lock:
            self._seq += 1
            return self._seq

    def report(self, *events: dict[str, Any]) -> None:
        """Append progress events under the lease, retried through a database restart."""
        # One sequence number for every try: a repeat of a write that did commit is
        # acknowledged by lease_report, not applied twice.
        seq = self.next_seq()
        db_retry(
            write=lambda: lease_report(
                worker=self.worker, lease_id=self.lease.id, fence=self.lease.fence, local_seq=seq, events=list(events)
            ),
            what=f"progress of {self.lease.id}",
        )

    def run(self) -> None:
        wait = self.interval
        while not self._halt.wait(wait):
            wait = self.interval if self._beat() else min(self.interval, HEARTBEAT_RETRY_SECONDS)
            if self.lost.is_set():
                return

    def _beat(self) -> bool:
        """One heartbeat; False when it did not reach the database."""
        try:
            # On the process' side thread and its kept connection: this thread lives as long
            # as one trial, and a connection of its own would be a new backend per trial.
            result = db_side_run(
                call=lambda: lease_heartbeat(worker=self.worker, lease_id=self.lease.id, fence=self.lease.fence),
                lane="heartbeat",
            )
        except StaleLease:
            # How long since the last beat that landed tells a crash-free expiry (a stalled
            # process or database) from a takeover.
            logger.warning(
                "lease %s is stale (last heartbeat %.1f s ago, TTL %s s); stopping trial work",
                self.lease.id,
                time.monotonic() - self._beaten_at,
                settings.SYNTH_LEASE_TTL_SECONDS,
            )
            self.lost.set()
            return True
        except TRANSIENT_DB_ERRORS as exc:
            logger.warning("heartbeat of %s: database unavailable (%s); beating again", self.lease.id, exc)
            return False
        except Exception:  # anything else: try again next beat, the TTL covers a few misses
            logger.exception("heartbeat of %s failed", self.lease.id)
            return False
        self._beaten_at = time.monotonic()
        if result.cancel_requested:
            self.cancelled.set()
        return True

    def stop(self) -> None:
        self._halt.set()

"""What a scenario's outcome is measured by (finished runs, recovery, trials counted twice,
leaked reservations, leftovers, lost results), its line and the last-line summary."""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.fault_injection.cluster import Cluster, Host
from bench.fault_injection.common import LEASE_TTL, log, wait_until
from bench.fault_injection.observe import Watch, db, run_get, trials_of

# The line a trials worker logs (apps/trials/pipeline.py) before it records an attempt's result.
RESULT_LINE = re.compile(
    r"trial (?P<trial>trl_\w+): attempt under lease (?P<lease>lse_\w+) \(fence (?P<fence>\d+)\) "
    r"ended (?P<status>\w+), rewards (?P<rewards>.+?); recording it"
)


@dataclass
class Result:
    name: str
    finished: bool
    detail: str
    recovery_s: float | None
    counted_twice: int = 0
    reservations_leaked: int = 0
    sandboxes_left: int = 0
    results_lost: int = 0
    notes: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        recovery = f"{self.recovery_s:.1f} s" if self.recovery_s is not None else "none"
        notes = "".join(f"; {k} {v}" for k, v in self.notes.items())
        return (
            f"{self.name}: {'finished' if self.finished else 'NOT FINISHED'} ({self.detail}); recovery {recovery}; "
            f"counted twice {self.counted_twice}; reservations leaked {self.reservations_leaked}; "
            f"sandboxes left {self.sandboxes_left}; results lost {self.results_lost}{notes}"
        )


def recovery(*, run_id: str, fault: datetime, affected: list[str], watch: Watch | None = None) -> float | None:
    """Seconds from the fault to the first sign of progress of each affected trial (an
    event about it, a heartbeat of its lease), the slowest of them; the run's next event
    when no trial is named."""
    from apps.runs.models import RunEvent

    events = db(
        lambda: list(RunEvent.objects.filter(run_id=run_id, created_at__gt=fault).values_list("created_at", "data"))
    )
    if not affected:
        return (min(at for at, _ in events) - fault).total_seconds() if events else None
    worst = 0.0
    for trial in affected:
        signs = [at for at, data in events if data.get("trial") == trial or data.get("unit") == f"trial:{trial}"]
        if watch is not None and trial in watch.heartbeats:
            signs.append(watch.heartbeats[trial])
        if not signs:
            return None
        worst = max(worst, (min(signs) - fault).total_seconds())
    return worst


def counted_twice(run_ids: list[str]) -> int:
    from apps.runs.models import RunEvent

    finished = db(
        lambda: list(
            RunEvent.objects.filter(run_id__in=run_ids, type="trial.finished").values_list("data__trial", flat=True)
        )
    )
    return sum(1 for n in Counter(finished).values() if n > 1)


def reservations_open(run_ids: list[str]) -> int:
    from apps.runs.models import Reservation

    return db(lambda: Reservation.objects.filter(trial__run_id__in=run_ids, status__in=["waiting", "held"]).count())


def leftovers(*, hosts: list[Host], watch: Watch) -> list[str]:
    """What trials left on the hosts: sandbox and work directories, tmpfs mounts, cgroups."""
    found = []
    for host in hosts:
        found += [f"sandbox {p.name}" for p in host.sandbox_root.glob("*") if p.is_dir()]
        found += [f"work dir {p.name}" for p in host.work.glob("*") if p.is_dir()]
        with open("/proc/self/mountinfo") as mounts:
            found += [f"mount {line.split()[4]}" for line in mounts if line.split()[4].startswith(str(host.tmp))]
    found += [f"cgroup {c}" for c in watch.cgroups if Path(c).exists()]
    return found


def results_lost(logs: str) -> int:
    """Attempts the worker said ended with rewards whose lease never completed."""
    from apps.runs.models import Lease

    lost = 0
    for match in RESULT_LINE.finditer(logs):
        if match["rewards"] == "None":
            continue
        status = db(lambda m=match: Lease.objects.filter(pk=m["lease"]).values_list("status", flat=True).first())
        lost += status != "completed"
    return lost


def tally(
    *,
    name: str,
    cluster: Cluster,
    run_ids: list[str],
    hosts: list[Host],
    watch: Watch,
    recovery_s: float | None,
    training: bool = False,
    notes: dict[str, Any] | None = None,
) -> Result:
    runs = [run_get(r) for r in run_ids]
    statuses = Counter(t.status for r in run_ids for t in trials_of(r))
    if training:
        finished = all(r.is_terminal and (r.status == "succeeded" or r.error) for r in runs)
    else:
        finished = all(r.status == "succeeded" for r in runs) and set(statuses) == {"succeeded"}
    detail = ", ".join(f"{r.id} {r.status}" + (f": {r.error[:120]}" if r.error else "") for r in runs)
    detail += f"; trials {dict(statuses)}"
    errors = Counter(f"{t.error_type}: {t.error_message[:160]}" for r in run_ids for t in trials_of(r) if t.error_type)
    if errors:
        detail += f"; errors {dict(errors.most_common(2))}"
    # The workers' own clean-up (a finally, the reaper) may take a lease TTL or two.
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: not reservations_open(run_ids), timeout=2 * LEASE_TTL + 2, what="reservations")
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: not leftovers(hosts=hosts, watch=watch), timeout=LEASE_TTL, what="leftovers")
    left = leftovers(hosts=hosts, watch=watch)
    if left:
        log(f"{name}: left behind: {', '.join(left[:8])}")
    return Result(
        name=name,
        finished=finished,
        detail=detail,
        recovery_s=recovery_s,
        counted_twice=counted_twice(run_ids),
        reservations_leaked=reservations_open(run_ids),
        sandboxes_left=len(left),
        results_lost=results_lost(cluster.trial_logs()),
        notes=notes or {},
    )


def summary(results: list[Result]) -> dict[str, Any]:
    recoveries = [r.recovery_s for r in results]
    return {
        "scenarios": len(results),
        "runs_finished": sum(r.finished for r in results),
        "trials_counted_twice": sum(r.counted_twice for r in results),
        "reservations_leaked": sum(r.reservations_leaked for r in results),
        "sandboxes_left": sum(r.sandboxes_left for r in results),
        "results_lost": sum(r.results_lost for r in results),
        "max_recovery_s": None if None in recoveries else max(recoveries, default=0.0),
        "per_scenario": {
            r.name: {
                "finished": r.finished,
                "recovery_s": r.recovery_s,
                "counted_twice": r.counted_twice,
                "reservations_leaked": r.reservations_leaked,
                "sandboxes_left": r.sandboxes_left,
                "results_lost": r.results_lost,
                **r.notes,
            }
            for r in results
        },
    }

"""The quick fault scenarios (bench/faults.py --quick) on private PostgreSQL and Redis
instances the bench starts itself: a PostgreSQL fast restart while trials run, and the
SIGKILL of one pool child of a trials worker while its sibling runs on. The machine's
shared services are never restarted."""

from __future__ import annotations

import json

import pytest

from tests.bench.test_bench_smoke import run_bench

pytestmark = pytest.mark.slow


def test_a_database_restart_and_a_killed_pool_child_lose_nothing() -> None:
    out = run_bench("faults.py", "--quick", timeout=600)
    lines = out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["scenarios"] == 2 and summary["runs_finished"] == 2, out
    # Every attempt whose verifier ran is recorded, once; nothing is left held or on disk.
    assert summary["results_lost"] == 0, out
    assert summary["trials_counted_twice"] == 0, out
    assert summary["reservations_leaked"] == 0, out
    assert summary["sandboxes_left"] == 0, out
    restart = summary["per_scenario"]["postgres-restart"]
    assert restart["trials_run_twice"] == 0, out  # no finished attempt was thrown away and redone
    kill = summary["per_scenario"]["child-kill"]
    # Reaped by the pool (no worker restart), and the live sibling's sandbox was not touched.
    assert kill["reaped_without_restart_s"] is not None, out
    assert kill["sibling_untouched"] is True, out
    assert any(line.startswith("postgres-restart: finished") for line in lines), out

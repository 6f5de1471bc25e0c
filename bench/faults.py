"""Faults, end to end: does every accepted run still finish?

    .venv/bin/python bench/faults.py [--scenarios NAME,...] [--quick] [--keep]

Each scenario runs real processes (Celery workers; the model proxy and the gateway where it
needs them) against a PRIVATE PostgreSQL and a PRIVATE Redis that this script starts itself
on free ports in a temporary directory (initdb + pg_ctl; redis-server without persistence),
migrates, imports examples/tasks into, and removes afterwards. The machine's own services
are never touched. Leases last SYNTH_LEASE_TTL_SECONDS=5; the reaper/sweeper runs every
second. The scenarios:

  trials-kill       SIGKILL of the trials worker's whole process group mid-trial; it starts again
  child-kill        SIGKILL of one pool child mid-trial while its sibling runs on
  training-kill     SIGKILL of the training worker during a learning update (local backend, tiny model)
  redis-restart     Redis restarted, without persistence, while trials are queued and running
  postgres-restart  `pg_ctl restart -m fast` while trials run, twice (mid-attempt, and as they end)
  gateway-restart   the gateway (gunicorn) killed and started again under a client that submits
                    (one run before, one during the outage) and polls through it
  second-host       a trials worker host dies; another host (its own SYNTH_WORKER_NAME) takes over

Prints one line per scenario, then, last, one JSON object: scenarios, runs_finished (a run
that succeeded with every trial succeeded; for training-kill, one that ended, failed or
blocked with its message), trials_counted_twice, reservations_leaked (still open after the
run ended), sandboxes_left (sandbox and work directories, tmpfs mounts and cgroups left
after the run ended), results_lost (attempts whose verifier gave a reward, as the worker
logged it, under a lease that never completed), max_recovery_s (from the fault to the first
sign of progress of the work it hit: an event about an affected trial or a heartbeat of its
lease; for training, the run's next event; for the gateway, the client's next answer), and
per_scenario. --quick runs postgres-restart and child-kill with fewer trials (the test suite
runs it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Run as a script (bench/ is sys.path[0]): bench.fault_injection and Django need the repository.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fault_injection.cluster import Cluster, Host  # noqa: E402
from bench.fault_injection.common import LEASE_TTL, TOKENIZER_DIR, free_port, log  # noqa: E402
from bench.fault_injection.inputs import inputs_make  # noqa: E402
from bench.fault_injection.report import Result, summary  # noqa: E402
from bench.fault_injection.scenarios import RUNNERS, Bench  # noqa: E402
from bench.fault_injection.services import PrivatePostgres, PrivateRedis  # noqa: E402

SCENARIOS = (
    "trials-kill",
    "child-kill",
    "training-kill",
    "redis-restart",
    "postgres-restart",
    "gateway-restart",
    "second-host",
)
QUICK = ("postgres-restart", "child-kill")


def platform_env(*, base: Path, pg: PrivatePostgres, redis: PrivateRedis, host: Host) -> dict[str, str]:
    """The environment of every platform process (and of this one): the private services only."""
    inherited = {
        k: v for k, v in os.environ.items() if not k.startswith(("SYNTH_", "DATABASE_URL", "CELERY_", "DJANGO_"))
    }
    var = base / "var"
    return {
        **inherited,
        "DJANGO_SETTINGS_MODULE": "synth_project.settings",
        "DATABASE_URL": pg.url,
        "CELERY_BROKER_URL": redis.url,
        "SYNTH_VAR_DIR": str(var),
        "SYNTH_OBJECT_STORE": f"file://{var / 'objects'}",
        "SYNTH_PUBLIC_URL": f"http://127.0.0.1:{free_port()}",
        "SYNTH_PROXY_SOCKET": str(base / "run" / "proxy.sock"),
        "SYNTH_TOKENIZER_DIR": os.environ.get("SYNTH_TOKENIZER_DIR", TOKENIZER_DIR),
        "SYNTH_LEASE_TTL_SECONDS": str(LEASE_TTL),
        "SYNTH_DB_RETRY_SECONDS": str(2 * LEASE_TTL),
        # The reaper (SYNTH_REAPER_INTERVAL) or the sweeper (SYNTH_SWEEP_*), whichever this
        # version has; lost messages are re-driven after a lease TTL.
        "SYNTH_REAPER_INTERVAL": "1",
        "SYNTH_SWEEP_INTERVAL": "1",
        "SYNTH_SWEEP_GRACE_SECONDS": str(LEASE_TTL),
        "SYNTH_SWEEP_TRIAL_GRACE_SECONDS": str(LEASE_TTL),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "SYNTH_LOG_LEVEL": "INFO",
        # Every process is on host A unless told otherwise: what it reaps is this bench's.
        **host.env(),
    }


def host_clean(hosts: list[Host]) -> None:
    """Between scenarios (every worker stopped): nothing of one is left for the next."""
    from synth_sandbox.sandbox import reap_stale_sandboxes

    for host in hosts:
        reap_stale_sandboxes(host.sandbox_root)
        shutil.rmtree(host.work, ignore_errors=True)
        host.work.mkdir(parents=True)


def bench_make(*, base: Path, pg: PrivatePostgres, redis: PrivateRedis, quick: bool, training: bool) -> Bench:
    """Django in this process on the private services, the inputs, the two hosts' dirs."""
    hosts = [Host(name=f"host-{n}", tmp=base / n, work=base / f"work-{n}") for n in ("a", "b")]
    for host in hosts:
        host.tmp.mkdir(parents=True)
        host.work.mkdir(parents=True)
    (base / "run").mkdir()
    env = platform_env(base=base, pg=pg, redis=redis, host=hosts[0])
    os.environ.clear()
    os.environ.update(env)
    import logging

    import django

    django.setup()
    logging.getLogger().setLevel(logging.WARNING)
    inputs = inputs_make(base=base, training=training)
    cluster = Cluster(base=base, env=env)
    return Bench(
        base=base, pg=pg, redis=redis, cluster=cluster, inputs=inputs, quick=quick, host_a=hosts[0], host_b=hosts[1]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--quick", action="store_true", help=f"{', '.join(QUICK)} only, with fewer trials")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs) afterwards")
    args = parser.parse_args()
    names = list(QUICK) if args.quick else [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r}; choose from {', '.join(SCENARIOS)}")

    # Short: a sandbox's socket path (sun_path, 108 bytes) lies below the host's TMPDIR.
    base = Path(tempfile.mkdtemp(prefix="sf-", dir="/tmp"))
    os.chmod(base, 0o711)  # the sandbox uid must reach the sandbox root below it
    pg, redis = PrivatePostgres(base / "pg"), PrivateRedis(base / "redis")
    cluster = None
    results: list[Result] = []
    try:
        pg.start()
        redis.start()
        bench = bench_make(base=base, pg=pg, redis=redis, quick=args.quick, training="training-kill" in names)
        cluster = bench.cluster
        hosts = [bench.host_a, bench.host_b]
        for name in names:
            log(f"{name}: starting")
            try:
                result = RUNNERS[name](bench)
            except Exception as exc:  # noqa: BLE001 - a scenario that breaks is reported, the next one runs
                log(f"{name}: {type(exc).__name__}: {exc}")
                result = Result(name=name, finished=False, detail=f"{type(exc).__name__}: {exc}", recovery_s=None)
            finally:
                cluster.stop()
                host_clean(hosts)
            results.append(result)
            print(result.line(), flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        redis.stop()
        pg.stop()
        if args.keep:
            print(f"kept {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(summary(results)), flush=True)


if __name__ == "__main__":
    main()

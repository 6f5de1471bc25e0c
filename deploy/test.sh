#!/usr/bin/env bash
# Runs the static checks (deploy/checks.sh: ruff, format, import contracts, types), then the
# test suite on PostgreSQL and Redis (set-up included). Extra arguments go to pytest;
# SYNTH_CHECKS=0 skips the static checks (for a quick run of a few tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
bash deploy/services.sh
if [ "${SYNTH_CHECKS:-1}" != 0 ]; then
  bash deploy/checks.sh
fi
export DATABASE_URL=${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/synth}
export CELERY_BROKER_URL=${TEST_CELERY_BROKER_URL:-redis://127.0.0.1:6379/15}
# Two test processes by default (SYNTH_TEST_WORKERS; 0 runs in this one): most end-to-end
# tests wait on subprocesses, sandboxes and servers. A file's tests stay in one process
# (their module fixtures are made once); each process has its own test database and Redis db.
workers=${SYNTH_TEST_WORKERS:-2}
parallel=()
if [ "$workers" != 0 ]; then parallel=(-n "$workers" --dist loadfile); fi
exec .venv/bin/pytest -p no:cacheprovider --timeout=600 "${parallel[@]}" "$@"

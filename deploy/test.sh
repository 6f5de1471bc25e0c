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
exec .venv/bin/pytest -p no:cacheprovider --timeout=600 "$@"

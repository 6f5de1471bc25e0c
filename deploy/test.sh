#!/usr/bin/env bash
# Runs the test suite on PostgreSQL and Redis (set-up included). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
bash deploy/services.sh
export DATABASE_URL=${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/synth}
export CELERY_BROKER_URL=${TEST_CELERY_BROKER_URL:-redis://127.0.0.1:6379/15}
exec .venv/bin/pytest -p no:cacheprovider --timeout=600 "$@"

#!/usr/bin/env bash
# Static checks, run by deploy/test.sh before the tests (so CI runs them): lint, format, the
# dependency rules between runtimes, and types against a baseline that may only shrink.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
echo "checks: ruff check" && $bin/ruff check --quiet .
echo "checks: ruff format --check" && $bin/ruff format --check --quiet .
echo "checks: lint-imports" && $bin/lint-imports --no-cache >/dev/null
# Types: every error not in deploy/mypy-baseline.txt fails, and so does a baseline entry that no
# longer occurs (fixing one means removing it: `bash deploy/checks.sh --sync-types`).
if [ "${1:-}" = "--sync-types" ]; then
  { $bin/mypy || [ $? -eq 1 ]; } | $bin/mypy-baseline sync --baseline-path deploy/mypy-baseline.txt --sort-baseline
  exit 0
fi
echo "checks: mypy"
# mypy exits 1 when it finds errors (the filter judges those) and 2 when it cannot run.
{ $bin/mypy --no-error-summary || [ $? -eq 1 ]; } | $bin/mypy-baseline filter --baseline-path deploy/mypy-baseline.txt --sort-baseline --hide-stats --no-colors

#!/usr/bin/env bash
# Set-up on a fresh machine: the virtual environment at .venv/ with the pinned
# dependencies and the `synth` command. Safe to run again (it only adds what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${SYNTH_PYTHON:-}
if [ -z "$PY" ]; then
  for candidate in python3.12 "$HOME/.pyenv/versions/3.12.1/bin/python" /root/.pyenv/versions/3.12.1/bin/python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      PY=$candidate; break
    fi
  done
fi
[ -n "$PY" ] || { echo "setup: Python 3.12 is required (set SYNTH_PYTHON)" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.requirements.sha256
want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements.txt
  .venv/bin/python -m pip install -q --no-deps -e .
  echo "$want" > "$stamp"
fi

# The local sandbox uses bubblewrap (Debian package); install it when missing and possible.
if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1; }) \
    || echo "setup: could not install bubblewrap; local sandboxes will be unavailable" >&2
fi

# The browser tests (tests/browser) drive Debian's headless Chromium through its chromedriver.
if ! { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } \
  && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; }) \
    || echo "setup: could not install chromium and chromium-driver; the browser tests will fail" >&2
fi

# Claude Code and Codex, pinned in package.json / package-lock.json: node_modules/.bin/claude
# and Codex's native executable are bound read-only into local sandboxes
# (apps/trials/model_access.py). Needs node + npm; reinstalled only when the lock file changes.
if command -v npm >/dev/null 2>&1; then
  npm_stamp=node_modules/.package-lock.sha256
  npm_want=$(sha256sum package-lock.json | cut -d' ' -f1)
  if [ ! -x node_modules/.bin/claude ] || [ ! -x node_modules/.bin/codex ] || [ "$(cat "$npm_stamp" 2>/dev/null)" != "$npm_want" ]; then
    npm ci --no-audit --no-fund --loglevel=error \
      && echo "$npm_want" > "$npm_stamp" \
      || echo "setup: npm ci failed; agents with engines claude-code and codex will not run in local sandboxes" >&2
  fi
else
  echo "setup: node/npm not found; agents with engines claude-code and codex will not run in local sandboxes" >&2
fi

#!/usr/bin/env bash
# The Python harnesses that trials bind read-only into local sandboxes: one virtual
# environment per harness under .harnesses/ (SYNTH_HARNESSES_DIR), installed from its lock in
# deploy/harnesses/ (every package pinned with its hashes). Safe to run again: a venv is
# rebuilt only when its lock or interpreter changes (the stamp file inside it).
#
# The sandbox sees the host's /usr and /opt but not /root or the home directories, so the
# venv's interpreter must live there (a pyenv python would be missing inside): the first of
# SYNTH_HARNESS_PYTHON, /usr/local/bin/python3.12, /usr/bin/python3.12, /usr/bin/python3.11.
set -euo pipefail
cd "$(dirname "$0")/.."

# The default is the one settings.py uses (synth_sandbox.paths.harnesses_default_dir): .harnesses/,
# or a temp-dir location when other users cannot reach the checkout.
root=${SYNTH_HARNESSES_DIR:-$(.venv/bin/python -c 'import sys; from pathlib import Path; from synth_sandbox.paths import harnesses_default_dir; print(harnesses_default_dir(repo=Path(sys.argv[1])))' "$PWD")}
mkdir -p "$root" && chmod 755 "$root"
pip_python=${SYNTH_HARNESS_PIP_PYTHON:-.venv/bin/python}  # a pip that installs into another interpreter

py=${SYNTH_HARNESS_PYTHON:-}
if [ -z "$py" ]; then
  for candidate in /usr/local/bin/python3.12 /usr/bin/python3.12 /usr/bin/python3.11; do
    if [ -x "$candidate" ]; then py=$candidate; break; fi
  done
fi
case "$(readlink -f "${py:-/missing}")" in
  /usr/*|/opt/*) ;;
  *) echo "harnesses: no Python 3.11/3.12 under /usr or /opt (set SYNTH_HARNESS_PYTHON); engine mini-swe-agent will not run" >&2
     exit 0 ;;
esac

for lock in deploy/harnesses/*.txt; do
  name=$(basename "$lock" .txt)
  venv=$root/$name
  want=$(cat "$lock" | sha256sum | cut -d' ' -f1)-$(readlink -f "$py")
  if [ "$(cat "$venv/.lock.sha256" 2>/dev/null)" = "$want" ]; then
    continue
  fi
  # Built aside and moved into place, so a failed or concurrent build never leaves a half venv.
  rm -rf "$venv.partial"
  "$py" -m venv --without-pip "$venv.partial"
  if "$pip_python" -m pip --python "$venv.partial/bin/python" install -q --no-deps --require-hashes -r "$lock"; then
    echo "$want" > "$venv.partial/.lock.sha256"
    chmod -R go+rX "$venv.partial"  # the sandbox's uid is unprivileged
    rm -rf "$venv" && mv "$venv.partial" "$venv"
  else
    rm -rf "$venv.partial"
    echo "harnesses: installing $name failed; engine $name will not run in local sandboxes" >&2
  fi
done

#!/bin/bash
# The loop handed the remainder to one person too few: range(remainder - 1).
set -euo pipefail
cd /app
python3 - <<'PY'
from pathlib import Path

path = Path("/app/billing/split.py")
source = path.read_text()
fixed = source.replace("for i in range(remainder - 1):", "for i in range(remainder):")
assert fixed != source, "bug not found"
path.write_text(fixed)
PY
python3 -m unittest test_split

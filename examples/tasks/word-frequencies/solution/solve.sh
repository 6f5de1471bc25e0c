#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import collections
import json
import re
from pathlib import Path

files = {}
counts = collections.Counter()
for path in sorted(Path("/app/input").glob("*.txt")):
    words = [w.lower() for w in re.findall(r"[A-Za-z]+", path.read_text(encoding="utf-8"))]
    files[path.name] = len(words)
    counts.update(words)
top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
summary = {"files": files, "total": sum(files.values()), "unique": len(counts), "top": [list(t) for t in top]}
Path("/app/out.json").write_text(json.dumps(summary, indent=2) + "\n")
PY
cat /app/out.json

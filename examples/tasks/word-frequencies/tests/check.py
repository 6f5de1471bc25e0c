"""Reward 1 when /app/out.json equals the expected summary (JSON equality, any formatting)."""
import json
import sys
from pathlib import Path

expected = json.loads(Path("/tests/expected.json").read_text())
try:
    got = json.loads(Path("/app/out.json").read_text())
except FileNotFoundError:
    sys.exit("/app/out.json is missing")
except json.JSONDecodeError as exc:
    sys.exit(f"/app/out.json is not JSON: {exc}")
if got != expected:
    sys.exit(f"mismatch\n got: {json.dumps(got, sort_keys=True)}\nwant: {json.dumps(expected, sort_keys=True)}")
print("out.json ok")

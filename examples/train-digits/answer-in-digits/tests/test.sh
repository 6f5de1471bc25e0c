#!/bin/bash
# Graded reward in [0, 1]: the share of the agent's final reply made of ASCII digits, read
# from the synth-mini transcript. A dense signal that a policy can climb.
mkdir -p /logs/verifier
python3 - <<'PY' > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
import json

text = ""
try:
    with open("/logs/agent/synth-mini.jsonl", encoding="utf-8") as fh:
        for line in fh:
            record = json.loads(line)
            if record.get("type") == "response":
                blocks = (record.get("body") or {}).get("content") or []
                text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text") or text
except OSError:
    pass
good = sum(1 for c in text if "0" <= c <= "9")
print(round(good / len(text), 6) if text else 0)
PY

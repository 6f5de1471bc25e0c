#!/bin/bash
# What a perfect reply looks like to the verifier (a transcript line of digits).
mkdir -p /logs/agent
echo '{"type": "response", "body": {"content": [{"type": "text", "text": "42"}]}}' >> /logs/agent/synth-mini.jsonl

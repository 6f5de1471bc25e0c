#!/bin/bash
# What a perfect reply looks like to the verifier (a transcript line of digits).
mkdir -p /logs/agent
echo '{"type": "response", "body": {"content": [{"type": "text", "text": "123456789"}]}}' >> /logs/agent/synth-mini.jsonl

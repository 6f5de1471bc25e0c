#!/bin/bash
# What a perfect reply looks like to the verifier (a transcript line of plain words).
mkdir -p /logs/agent
echo '{"type": "response", "body": {"content": [{"type": "text", "text": "Hello there friend"}]}}' >> /logs/agent/synth-mini.jsonl

#!/bin/bash
# Reward 1 when /tests/test_roman.py passes against /app/roman.py, else 0.
mkdir -p /logs/verifier
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 0; }
if PYTHONPATH=/app python3 -m unittest discover -v -s /tests -p 'test_*.py'; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

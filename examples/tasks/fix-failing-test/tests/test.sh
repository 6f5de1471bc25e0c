#!/bin/bash
# Reward 1 when the visible test (/app/test_split.py) and the hidden test both pass, else 0.
# python3 -m unittest only: pytest may not be installed in the sandbox.
mkdir -p /logs/verifier
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 0; }
if [ -f /app/test_split.py ] \
  && python3 -m unittest -v test_split \
  && PYTHONPATH=/app python3 -m unittest discover -v -s /tests -p 'test_*.py'; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

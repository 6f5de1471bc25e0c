#!/bin/bash
# pi(2 * 10^8) = 11078937. Reward 1 for the right count and a program left in /app/primes.py.
mkdir -p /logs/verifier
answer="$(tr -d '[:space:]' < /app/answer.txt 2>/dev/null)"
if [ "$answer" = "11078937" ] && [ -s /app/primes.py ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "got: '${answer}'"
  echo 0 > /logs/verifier/reward.txt
fi

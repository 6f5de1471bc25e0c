"""The fault-injection bench; bench/faults.py runs it."""

"""What every part of the fault bench shares: where the repository is, the lease TTL the
platform runs with, logging to stderr and waiting for a condition."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
LEASE_TTL = 5
TOKENIZER_DIR = "/tmp/synth-test-tokenizers"  # a cache shared with the test suite (built offline)


def log(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")

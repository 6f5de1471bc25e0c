"""Fixtures for harness tests: the execution stack (real Celery workers) and a live model
proxy process on a Unix socket, both against the test database."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.proxy.models import HarnessCheck
from apps.trials.model_access import proxy_listening
from tests.trials.conftest import ROOT, Stack, stack  # noqa: F401 - the stack fixture, shared

# Built once per machine (idempotent) and shared with tests/proxy.
TOKENIZER_DIR = Path("/tmp/synth-test-tokenizers")


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    from apps.proxy.tokenizers import provision

    provision(["qwen3"], root=TOKENIZER_DIR)
    return TOKENIZER_DIR


def proxy_start(on: Stack, *, socket_path: Path, tokenizer_dir: Path, timeout: float = 60) -> subprocess.Popen:
    """The proxy as its own process (uvicorn on a Unix socket, tests/harness/proxy_server.py),
    with the stack's database, broker and object store."""
    log = open(on.tmp / "proxy.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.harness.proxy_server", "--uds", str(socket_path)],
        cwd=ROOT,
        env={**on.env, "SYNTH_TOKENIZER_DIR": str(tokenizer_dir)},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    on.procs.append(proc)
    deadline = time.monotonic() + timeout
    while not proxy_listening(path=socket_path):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the proxy did not start on {socket_path}\n{on.logs()}")
        time.sleep(0.1)
    return proc


@pytest.fixture
def proxy_socket() -> Iterator[Path]:
    """A short path for the proxy's socket (sun_path holds 108 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="synth-hx-"))
    yield directory / "proxy.sock"
    (directory / "proxy.sock").unlink(missing_ok=True)
    directory.rmdir()


def harness_checked(*, engine: str, tmp: Path, tokenizer_dir: Path) -> HarnessCheck:
    """Run `harness_check ENGINE` for real against the test database (the check's proxy
    process gets the same environment as the stack's workers). Needs a transactional test."""
    from django.test import override_settings

    from apps.trials.harness_check.service import harness_check_run

    with override_settings(SYNTH_TOKENIZER_DIR=tokenizer_dir):
        return harness_check_run(engine=engine, env=Stack(tmp).env)

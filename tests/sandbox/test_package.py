"""The sandbox package is library code: it runs without the platform's server code."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import synth_sandbox

ROOT = Path(__file__).resolve().parents[2]


def test_no_module_of_the_sandbox_imports_django() -> None:
    names = sorted(f"synth_sandbox.{m.name}" for m in pkgutil.iter_modules(synth_sandbox.__path__))
    assert "synth_sandbox.sandbox" in names and "synth_sandbox.environment" in names
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework', 'celery'))\n"
        "assert not bad, bad\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)


def test_the_sandbox_itself_does_not_import_harbor() -> None:
    """Harbor is for the environment provider; the bare sandbox (and its owner records, which
    the trials worker reads) must not pay for it."""
    code = (
        "import sys, synth_sandbox.sandbox\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('harbor', 'django', 'celery'))\n"
        "assert not bad, bad\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)

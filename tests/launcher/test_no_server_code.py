"""The CLI, the launcher and the sandbox run without the server: importing any of their
modules loads no Django and no server code (apps.*, synth_project.*)."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER = ("django", "rest_framework", "celery", "apps", "synth_project")

IMPORTS = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def _modules(package: str) -> list[str]:
    found = [f"{package}.{m.name}" for m in pkgutil.iter_modules([str(ROOT / package)]) if m.name != "__main__"]
    assert found, package
    return found


@pytest.mark.parametrize(
    "modules",
    [
        ["synth_cli.main", "synth_cli.local_agent", *_modules("synth_cli")],
        _modules("synth_launcher"),
        _modules("synth_sandbox"),
        _modules("synth_common"),
    ],
    ids=["synth_cli", "synth_launcher", "synth_sandbox", "synth_common"],
)
def test_modules_load_no_server_code(modules):
    out = subprocess.run(
        [sys.executable, "-c", IMPORTS, *modules], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    assert set(modules) <= set(loaded)
    server = [name for name in loaded if name.split(".")[0] in SERVER]
    assert server == [], server

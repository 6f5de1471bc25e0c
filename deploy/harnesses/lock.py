"""Lock a harness's Python packages: deploy/harnesses/NAME.in -> deploy/harnesses/NAME.txt.

    python deploy/harnesses/lock.py mini-swe-agent

The lock names every package of the resolution with its version and the sha256 of each
wheel that an interpreter of :data:`TARGETS` installs (binary wheels differ per Python
version), so that deploy/harnesses.sh installs it with ``--require-hashes --no-deps``: what
runs in the sandbox is exactly what was locked. The first target resolves the ``.in`` file;
the others are held to its versions. A package only one target needs carries a marker.
Needs network access to the package index (pip's own resolver does the work).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The interpreters a harness venv is built with: Debian bookworm's /usr/bin/python3.11 (the
# development machines) and the image's /usr/local/bin/python3.12 (deploy/Dockerfile).
TARGETS = ("3.11", "3.12")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def _resolve(*, requirements: Path, python_version: str, constraints: Path | None) -> dict[str, tuple[str, str]]:
    """{normalized name: (version, sha256)} of what pip would install for that Python."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed"]
        command += ["--report", str(report), "--target", str(Path(tmp) / "target"), "--only-binary=:all:"]
        command += ["--python-version", python_version]
        for platform in PLATFORMS:
            command += ["--platform", platform]
        command += ["-r", str(requirements)]
        if constraints is not None:
            command += ["-c", str(constraints)]
        subprocess.run(command, check=True)
        installs = json.loads(report.read_text())["install"]
    resolved = {}
    for item in installs:
        name = item["metadata"]["name"].lower().replace("_", "-").replace(".", "-")
        resolved[name] = (item["metadata"]["version"], item["download_info"]["archive_info"]["hashes"]["sha256"])
    return resolved


def lock(*, name: str) -> Path:
    source = HERE / f"{name}.in"
    per_target: dict[str, dict[str, tuple[str, str]]] = {}
    per_target[TARGETS[0]] = _resolve(requirements=source, python_version=TARGETS[0], constraints=None)
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text("".join(f"{n}=={v}\n" for n, (v, _) in sorted(per_target[TARGETS[0]].items())))
        for target in TARGETS[1:]:
            per_target[target] = _resolve(requirements=source, python_version=target, constraints=constraints)
    lines = [
        f"# Locked from {source.name} by deploy/harnesses/lock.py for Python {', '.join(TARGETS)} on x86_64 Linux;",
        "# installed by deploy/harnesses.sh with --require-hashes --no-deps. Do not edit by hand.",
    ]
    for package in sorted({n for resolved in per_target.values() for n in resolved}):
        versions = {resolved[package][0] for resolved in per_target.values() if package in resolved}
        if len(versions) != 1:
            raise SystemExit(f"{package}: the targets resolved different versions {sorted(versions)}")
        hashes = sorted({resolved[package][1] for resolved in per_target.values() if package in resolved})
        needed_by = [t for t in TARGETS if package in per_target[t]]
        marker = (
            "" if len(needed_by) == len(TARGETS) else " ; " + " or ".join(f'python_version == "{t}"' for t in needed_by)
        )
        lines.append(f"{package}=={versions.pop()}{marker} " + " ".join(f"--hash=sha256:{h}" for h in hashes))
    out = HERE / f"{name}.txt"
    out.write_text("\n".join(lines) + "\n")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2 or not (HERE / f"{sys.argv[1]}.in").is_file():
        raise SystemExit(f"usage: {sys.argv[0]} NAME (one of: {', '.join(p.stem for p in HERE.glob('*.in'))})")
    print(lock(name=sys.argv[1]))

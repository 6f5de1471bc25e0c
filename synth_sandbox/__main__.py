"""Self-check of the local sandbox on this host: ``python -m synth_sandbox``.

Prints which limits this host can enforce, then starts a sandbox, runs a command in it,
stops it, and reports the timings.  Exit status 0 when the sandbox works.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from pathlib import Path

from synth_sandbox.cgroups import detect_hierarchies, make_plan
from synth_sandbox.errors import SandboxError
from synth_sandbox.limits import SandboxLimits
from synth_sandbox.processes import find_tools
from synth_sandbox.sandbox import Sandbox


async def _check(base_dir: Path, memory_mb: int, storage_mb: int) -> dict[str, object]:
    sandbox = Sandbox(
        name=f"selfcheck-{secrets.token_hex(4)}",
        base_dir=base_dir,
        limits=SandboxLimits(memory_mb=memory_mb, cpus=1, storage_mb=storage_mb),
    )
    t0 = time.perf_counter()
    await sandbox.start()
    t1 = time.perf_counter()
    try:
        result = await sandbox.exec("id -u && test ! -w /usr && echo ok")
    finally:
        t2 = time.perf_counter()
        await sandbox.stop(delete=True)
    t3 = time.perf_counter()
    return {
        "works": result.return_code == 0 and result.stdout.strip().endswith("ok"),
        "output": result.stdout + result.stderr,
        "enforced_limits": sandbox.enforced_limits,
        "unenforced_limits": sandbox.unenforced_limits,
        "timings_ms": {
            "start": round((t1 - t0) * 1000, 1),
            "exec": round((t2 - t1) * 1000, 1),
            "stop": round((t3 - t2) * 1000, 1),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-dir", type=Path, default=Path("/tmp/synth-sandboxes"))
    parser.add_argument("--memory-mb", type=int, default=256)
    parser.add_argument("--storage-mb", type=int, default=64)
    args = parser.parse_args(argv)
    report: dict[str, object] = {}
    try:
        tools = find_tools()
        report["tools"] = vars(tools)
    except SandboxError as exc:
        print(json.dumps({"works": False, "error": str(exc)}, indent=2))
        return 1
    try:
        plan = make_plan(detect_hierarchies())
        report["cgroups"] = {
            "controllers": {c: h.label for c, h in plan.by_controller.items()},
            "tracking": plan.tracking.label if plan.tracking else None,
            "problems": plan.problems,
        }
    except OSError as exc:
        report["cgroups"] = {"error": str(exc)}
    try:
        report.update(asyncio.run(_check(args.base_dir, args.memory_mb, args.storage_mb)))
    except SandboxError as exc:
        report.update({"works": False, "error": str(exc)})
    print(json.dumps(report, indent=2, default=str))
    return 0 if report.get("works") else 1


if __name__ == "__main__":
    sys.exit(main())

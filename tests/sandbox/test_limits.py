"""Resource limits: process count, memory, storage, CPU."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
from pathlib import Path

import pytest

from synth_sandbox import cgroups as cgroups_module
from synth_sandbox import limits as limits_module
from synth_sandbox.errors import SandboxExecTimeoutError
from synth_sandbox.limits import SandboxLimits
from tests.sandbox.helpers import require_limit, requires_root, requires_sandbox, run, started_sandbox

pytestmark = [requires_sandbox, requires_root, pytest.mark.timeout(60)]


@pytest.fixture(params=["default", "v1-freezer"])
def tracking(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run with the host's preferred process tracking, and again with cgroup v1 only (freezer)."""
    if request.param == "v1-freezer":
        real = cgroups_module.detect_hierarchies

        def v1_only(*args: object, **kwargs: object) -> list[cgroups_module.Hierarchy]:
            found = [h for h in real(*args, **kwargs) if h.version == 1]  # type: ignore[arg-type]
            if not any("freezer" in h.controllers for h in found):
                pytest.skip("no cgroup v1 freezer on this host")
            return found

        monkeypatch.setattr(limits_module, "detect_hierarchies", v1_only)
    return str(request.param)


def test_fork_bomb_is_bounded_and_killed(tracking: str) -> None:
    async def main() -> None:
        async with started_sandbox(limits=SandboxLimits(memory_mb=256, pids_max=64)) as sb:
            require_limit(sb, "pids_max")
            with pytest.raises(SandboxExecTimeoutError):
                await sb.exec("bomb() { bomb | bomb & }; bomb; sleep 100", timeout_sec=3)
            # Everything the bomb forked is gone; only the init (bwrap x2 + sleep) remains.
            assert len(sb.pids()) <= 3, sb.pids()
            assert sb._cgroup is not None
            assert (sb._cgroup.plan.tracking.version == 1) == (tracking == "v1-freezer")  # type: ignore[union-attr]
            # The host can still fork, and so can the sandbox.
            assert subprocess.run(["true"]).returncode == 0
            result = await sb.exec("echo alive; cat /proc/self/status | grep -c ^Pid")
            assert result.stdout.startswith("alive")

    run(main())


def test_memory_over_the_limit_is_killed() -> None:
    async def main() -> None:
        async with started_sandbox(limits=SandboxLimits(memory_mb=64, storage_mb=64)) as sb:
            require_limit(sb, "memory_mb")
            result = await sb.exec(
                'python3 -c \'x = bytearray(200 * 1024 * 1024); x[::4096] = b"1" * len(x[::4096]); print("survived")\''
            )
            assert result.return_code == 137, (result.return_code, result.stdout, result.stderr)
            assert "survived" not in result.stdout
            assert result.oom_kills >= 1 and (sb.oom_kills() or 0) >= 1
            # Below the limit works, and the sandbox itself survived the OOM kill.
            ok = await sb.exec("python3 -c 'x = bytearray(16 * 1024 * 1024); print(len(x))'")
            assert ok.return_code == 0 and ok.stdout.strip() == str(16 * 1024 * 1024)

    run(main())


def test_storage_is_limited() -> None:
    async def main() -> None:
        async with started_sandbox(limits=SandboxLimits(memory_mb=256, storage_mb=16)) as sb:
            require_limit(sb, "storage_mb")
            result = await sb.exec("dd if=/dev/zero of=/app/big bs=1M count=40 2>&1; echo rc=$?; df -m /app | tail -1")
            assert "No space left on device" in result.stdout
            # The quota is shared by all writable directories.
            more = await sb.exec("echo x > /tmp/small 2>&1 || echo full")
            assert "full" in more.stdout or "No space" in more.stdout

    run(main())


def test_cpu_quota_is_applied() -> None:
    async def main() -> None:
        async with started_sandbox(limits=SandboxLimits(memory_mb=256, cpus=0.25)) as sb:
            require_limit(sb, "cpus")
            # Two busy processes for ~1 s of wall time get about a quarter of one CPU in total.
            result = await sb.exec(
                "python3 - <<'EOF'\n"
                "import os, time, resource\n"
                "pids = []\n"
                "for _ in range(2):\n"
                "    pid = os.fork()\n"
                "    if pid == 0:\n"
                "        end = time.time() + 1.0\n"
                "        while time.time() < end: pass\n"
                "        os._exit(0)\n"
                "    pids.append(pid)\n"
                "for pid in pids: os.waitpid(pid, 0)\n"
                "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime)\n"
                "EOF"
            )
            cpu_seconds = float(result.stdout.strip())
            assert cpu_seconds < 0.6, cpu_seconds

    run(main())


def _argv(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        return []


def test_an_exec_spends_the_cpu_quota_on_its_command_not_on_the_helpers_before_it() -> None:
    async def main() -> None:
        async with started_sandbox(limits=SandboxLimits(memory_mb=256, cpus=0.25)) as sb:
            require_limit(sb, "cpus")
            assert sb._cgroup is not None
            cpu_procs = sb._cgroup.cpu_procs_file
            if cpu_procs is None:
                pytest.skip("the cpu controller is in the tracking hierarchy here: every helper is on the quota")
            seconds = str(1000 + secrets.randbelow(10**6))  # sleep's own argument marks the command
            running = asyncio.ensure_future(sb.exec(f"ls /proc/$$/fd; exec sleep {seconds}"))
            while not (command := [p for p in sb.pids() if _argv(p) == [b"sleep", seconds.encode()]]):
                await asyncio.sleep(0.02)
            on_quota = {int(p) for p in cpu_procs.read_text().split()}
            tracked = sb.pids()
            # The command is on the task's CPU share and tracked; the exec's helper that waits
            # for it (nsenter, on the host's side of the pid namespace) is tracked only.
            assert set(command) <= on_quota and set(command) <= tracked
            helpers = tracked - on_quota
            assert helpers and all(_argv(p)[:1] and _argv(p)[0].endswith(b"nsenter") for p in helpers), [
                _argv(p) for p in helpers
            ]
            os.kill(command[0], signal.SIGKILL)
            result = await running
            assert result.return_code == 137, result
            # Neither the environment's memfd nor the cpu cgroup's descriptor reaches the command.
            assert result.stdout.split() == ["0", "1", "2"], result

    run(main())


def test_every_exec_has_no_core_dumps_and_its_cpu_time_limit() -> None:
    async def main() -> None:
        async with started_sandbox(limits=SandboxLimits(memory_mb=256, cpu_time_sec=1)) as sb:
            assert sb.enforced_limits.get("cpu_time_sec") == 1
            # Soft and hard, so the command cannot raise them again.
            limits = await sb.exec("echo $(ulimit -Sc) $(ulimit -Hc) $(ulimit -St) $(ulimit -Ht)")
            assert limits.stdout.split() == ["0", "0", "1", "1"], limits
            raised = await sb.exec("ulimit -t 100 2>&1 || echo refused")
            assert "refused" in raised.stdout, raised
            # A process past its CPU time is killed by the kernel: at the soft limit with
            # SIGXCPU (128 + 24), and here the hard one is the same, so with SIGKILL.
            spun = await sb.exec("exec python3 -c 'while True: pass'")
            assert spun.return_code in (137, 152) and spun.oom_kills == 0, spun
        async with started_sandbox(limits=SandboxLimits(memory_mb=256)) as sb:
            unlimited = await sb.exec("echo $(ulimit -Sc) $(ulimit -t)")
            assert unlimited.stdout.split() == ["0", "unlimited"], unlimited

    run(main())

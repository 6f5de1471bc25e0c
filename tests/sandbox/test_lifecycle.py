"""Process trees die with their exec (timeout, cancellation) or with the sandbox (stop)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from synth_sandbox.errors import SandboxExecTimeoutError
from synth_sandbox.limits import SandboxLimits
from synth_sandbox.owners import reap_stale_sandboxes
from synth_sandbox.sandbox import Sandbox
from tests.sandbox.helpers import (
    BASE_DIR,
    new_marker,
    processes_with_marker,
    requires_root,
    requires_sandbox,
    run,
    started_sandbox,
)

pytestmark = [requires_sandbox, pytest.mark.timeout(60)]


def _spawner(marker: str) -> str:
    """A command leaving children behind in every way a shell can: background, nohup,
    setsid (new session), double fork (reparented to the sandbox's init)."""
    sleeper = "python3 -c 'import time; time.sleep(300)'"  # the marker is in its argv
    return (
        f"{sleeper} {marker}-bg & "
        f"nohup {sleeper} {marker}-nohup >/dev/null 2>&1 & "
        f"setsid {sleeper} {marker}-setsid >/dev/null 2>&1 < /dev/null & "
        f"( ( {sleeper} {marker}-orphan & ) & ) ; "
        f"{sleeper} {marker}-main"
    )


def _wait_for(predicate, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@requires_root
def test_timeout_kills_the_whole_tree_and_stop_cleans_up() -> None:
    marker = new_marker()

    async def main() -> Sandbox:
        async with started_sandbox() as sb:
            task = asyncio.ensure_future(sb.exec(_spawner(marker), timeout_sec=1.5))
            await asyncio.sleep(1.0)
            # All five sleepers started (plus the host-side nsenter whose argv holds the command).
            assert len(processes_with_marker(marker)) >= 5
            with pytest.raises(SandboxExecTimeoutError) as info:
                await task
            assert "timed out after 1.5 seconds" in str(info.value)
            assert processes_with_marker(marker) == []
            assert sorted(p.name for p in next(iter(sb._cgroup.dirs.values())).iterdir() if p.is_dir()) == []  # type: ignore[union-attr]
            # The sandbox is still usable afterwards.
            assert (await sb.exec("echo ok")).stdout == "ok\n"
            cgroup_dirs = list(sb._cgroup.dirs.values())  # type: ignore[union-attr]
            assert all(d.exists() for d in cgroup_dirs)
            sb_path = sb.path
        assert not sb_path.exists()
        assert not any(d.exists() for d in cgroup_dirs)
        return sb

    sb = run(main())
    assert sb.init_pid is not None
    assert _wait_for(lambda: _dead(sb.init_pid or 0))


def _dead(pid: int) -> bool:
    # The sandbox's PID 1 is a grandchild of the worker: once killed it may linger briefly as
    # a zombie until the host's init reaps it.
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def test_background_processes_outlive_their_exec_until_stop() -> None:
    marker = new_marker()

    async def main() -> None:
        async with started_sandbox() as sb:
            # Like docker exec: the exec returns when its main process exits, even though the
            # background child still holds the output pipe (and is still running).
            result = await sb.exec(f"python3 -c 'import time; time.sleep(300)' {marker} & echo started")
            assert result.stdout == "started\n"
            assert len(processes_with_marker(marker)) == 1
            visible = await sb.exec(f"ps -eo args | grep -c '^python3 .*{marker}'")
            assert visible.stdout.strip() == "1"  # later execs share the process table
        assert _wait_for(lambda: processes_with_marker(marker) == [])

    run(main())


@requires_root
def test_cancellation_kills_the_exec_tree() -> None:
    marker = new_marker()

    async def main() -> None:
        async with started_sandbox() as sb:
            # Harbor's agent timeout cancels agent.run() and with it the exec in flight.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(sb.exec(_spawner(marker)), 1.0)
            assert _wait_for(lambda: processes_with_marker(marker) == [])
            assert (await sb.exec("echo still-running")).stdout == "still-running\n"

    run(main())


def test_exec_result_env_cwd_and_exit_codes(tmp_path: Path) -> None:
    async def main() -> None:
        async with started_sandbox(workdir="/work/space") as sb:
            result = await sb.exec('pwd; echo "$A|$B"; exit 3', env={"A": "x y", "B": "multi\nline"})
            assert result.stdout == "/work/space\nx y|multi\nline\n" and result.return_code == 3
            assert (await sb.exec("kill -9 $$")).return_code == 137
            missing = await sb.exec("true", cwd="/does/not/exist")
            assert missing.return_code != 0
            chunks: list[tuple[str, str]] = []

            async def on_output(text: str, stream: str) -> None:
                chunks.append((stream, text))

            await sb.exec("echo out; echo err >&2", on_output=on_output)
            assert ("stdout", "out\n") in chunks and ("stderr", "err\n") in chunks
            # Files round-trip through the host directories.
            src = tmp_path / "in.txt"
            src.write_text("payload")
            await sb.upload_file(src, "/work/space/sub/in.txt")
            assert (await sb.exec("cat sub/in.txt")).stdout == "payload"
            await sb.download_file("/work/space/sub/in.txt", tmp_path / "back.txt")
            assert (tmp_path / "back.txt").read_text() == "payload"

    run(main())


@requires_root
def test_reap_stale_sandboxes_after_a_worker_crash() -> None:
    marker = new_marker()
    base = BASE_DIR / "reap"

    async def main() -> None:
        sb = Sandbox(name=f"stale-{marker[-6:]}", base_dir=base, limits=SandboxLimits(memory_mb=128, storage_mb=16))
        await sb.start()
        await sb.exec(f"python3 -c 'import time; time.sleep(300)' {marker} >/dev/null 2>&1 &")
        assert processes_with_marker(marker)
        cgroup_dirs = list(sb._cgroup.dirs.values())  # type: ignore[union-attr]
        # Pretend the worker that owned it died.
        meta_path = sb.path / "meta.json"
        meta = json.loads(meta_path.read_text())
        meta["owner_pid"] = 2**22 + 12345
        meta_path.write_text(json.dumps(meta))
        assert reap_stale_sandboxes(base) == [sb.name]
        assert processes_with_marker(marker) == []
        assert not sb.path.exists()
        assert not any(d.exists() for d in cgroup_dirs)
        assert not any(line.split()[4] == str(sb.fs) for line in Path("/proc/self/mountinfo").read_text().splitlines())
        await sb.stop(delete=True)  # still safe afterwards

    run(main())
    assert os.path.isdir(base)

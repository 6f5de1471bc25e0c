"""What a sandboxed command cannot reach: the network, the platform's environment, the host's files."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from synth_sandbox.errors import SandboxPathError
from tests.sandbox.helpers import new_marker, requires_root, requires_sandbox, run, started_sandbox

pytestmark = [requires_sandbox, pytest.mark.timeout(60)]

PROBE = (
    "for port in 5432 6379; do "
    '  if timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; then echo "$port open"; '
    '  else echo "$port closed"; fi; '
    "done; "
    "if timeout 3 bash -c 'exec 3<>/dev/tcp/1.1.1.1/53' 2>/dev/null; then echo 'internet open'; else echo 'internet closed'; fi; "
    "ls /var/run/postgresql /run/postgresql 2>&1 | head -2; "
    "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '"
)


def _host_port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_no_network_except_loopback() -> None:
    host_open = {port: _host_port_open(port) for port in (5432, 6379)}

    async def main() -> None:
        async with started_sandbox() as sb:
            result = await sb.exec(PROBE)
            lines = result.stdout.splitlines()
            # PostgreSQL and Redis listen on the host's 127.0.0.1 (when they run); the sandbox's
            # 127.0.0.1 is its own, empty loopback.
            assert "5432 closed" in lines and "6379 closed" in lines, result.stdout
            assert "internet closed" in lines
            # The database's Unix socket directory of the host is not there either.
            assert "No such file or directory" in result.stdout
            interfaces = [line for line in lines[-3:] if line and " " not in line and "/" not in line]
            assert interfaces == ["lo"], lines

    run(main())
    # The probe is meaningful only if the services really are up on the host.
    if not all(host_open.values()):
        pytest.skip(f"host services not all running ({host_open}); the sandbox side was checked anyway")


def test_platform_environment_is_invisible(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = new_marker()
    monkeypatch.setenv("DATABASE_URL", f"postgres://user:{secret}@127.0.0.1:5432/synth")
    monkeypatch.setenv("SECRET_KEY", secret)
    monkeypatch.setenv("SYNTH_TOKEN", secret)
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)

    async def main() -> None:
        async with started_sandbox() as sb:
            result = await sb.exec(
                "env; echo ---; cat /proc/1/environ | tr '\\0' '\\n'; echo ---; "
                "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | sort -u; echo ---; ls /proc | grep -c '^[0-9]'",
                env={"TASK_VAR": "visible"},
            )
            assert secret not in result.stdout
            env_part, init_env, all_env, nprocs = result.stdout.split("---\n")
            names = {line.split("=", 1)[0] for line in env_part.splitlines() if "=" in line}
            assert not {"DATABASE_URL", "SECRET_KEY", "SYNTH_TOKEN", "ANTHROPIC_API_KEY"} & names
            assert not any(n.startswith("SYNTH_") for n in names)
            assert "TASK_VAR" in names
            assert names <= {
                "PATH",
                "HOME",
                "USER",
                "LOGNAME",
                "SHELL",
                "LANG",
                "TERM",
                "HOSTNAME",
                "TASK_VAR",
                "PWD",
                "OLDPWD",
                "SHLVL",
                "_",
            }, names
            # PID 1 in the sandbox is its own init, with nothing but a fixed PATH (and PWD=/).
            assert {line.split("=", 1)[0] for line in init_env.splitlines() if line} <= {"PATH", "PWD"}
            assert "PWD=/work" not in init_env
            # Only the sandbox's own handful of processes is visible, never the host's.
            assert int(nprocs) < 10
            # The host's PID of this test process does not exist in the sandbox's /proc.
            probe = await sb.exec(f"cat /proc/{os.getpid()}/environ 2>&1 | head -c 200; echo")
            assert secret not in probe.stdout

    run(main())


@requires_root
def test_host_files_are_read_only_or_absent() -> None:
    marker = new_marker()
    host_tmp_file = Path("/tmp") / f"{marker}-host"
    host_tmp_file.write_text("host data")
    try:

        async def main() -> None:
            async with started_sandbox() as sb:
                result = await sb.exec(
                    f"""
                    for p in /etc/{marker} /usr/{marker} /{marker} /opt/{marker} /work/{marker}; do
                      if echo x > "$p" 2>/dev/null; then echo "WROTE $p"; else echo "denied $p"; fi
                    done
                    echo inside > /root/{marker}; echo inside > /tmp/{marker}
                    test -e {host_tmp_file} && echo "SEES HOST TMP" || echo "no host tmp"
                    cat /etc/shadow >/dev/null 2>&1 && echo "READ SHADOW" || echo "no shadow"
                    ls -d /work /home /var/lib /sys /root/.pyenv 2>&1 | grep -c 'No such file'
                    touch /proc/sys/kernel/hostname 2>/dev/null && echo "WROTE PROC" || echo "no proc write"
                    mount -o remount,rw /usr 2>/dev/null && echo "REMOUNTED" || echo "no remount"
                    unshare -U true 2>/dev/null && echo "NESTED USERNS" || echo "no userns"
                    id -u; grep CapEff /proc/self/status
                    """
                )
                out = result.stdout
                assert "WROTE" not in out and out.count("denied") == 5, out
                assert "no host tmp" in out and "no shadow" in out
                assert "\n5\n" in out  # none of the host's private trees exist inside
                assert "no proc write" in out and "no remount" in out and "no userns" in out
                assert "CapEff:\t0000000000000000" in out
                assert out.split("\n")[-3] == "0"  # root inside ...
                # ... but its writes to /root and /tmp land in the sandbox's own directories.
                assert sb.host_path(f"/root/{marker}").read_text() == "inside\n"
                assert sb.host_path(f"/tmp/{marker}").read_text() == "inside\n"
                assert not (Path("/root") / marker).exists()
                assert not (Path("/tmp") / marker).exists()
                # On the host the sandbox's files belong to the unprivileged sandbox uid.
                assert sb.host_path(f"/tmp/{marker}").stat().st_uid == sb.uid != 0

        run(main())
    finally:
        host_tmp_file.unlink()


@requires_root
def test_transfers_never_follow_sandbox_symlinks(tmp_path: Path) -> None:
    marker = new_marker()
    victim = Path("/tmp") / f"{marker}-victim"
    victim.write_text("host secret")
    upload = tmp_path / "test.sh"
    upload.write_text("#!/bin/bash\necho from host\n")
    try:

        async def main() -> None:
            async with started_sandbox() as sb:
                # The sandbox plants symlinks to host paths (resolved on the host they would
                # point at the victim file and at /etc).
                await sb.exec(
                    f"ln -s {victim} /logs/agent/leak.txt && mkdir -p /logs/agent/sub && "
                    f"ln -s {victim} /logs/agent/sub/leak2 && echo fine > /logs/agent/ok.txt && "
                    f"ln -s /etc /tests/sub && ln -s {victim} /tests/test.sh && mkfifo /logs/agent/fifo"
                )
                out = tmp_path / "out"
                await sb.download_dir("/logs/agent", out)
                assert (out / "ok.txt").read_text() == "fine\n"
                assert not (out / "leak.txt").exists() and not (out / "sub" / "leak2").exists()
                assert not (out / "fifo").exists()
                with pytest.raises(FileNotFoundError):
                    await sb.download_file("/logs/agent/leak.txt", tmp_path / "leak")
                # Uploads replace the planted links instead of writing through them.
                await sb.upload_file(upload, "/tests/test.sh")
                await sb.upload_file(upload, "/tests/sub/test.sh")
                assert victim.read_text() == "host secret"
                assert not Path("/etc/test.sh").exists()
                result = await sb.exec(
                    "bash /tests/test.sh && ls -la /tests/sub | head -2 && stat -c %U /tests/test.sh"
                )
                assert "from host" in result.stdout and "root" in result.stdout
                # Container paths that escape the writable directories are refused.
                for bad in ("/etc/passwd", "/app/../etc/passwd", "relative/path", "/usr/bin/x"):
                    with pytest.raises(SandboxPathError):
                        await sb.upload_file(upload, bad)
                with pytest.raises(SandboxPathError):
                    await sb.download_file("/etc/hostname", tmp_path / "x")

        run(main())
    finally:
        victim.unlink()

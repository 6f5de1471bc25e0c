"""The end of a phase inside one sandbox: every process but the init is killed, whatever it
did to escape; lookups and missing commands are observed."""

from __future__ import annotations

import shlex

import pytest

from synth_sandbox.hooks import CHECK_HOOK, HOOKS_IN_SANDBOX
from tests.cheats import PROCESS_TECHNIQUES, SCRIPT, cheat_env
from tests.sandbox.helpers import requires_root, requires_sandbox, run, started_sandbox

pytestmark = [requires_sandbox, pytest.mark.timeout(60)]


@pytest.mark.parametrize("technique", PROCESS_TECHNIQUES)
def test_end_processes_leaves_only_the_init(technique):
    async def main() -> None:
        async with started_sandbox() as sandbox:
            result = await sandbox.exec(f"bash -c {_q(SCRIPT)}", env=cheat_env(technique))
            assert result.return_code == 0, result.stderr
            survivors = await sandbox.exec("ps -eo pid=,comm= | grep -v ' ps$'")
            assert len(survivors.stdout.split("\n")) > 3, survivors.stdout  # the cheater outlived its exec
            killed = await sandbox.end_processes()
            assert killed >= 1
            left = await sandbox.exec("ps -eo pid=,ppid=,comm=")
            rows = [line.split() for line in left.stdout.strip().splitlines()]
            # PID 1 (bubblewrap), its idle child (sleep) and the ps of this very exec.
            assert sorted(r[2] for r in rows) == ["bwrap", "ps", "sleep"], left.stdout
            assert await sandbox.end_processes() == 0  # nothing left to kill
            assert sandbox.running

    run(main())


def test_a_fork_loop_cannot_outrun_the_kill():
    async def main() -> None:
        async with started_sandbox() as sandbox:
            await sandbox.exec("setsid bash -c 'while :; do (sleep 30 &) ; done' >/dev/null 2>&1 </dev/null &")
            assert await sandbox.end_processes() >= 1
            assert await sandbox.end_processes() == 0

    run(main())


@requires_root
def test_lookups_fail_at_once_and_are_recorded_by_phase():
    async def main() -> None:
        async with started_sandbox() as sandbox:
            assert sandbox.dns is not None
            agent = await sandbox.exec("getent hosts deb.debian.org; echo rc=$?")
            assert "rc=2" in agent.stdout  # not found, without waiting for a timeout
            sandbox.dns.phase = "verifier"
            await sandbox.exec("python3 -c \"import socket; socket.getaddrinfo('astral.sh', 443)\" 2>/dev/null")
            assert sandbox.dns.names(phase="agent") == ["deb.debian.org"]
            assert sandbox.dns.names(phase="verifier") == ["astral.sh"]
            hosts = await sandbox.exec("getent hosts localhost")
            assert hosts.return_code == 0  # /etc/hosts still answers

    run(main())


def test_the_check_hook_records_commands_bash_cannot_find():
    async def main() -> None:
        async with started_sandbox() as sandbox:
            env = {"BASH_ENV": f"{HOOKS_IN_SANDBOX}/{CHECK_HOOK}"}
            result = await sandbox.exec("uvx pytest; no-such-tool --x; bash -c 'also-missing'; true", env=env)
            assert "uvx: command not found" in result.stderr
            assert sandbox.missing_commands() == ["uvx", "no-such-tool", "also-missing"]
            sandbox.observed_reset()
            assert sandbox.missing_commands() == []
            # What the sandbox writes there is read without following links it made.
            await sandbox.exec("ln -s /etc/shadow /run/synth/observed/missing-commands")
            assert sandbox.missing_commands() == []

    run(main())


def _q(text: str) -> str:
    return shlex.quote(text)

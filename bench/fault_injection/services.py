"""The private PostgreSQL and Redis the fault bench starts, restarts and removes itself
(the machine's own services are never touched)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from bench.fault_injection.common import free_port, wait_until


def _as_postgres(cmd: list[str]) -> list[str]:
    # initdb and the server refuse to run as root.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class PrivatePostgres:
    """A throwaway PostgreSQL cluster on a free port, in its own directory."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.data = base / "data"
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/synth"

    def _ctl(self, *args: str, check: bool = True) -> None:
        options = (
            f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c max_connections=200 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        cmd = ["pg_ctl", "-D", str(self.data), "-l", str(self.base / "postgres.log"), "-o", options, "-w", *args]
        subprocess.run(_as_postgres(cmd), check=check, stdout=subprocess.DEVNULL)

    def start(self) -> None:
        import psycopg

        self.base.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
        initdb = ["initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"]
        subprocess.run(_as_postgres(initdb), check=True, stdout=subprocess.DEVNULL)
        self._ctl("start")
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE synth")

    def restart(self) -> None:
        self._ctl("restart", "-m", "fast")

    def stop(self) -> None:
        if self.data.exists():
            self._ctl("stop", "-m", "immediate", check=False)


class PrivateRedis:
    """A throwaway Redis on a free port that keeps nothing on disk: a restart loses every message."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        self.base.mkdir(parents=True, exist_ok=True)
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        with open(self.base / "redis.log", "ab") as out:
            self.proc = subprocess.Popen([*cmd, "--dir", str(self.base)], stdout=out, stderr=subprocess.STDOUT)
        client = redis.Redis.from_url(self.url)

        def up() -> bool:
            with contextlib.suppress(redis.ConnectionError):
                return bool(client.ping())
            return False

        wait_until(up, timeout=20, what="the private Redis")

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)

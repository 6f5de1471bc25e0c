"""The platform's processes of a scenario (workers, the model proxy, the gateway) and the
hosts that trials workers run on."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.fault_injection.common import BIN, ROOT, wait_until


@dataclass
class Host:
    """A trials worker host: its node name and its own sandbox root and work directory."""

    name: str
    tmp: Path  # TMPDIR: the sandbox root is TMPDIR/synth-sandboxes
    work: Path

    @property
    def sandbox_root(self) -> Path:
        return self.tmp / "synth-sandboxes"

    def env(self) -> dict[str, str]:
        return {"SYNTH_WORKER_NAME": self.name, "TMPDIR": str(self.tmp), "SYNTH_WORK_DIR": str(self.work)}


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class Cluster:
    """The platform's processes on the private services; every one in its own process group."""

    def __init__(self, *, base: Path, env: dict[str, str]) -> None:
        self.base = base
        self.env = env
        self.procs: list[Proc] = []
        self.spawned = 0
        self.logs = base / "logs"
        self.logs.mkdir(exist_ok=True)
        self.gateway_port = int(env["SYNTH_PUBLIC_URL"].rsplit(":", 1)[1])

    def _spawn(self, name: str, cmd: list[str], extra: dict[str, str] | None = None) -> Proc:
        self.spawned += 1
        path = self.logs / f"{self.spawned:02d}-{name}.log"
        with open(path, "wb") as out:
            popen = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env={**self.env, **(extra or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name=name, popen=popen, log=path)
        self.procs.append(proc)
        return proc

    def worker(self, name: str, *, queues: str, concurrency: int, host: Host | None = None, beat: bool = False) -> Proc:
        cmd = [str(BIN / "celery"), "-A", "synth_project", "worker", "-Q", queues, "-c", str(concurrency)]
        cmd += ["-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"]
        if beat:
            cmd += ["-B", "-s", str(self.base / f"beat-{uuid.uuid4().hex[:6]}")]
        proc = self._spawn(name, cmd, host.env() if host else None)
        wait_until(lambda: " ready." in proc.text() or proc.popen.poll() is not None, timeout=120, what=name)
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{name} exited at start:\n{proc.text()[-3000:]}")
        return proc

    def proxy(self) -> Proc:
        from apps.trials.model_access import proxy_listening

        socket_path = Path(self.env["SYNTH_PROXY_SOCKET"])
        socket_path.unlink(missing_ok=True)
        cmd = [str(BIN / "uvicorn"), "synth_project.asgi:application", "--uds", str(socket_path), "--lifespan", "off"]
        proc = self._spawn("proxy", cmd)
        wait_until(lambda: proxy_listening(path=socket_path), timeout=90, what="the model proxy")
        return proc

    def gateway(self) -> Proc:
        import httpx

        cmd = [str(BIN / "gunicorn"), "synth_project.wsgi", "-c", str(ROOT / "deploy/gunicorn.conf.py")]
        proc = self._spawn("gateway", [*cmd, "-b", f"127.0.0.1:{self.gateway_port}", "-w", "1"])

        def up() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"http://127.0.0.1:{self.gateway_port}/healthz", timeout=2).status_code == 200
            return False

        wait_until(up, timeout=90, what="the gateway")
        return proc

    def kill(self, proc: Proc) -> None:
        """SIGKILL of the whole process group (the worker and its pool; gunicorn and its workers)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait(timeout=30)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill(proc)
            # The whole group: a pool child that outlived its parent must not linger.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGKILL)
        self.procs = []

    def trial_logs(self) -> str:
        return "\n".join(p.text() for p in self.procs if p.name.startswith("trials"))

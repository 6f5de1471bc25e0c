"""The only way out of a sandbox: a bridge from inside its network namespace to the model proxy.

A sandbox has its own network namespace with nothing but ``lo``.  The harness inside needs
``ANTHROPIC_BASE_URL=http://127.0.0.1:<port>``, so a TCP listener must exist on the sandbox's
loopback and forward to the platform's model proxy, which listens on a Unix socket on the host.

Design: the listening socket is *created inside the sandbox's network namespace* by a
short-lived helper thread of the worker that ``setns(2)``-es into it (network namespaces are
per thread, and a socket stays in the namespace it was created in), and is then served by the
worker's asyncio loop.  Each accepted connection is piped to a fresh connection to the proxy's
Unix socket, opened by the worker in the host's namespaces.  Compared with running a forwarder
process inside the sandbox this needs no interpreter or ``socat`` in the sandbox, cannot be
killed or replaced by the task (it is not in the sandbox's PID namespace), dies with the
worker, and needs no permission on the proxy socket for the sandbox's unprivileged uid.

The same forwarder also serves a per-sandbox Unix socket that is bound into the sandbox at
``/run/synth/model.sock`` for harnesses that speak HTTP over a Unix socket.  (Binding the
proxy's own socket would need the sandbox uid to be able to reach and connect to it.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

_BUFFER = 1 << 16


def socket_in_netns(ns_pid: int, make: Callable[[], socket.socket]) -> socket.socket:
    """The socket ``make()`` returns, created inside the network namespace of process ns_pid."""
    result: dict[str, socket.socket | BaseException] = {}

    def worker() -> None:
        try:
            ns_fd = os.open(f"/proc/{ns_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                # Only this (throw-away) thread changes namespace; the rest of the worker stays
                # in the host's namespace.
                os.setns(ns_fd, os.CLONE_NEWNET)
            finally:
                os.close(ns_fd)
            result["sock"] = make()
        except BaseException as exc:  # reported to the caller
            result["error"] = exc

    thread = threading.Thread(target=worker, name=f"sandbox-netns-{ns_pid}", daemon=True)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    sock = result["sock"]
    assert isinstance(sock, socket.socket)
    return sock


def listen_in_netns(ns_pid: int, host: str, port: int, backlog: int = 128) -> socket.socket:
    """A listening TCP socket created inside the network namespace of process ns_pid."""

    def make() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(backlog)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    return socket_in_netns(ns_pid, make)


class ModelBridge:
    """Forward connections from listeners inside a sandbox to the model proxy's Unix socket."""

    def __init__(self, upstream: Path) -> None:
        self.upstream = upstream
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0

    async def serve_tcp_in_netns(self, ns_pid: int, port: int, host: str = "127.0.0.1") -> int:
        sock = listen_in_netns(ns_pid, host, port)
        server = await asyncio.start_server(self._on_client, sock=sock)
        self._servers.append(server)
        return int(sock.getsockname()[1])

    async def serve_unix(self, path: Path, mode: int = 0o666, owner: tuple[int, int] | None = None) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        server = await asyncio.start_unix_server(self._on_client, path=str(path))
        os.chmod(path, mode)
        if owner is not None:
            os.chown(path, owner[0], owner[1])
        self._servers.append(server)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        self.connections += 1
        try:
            try:
                up_reader, up_writer = await asyncio.open_unix_connection(str(self.upstream))
            except OSError as exc:
                logger.warning("model bridge: cannot reach the model proxy at %s: %s", self.upstream, exc)
                return
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                up_writer.close()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)  # type: ignore[arg-type]

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)
        self._servers.clear()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_BUFFER):
            writer.write(data)
            await writer.drain()
        # Half-close so request/response protocols that wait for EOF still work.
        if writer.can_write_eof():
            with contextlib.suppress(OSError):
                writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()

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

A sandbox may be hostile, so the bridge bounds what it can cost its host: at most
``max_connections`` connections (both listeners together) are forwarded at once; a listener
holds the connection it accepted until a slot is free and accepts no other meanwhile, so the
rest wait in the kernel's accept queue (``backlog``; beyond it the kernel refuses them) and
hold no memory or descriptor of the worker's.  The bridge's own warnings (an unreachable proxy, failed accepts) are folded
into counts when they repeat (synth_common.logfold), so a flood of failing connections cannot
fill the worker's log.
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

from synth_common.logfold import RepeatFolder

logger = logging.getLogger(__name__)
logger.addFilter(RepeatFolder())

_BUFFER = 1 << 16
BACKLOG = 128  # connections waiting for a slot, per listener (the kernel refuses more)
DEFAULT_MAX_CONNECTIONS = 64
_ACCEPT_RETRY_SEC = 0.5  # after a failed accept (e.g. the worker is out of descriptors)


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


def listen_in_netns(ns_pid: int, host: str, port: int, backlog: int = BACKLOG) -> socket.socket:
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
    """Forward connections from listeners inside a sandbox to the model proxy's Unix socket,
    at most `max_connections` at once."""

    def __init__(self, upstream: Path, *, max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.upstream = upstream
        self.max_connections = max_connections
        self._slots = asyncio.Semaphore(max_connections)
        self._listeners: list[socket.socket] = []
        self._accepting: set[asyncio.Task[None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0  # forwarded so far
        self.active = 0  # forwarded now

    async def serve_tcp_in_netns(self, ns_pid: int, port: int, host: str = "127.0.0.1") -> int:
        sock = listen_in_netns(ns_pid, host, port)
        self._serve(sock)
        return int(sock.getsockname()[1])

    async def serve_unix(self, path: Path, mode: int = 0o666, owner: tuple[int, int] | None = None) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
            os.chmod(path, mode)
            if owner is not None:
                os.chown(path, owner[0], owner[1])
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._serve(sock)

    def _serve(self, sock: socket.socket) -> None:
        self._listeners.append(sock)
        task = asyncio.get_running_loop().create_task(self._accept_loop(sock))
        self._accepting.add(task)

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:
                if sock.fileno() == -1:
                    return  # closed
                logger.warning("model bridge: accept failed: %s", exc)
                await asyncio.sleep(_ACCEPT_RETRY_SEC)
                continue
            try:
                # The next accept waits for a free slot: the excess waits in the kernel.
                await self._slots.acquire()
            except BaseException:
                conn.close()
                raise
            task = loop.create_task(self._forward(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _forward(self, conn: socket.socket) -> None:
        self.connections += 1
        self.active += 1
        try:
            reader, writer = await asyncio.open_connection(sock=conn)
        except BaseException:
            conn.close()
            self.active -= 1
            self._slots.release()
            raise
        try:
            try:
                up_reader, up_writer = await asyncio.open_unix_connection(str(self.upstream))
            except OSError as exc:
                logger.warning("model bridge: cannot reach the model proxy at %s: %s", self.upstream, exc)
                return
            requests = asyncio.ensure_future(_pipe(reader, up_writer))
            try:
                # Done when the proxy is: then the connection is over (and its slot free), even
                # if the sandbox keeps its end open.
                await _pipe(up_reader, writer)
            finally:
                requests.cancel()
                up_writer.close()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self.active -= 1
            self._slots.release()

    async def close(self) -> None:
        for task in [*self._accepting, *self._tasks]:
            task.cancel()
        for sock in self._listeners:
            sock.close()
        tasks = [*self._accepting, *self._tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=2)
        self._listeners.clear()
        self._accepting.clear()


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

"""A DNS stub inside a sandbox: every lookup fails at once, and the names asked are recorded.

A sandbox has no network. A program that tries to reach one (``apt-get update``, ``curl
https://...``, ``pip install``, ``uvx``) first resolves a name; without a server it would wait
for timeouts and then fail with a message that looks like any other failure. The sandbox's
``/etc/resolv.conf`` names ``127.0.0.1`` instead, where this stub, listening inside the sandbox's
network namespace (created there by a worker thread, like the model bridge: see bridge.py),
answers every query ``REFUSED`` immediately and keeps the name. That turns "the verifier needed
the network" from a silent reward of 0 into a fact the trial can report (synth_sandbox.boundary).

Only UDP is served: resolvers fall back to TCP only for truncated answers, and a refusal is
never truncated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass, field

from synth_sandbox.bridge import socket_in_netns

logger = logging.getLogger(__name__)

RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
# More distinct names than this are not worth keeping (a loop asking for random names).
MAX_NAMES = 200
_RCODE_REFUSED = 5


def parse_query(data: bytes) -> tuple[str, bytes] | None:
    """(the first question's name, the whole question section) of a DNS query, or None."""
    if len(data) < 12 or data[2] & 0x80:  # too short, or a response
        return None
    if int.from_bytes(data[4:6], "big") < 1:
        return None
    labels: list[str] = []
    i = 12
    while True:
        if i >= len(data):
            return None
        length = data[i]
        if length == 0:
            i += 1
            break
        if length & 0xC0 or i + 1 + length > len(data):  # compression has no place in a question
            return None
        labels.append(data[i + 1 : i + 1 + length].decode("ascii", "replace"))
        i += 1 + length
    if i + 4 > len(data):
        return None
    return ".".join(labels).lower() or ".", data[12 : i + 4]


def refusal(data: bytes, question: bytes) -> bytes:
    """The REFUSED answer to a query (same id, opcode and RD bit; the question echoed)."""
    flags = 0x8000 | (data[2] & 0x79) << 8 | _RCODE_REFUSED  # QR, opcode, RD; RCODE
    header = data[0:2] + flags.to_bytes(2, "big") + (1).to_bytes(2, "big") + bytes(6)
    return header + question


@dataclass
class DnsRecorder:
    """Names asked inside one sandbox, labelled with the phase (agent, verifier) asking."""

    phase: str = "agent"
    queries: list[tuple[str, str]] = field(default_factory=list)
    _transport: asyncio.DatagramTransport | None = field(default=None, repr=False)

    def names(self, *, phase: str) -> list[str]:
        return list(dict.fromkeys(name for p, name in self.queries if p == phase))

    def record(self, name: str) -> None:
        entry = (self.phase, name)
        if len(self.queries) < MAX_NAMES and entry not in self.queries:
            self.queries.append(entry)

    async def serve_in_netns(self, ns_pid: int, host: str = "127.0.0.1", port: int = 53) -> None:
        sock = socket_in_netns(ns_pid, lambda: _udp_socket(host, port))
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self), sock=sock)
        self._transport = transport

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None


def _udp_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((host, port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, recorder: DnsRecorder) -> None:
        self.recorder = recorder
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.DatagramTransport)
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        parsed = parse_query(data)
        if parsed is None or self.transport is None:
            return
        name, question = parsed
        self.recorder.record(name)
        with contextlib.suppress(OSError):
            self.transport.sendto(refusal(data, question), addr)

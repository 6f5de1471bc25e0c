"""The model proxy as ``harness_check`` runs it: the production ASGI application
(``synth_project.proxy_asgi``) on a private Unix socket, with the shapes of the requests it
receives written to a JSON-lines file.

    python -m apps.trials.harness_check.proxy_process --uds PATH --record FILE

Per request: method, path, the header names (never their values, which carry the
credential; only the protocol's version and beta headers are kept whole), the body's
top-level keys, the tool names it declares, and its model and stream flag.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[..., Awaitable[None]]

# Header values safe and useful to keep: they name the protocol, not the caller.
KEPT_VALUES = ("anthropic-version", "anthropic-beta")


def request_shape(*, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> dict[str, Any]:
    names = sorted({name.decode("latin-1").lower() for name, _ in headers})
    shape: dict[str, Any] = {"method": method, "path": path, "headers": names}
    shape["header_values"] = {
        name.decode("latin-1").lower(): value.decode("latin-1")
        for name, value in headers
        if name.decode("latin-1").lower() in KEPT_VALUES
    }
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        shape["body_keys"] = sorted(parsed)
        tools = parsed.get("tools")
        if isinstance(tools, list):
            shape["tools"] = [t.get("name") for t in tools if isinstance(t, dict)]
        shape["model"] = parsed.get("model")
        shape["stream"] = bool(parsed.get("stream"))
    return shape


class ShapeRecorder:
    """ASGI middleware: hands every request on unchanged and appends its shape to ``path``."""

    def __init__(self, app: ASGIApp, *, path: str) -> None:
        self.app = app
        self.path = path
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]], send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        done = False

        async def tee() -> Message:
            nonlocal done
            message = await receive()
            if message["type"] == "http.request" and not done:
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    done = True
                    self._write(scope, b"".join(chunks))
            return message

        await self.app(scope, tee, send)

    def _write(self, scope: Scope, body: bytes) -> None:
        shape = request_shape(method=scope["method"], path=scope["path"], headers=scope["headers"], body=body)
        with self._lock, open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(shape) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--uds", required=True, help="Unix socket path")
    parser.add_argument("--record", required=True, help="JSON-lines file of request shapes")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")
    import django

    django.setup()
    import uvicorn

    from synth_project.proxy_asgi import application

    uvicorn.run(ShapeRecorder(application, path=args.record), uds=args.uds, lifespan="off", log_level="warning")


if __name__ == "__main__":
    main()

"""A small OpenAI-compatible /v1/completions server in front of a real LocalTorchSampler.

It speaks the vLLM response shape (token ids as the prompt; ``stop_token_ids``, ``top_k``,
``seed``; ``logprobs.tokens`` as ``"token_id:N"`` with ``return_tokens_as_token_ids``;
``choices[0].token_ids`` with ``return_token_ids``; ``stop_reason`` as the matched stop id),
so OpenAICompatibleSampler is tested against a server that really samples. There is no
tokenizer here, so ``text`` is empty. A raw ASGI app under uvicorn, on a background thread.

Test hooks, chosen by the request's "model": "overloaded" -> 503 with Retry-After,
"slow" -> sleeps before answering, "no-logprobs" -> a 200 without logprobs, "hold" (or a
name in ``hold_models``) -> never answers: it sets ``held`` and then ``disconnected`` when
the client closes the connection (what vLLM watches to abort a generation).

With an ``adapter_loader`` it also serves LoRA adapters loaded at run time, as vLLM does
with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``:

* ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}``: 200 and a text body; 400
  "has already been loaded" for a known name; 404 when the path holds no adapter. The
  adapter is loaded with PEFT onto the same base model (``adapter_loader(path)`` returns a
  LocalTorchSampler), in a thread. ``load_gate``, when set, holds every load until it opens.
* ``POST /v1/unload_lora_adapter {"lora_name"}``: 200, or 404 "cannot be found".
* ``/v1/completions`` with ``model`` = a loaded name samples that adapter; a name neither
  loaded, nor the base model, nor a hook is a 404 "does not exist".

``loads`` and ``unloads`` record the names requested, in order, on arrival. Without an
``adapter_loader`` the two endpoints are 404, as on a server without runtime loading.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from apps.proxy.samplers.base import SampleRequest
from apps.proxy.samplers.local import LocalTorchSampler

HOOKS = ("overloaded", "slow", "no-logprobs", "hold")


def _error(status: int, message: str, kind: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    # vLLM's ErrorResponse shape.
    return status, {"error": {"message": message, "type": kind, "param": None, "code": status}}, {}


class CompletionsApp:
    def __init__(
        self,
        sampler: LocalTorchSampler,
        *,
        model: str = "tiny",
        adapter_loader: Callable[[str], LocalTorchSampler] | None = None,
    ) -> None:
        self.sampler = sampler
        self.model = model
        self.requests: list[dict[str, Any]] = []  # (headers, body) seen, for assertions
        self.held = threading.Event()
        self.disconnected = threading.Event()
        self.hold_models: set[str] = set()
        self.adapter_loader = adapter_loader
        self.adapters: dict[str, LocalTorchSampler] = {}
        self.loads: list[str] = []
        self.unloads: list[str] = []
        self.load_gate: threading.Event | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        paths = ["/v1/completions"]
        if self.adapter_loader is not None:
            paths += ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"]
        if scope["method"] != "POST" or scope["path"] not in paths:
            await self._send(send, 404, {"detail": "Not Found"})  # FastAPI's answer for no route
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        try:
            body = json.loads(raw)
        except ValueError:
            await self._send(send, 400, {"error": {"message": "invalid JSON", "type": "BadRequestError", "code": 400}})
            return
        if scope["path"] == "/v1/load_lora_adapter":
            await self._send_text(send, *(await self._load(body)))
            return
        if scope["path"] == "/v1/unload_lora_adapter":
            await self._send_text(send, *self._unload(body))
            return
        self.requests.append({"headers": headers, "body": body})
        if body.get("model") == "hold" or body.get("model") in self.hold_models:
            self.held.set()
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnected.set()
            return
        status, payload, extra_headers = await self._complete(body)
        await self._send(send, status, payload, extra_headers)

    async def _complete(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        model = body.get("model")
        if model == "overloaded":
            return (
                503,
                {"error": {"message": "server overloaded", "type": "ServiceUnavailable", "code": 503}},
                {"retry-after": "7"},
            )
        if model == "slow":
            await asyncio.sleep(3.0)
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
            return (
                400,
                {
                    "error": {
                        "message": "prompt must be a non-empty list of token ids",
                        "type": "BadRequestError",
                        "code": 400,
                    }
                },
                {},
            )
        top_k = body.get("top_k")
        request = SampleRequest(
            prompt_ids=prompt,
            max_tokens=int(body.get("max_tokens", 16)),
            stop_token_ids=list(body.get("stop_token_ids") or []),
            temperature=float(body.get("temperature", 1.0)),
            top_p=body.get("top_p"),
            top_k=top_k if top_k not in (None, -1, 0) else None,
            seed=body.get("seed"),
        )
        sampler = self.adapters.get(str(model)) if model is not None else None
        if sampler is None:
            if model not in (None, self.model, *HOOKS):
                return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
            sampler = self.sampler
        result = await sampler.sample(request)
        choice: dict[str, Any] = {
            "index": 0,
            "text": "",
            "finish_reason": result.finish,
            "stop_reason": result.token_ids[-1] if result.finish == "stop" else None,
        }
        if model != "no-logprobs" and body.get("logprobs") is not None:
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            names = [f"token_id:{t}" if as_ids else f"<{t}>" for t in result.token_ids]
            choice["logprobs"] = {
                "text_offset": [0] * len(names),
                "token_logprobs": result.logprobs,
                "tokens": names,
                "top_logprobs": [{n: lp} for n, lp in zip(names, result.logprobs, strict=True)],
            }
        else:
            choice["logprobs"] = None
        if body.get("return_token_ids"):
            choice["token_ids"] = result.token_ids
            choice["prompt_token_ids"] = prompt
        payload = {
            "id": f"cmpl-{len(self.requests)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model if model is None else model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(result.token_ids),
                "total_tokens": len(prompt) + len(result.token_ids),
            },
        }
        return 200, payload, {}

    async def _load(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | str]:
        name, path = body.get("lora_name"), body.get("lora_path")
        self.loads.append(str(name))
        if not name or not path:
            return _error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")[:2]
        if name in self.adapters:
            return _error(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")[:2]
        if self.load_gate is not None:
            await asyncio.to_thread(self.load_gate.wait)
        if not (Path(path) / "adapter_config.json").is_file():
            message = f"Loading lora {name} failed: No adapter found for {path}"
            return _error(404, message, "NotFoundError")[:2]
        assert self.adapter_loader is not None
        self.adapters[name] = await asyncio.to_thread(self.adapter_loader, path)
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def _unload(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | str]:
        name = body.get("lora_name")
        self.unloads.append(str(name))
        if self.adapters.pop(str(name), None) is None:
            return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")[:2]
        return 200, f"Success: LoRA adapter '{name}' removed successfully."

    @classmethod
    async def _send_text(cls, send: Any, status: int, payload: dict[str, Any] | str) -> None:
        if isinstance(payload, dict):
            await cls._send(send, status, payload)
            return
        data = payload.encode()
        raw_headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": data})

    @staticmethod
    async def _send(send: Any, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        raw_headers += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": data})


class ServerThread:
    """uvicorn on 127.0.0.1 (a free port) in a daemon thread with its own event loop."""

    def __init__(self, app: CompletionsApp) -> None:
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("test completions server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

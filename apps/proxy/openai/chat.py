"""OpenAI Chat Completions on the shared model call: the answer as `chat.completion` or a
stream of `chat.completion.chunk` events.

    JSON:   {id "chatcmpl-...", object, created, model (as requested), choices: [{index 0,
            message {role, content (null with only tool calls), reasoning_content,
            tool_calls [{id, type function, function {name, arguments (JSON text)}}]},
            finish_reason stop|length|tool_calls, logprobs null}], usage}
    stream: a role delta at once; `: keepalive` comment lines while sampling; then
            reasoning_content deltas, content deltas, tool_calls deltas (index, id, type and
            function.name first, then argument chunks); a finish_reason chunk; a usage
            chunk (choices []) with stream_options.include_usage; `data: [DONE]`.
            An error after the 200 is `data: {"error": {...}}` (the SDKs raise it).

Usage counts are the model's own tokens: the rendered prompt's ids and the sampled ids the
answer stands for.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

from django.http import HttpResponse

from apps.proxy import calls
from apps.proxy.errors import ProxyError
from apps.proxy.openai import errors
from apps.proxy.openai.chat_request import chat_request_parse
from apps.proxy.protocol import Protocol, StreamWriter
from apps.proxy.streaming import CHUNK_CHARS

FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def arguments_text(arguments: Any) -> str:
    # Python's default separators, as OpenAI's own arguments and most clients' json.dumps.
    return json.dumps(arguments, ensure_ascii=False)


def finish_reason(stop_reason: str) -> str:
    return FINISH_REASONS.get(stop_reason, "stop")


def usage(*, prepared: calls.Prepared, completion: calls.Completion | None) -> dict[str, int]:
    prompt = len(prepared.fitted.rendered.token_ids)
    output = completion.delivered_ids if completion else 0
    return {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}


def _chunks(text: str) -> Iterator[str]:
    for i in range(0, len(text), CHUNK_CHARS):
        yield text[i : i + CHUNK_CHARS]


def message(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message of a completion's blocks."""
    text = "".join(b["text"] for b in blocks if b["type"] == "text")
    reasoning = "\n".join(b["thinking"] for b in blocks if b["type"] == "thinking")
    tool_calls = [
        {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": arguments_text(b["input"])}}
        for b in blocks
        if b["type"] == "tool_use"
    ]
    out: dict[str, Any] = {
        "role": "assistant",
        "content": None if tool_calls and not text else text,
        "refusal": None,
        "reasoning_content": reasoning or None,
    }
    if tool_calls:
        out["tool_calls"] = tool_calls
    return out


class _ChatStream(StreamWriter):
    def __init__(self, *, response_id: str, prepared: calls.Prepared) -> None:
        self.prepared = prepared
        self.include_usage = bool(prepared.request.get("include_usage"))
        self.head = {
            "id": response_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": prepared.ctx.model_requested,
            "system_fingerprint": None,
        }

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {**self.head, "choices": choices, **extra}
        if self.include_usage and "usage" not in extra:
            body["usage"] = None  # OpenAI's chunks carry usage null until the usage chunk
        return f"data: {_dumps(body)}\n\n".encode()

    def _delta(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return self._event([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}])

    def start(self) -> Iterator[bytes]:
        yield self._delta({"role": "assistant", "content": ""})

    def keepalive(self) -> bytes:
        return b": keepalive\n\n"

    def _end(self, *, stop_reason: str, completion: calls.Completion | None) -> Iterator[bytes]:
        yield self._delta({}, finish_reason(stop_reason))
        if self.include_usage:
            yield self._event([], usage=usage(prepared=self.prepared, completion=completion))
        yield b"data: [DONE]\n\n"

    def completion(self, completion: calls.Completion) -> Iterator[bytes]:
        index = 0
        for block in completion.blocks:
            kind = block["type"]
            if kind == "thinking":
                for part in _chunks(block["thinking"]):
                    yield self._delta({"reasoning_content": part})
            elif kind == "text":
                for part in _chunks(block["text"]):
                    yield self._delta({"content": part})
            elif kind == "tool_use":
                call = {"index": index, "id": block["id"], "type": "function"}
                yield self._delta({"tool_calls": [{**call, "function": {"name": block["name"], "arguments": ""}}]})
                for part in _chunks(arguments_text(block["input"])):
                    yield self._delta({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
                index += 1
        yield from self._end(stop_reason=completion.stop_reason, completion=completion)

    def empty(self) -> Iterator[bytes]:
        yield from self._end(stop_reason="max_tokens", completion=None)

    def error(self, exc: ProxyError) -> Iterator[bytes]:
        yield f"data: {_dumps({'error': errors.error_object(exc)})}\n\n".encode()
        yield b"data: [DONE]\n\n"


class ChatProtocol(Protocol):
    """OpenAI Chat Completions: POST /v1/chat/completions."""

    name = "chat"
    request_id_headers = ("x-request-id",)  # what the openai SDKs read

    def parse(self, body: Any) -> dict[str, Any]:
        return chat_request_parse(body)

    def response_id(self) -> str:
        return f"chatcmpl-{secrets.token_hex(12)}"

    def body(
        self, *, response_id: str, prepared: calls.Prepared, completion: calls.Completion | None
    ) -> dict[str, Any]:
        blocks = completion.blocks if completion else []
        return {
            "id": response_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": prepared.ctx.model_requested,
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "message": message(blocks),
                    "finish_reason": finish_reason(completion.stop_reason if completion else "max_tokens"),
                    "logprobs": None,
                }
            ],
            "usage": usage(prepared=prepared, completion=completion),
        }

    def stream(self, *, response_id: str, prepared: calls.Prepared) -> StreamWriter:
        return _ChatStream(response_id=response_id, prepared=prepared)

    def error_response(self, exc: ProxyError, *, request_id: str) -> HttpResponse:
        return errors.error_response(exc, request_id=request_id)


CHAT = ChatProtocol()

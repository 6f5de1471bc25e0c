"""Anthropic Messages server-sent events, built from a parsed completion.

The proxy samples the whole completion first, then streams the parsed blocks in
chunked deltas: adapters parse tool calls and reasoning from complete token sequences,
and the captured record must be staged before message_stop anyway. What keeps Claude
Code's idle timeout (300 s) from firing during a long sample is `ping` events, sent
while the sampler works (see views). The sequence is the standard one:

    message_start
    (ping)*
    for each block: content_block_start, content_block_delta+, content_block_stop
        text      -> text_delta chunks
        thinking  -> thinking_delta chunks, then one signature_delta
        tool_use  -> start with input {}, then input_json_delta chunks of the JSON text
    message_delta {stop_reason, stop_sequence, usage (cumulative)}
    message_stop

An error after the 200 is an ``event: error`` with Anthropic's error body.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

# Characters per delta. Small enough to look like streaming to a UI, large enough that a
# 30 KB file write is not thousands of events.
CHUNK_CHARS = 256


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


def ping() -> bytes:
    return sse("ping", {"type": "ping"})


def _chunks(text: str) -> Iterator[str]:
    if not text:
        return
    for i in range(0, len(text), CHUNK_CHARS):
        yield text[i : i + CHUNK_CHARS]


def message_start(*, message_id: str, model: str, usage: dict[str, Any]) -> bytes:
    return sse(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage,
            },
        },
    )


def block_events(*, index: int, block: dict[str, Any]) -> Iterator[bytes]:
    btype = block["type"]
    if btype == "text":
        yield sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
        )
        for part in _chunks(block["text"]):
            yield sse(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": part}},
            )
    elif btype == "thinking":
        yield sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            },
        )
        for part in _chunks(block["thinking"]):
            yield sse(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": part}},
            )
        yield sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "signature_delta", "signature": block.get("signature", "")},
            },
        )
    elif btype == "tool_use":
        yield sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}},
            },
        )
        for part in _chunks(json.dumps(block.get("input", {}), ensure_ascii=False, separators=(",", ":"))):
            yield sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": part},
                },
            )
    else:  # a block type this proxy does not stream piecewise: whole, in its start event
        yield sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})
    yield sse("content_block_stop", {"type": "content_block_stop", "index": index})


def message_end(*, stop_reason: str, stop_sequence: str | None, usage: dict[str, Any]) -> Iterator[bytes]:
    yield sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": usage,
        },
    )
    yield sse("message_stop", {"type": "message_stop"})


def error_event(*, error_type: str, message: str) -> bytes:
    return sse("error", {"type": "error", "error": {"type": error_type, "message": message}})

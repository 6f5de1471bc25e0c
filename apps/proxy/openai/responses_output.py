"""A parsed completion -> the Responses answer: output items, usage, the response object.

The adapters parse sampled ids into Messages blocks; here each block becomes one output item,
in the order it was sampled:

    thinking  -> reasoning {id, summary [], content [reasoning_text], encrypted_content?}
    text      -> message {role assistant, content [output_text]}
    tool_use  -> function_call {call_id, name, arguments (JSON text)}, or custom_tool_call
                 {call_id, name, input (the raw text)} when it calls a custom tool with its
                 one string argument

`call_id` is the adapter's tool_use id unchanged: some families write the id into the prompt
(Kimi's "functions.NAME:N"), and responses.py turns these items back into exactly the blocks
they came from, so the next prompt holds what was sampled. Pure: no Django.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from apps.proxy.openai.responses import CUSTOM_INPUT, ResponsesRequest, reasoning_seal


def _item_id(prefix: str, response_id: str, index: int) -> str:
    return f"{prefix}_" + hashlib.sha256(f"{response_id}:{index}".encode()).hexdigest()[:32]


def output_items(
    *, blocks: list[dict[str, Any]], request: ResponsesRequest, response_id: str, incomplete: bool, key: bytes
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "thinking":
            text = block.get("thinking", "")
            item: dict[str, Any] = {
                "id": _item_id("rs", response_id, index),
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": text}],
            }
            if request.include_encrypted:
                item["encrypted_content"] = reasoning_seal(text=text, key=key)
        elif kind == "text":
            item = {
                "id": _item_id("msg", response_id, index),
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": block.get("text", ""), "annotations": [], "logprobs": []}],
            }
        elif kind == "tool_use":
            arguments = block.get("input") or {}
            raw = arguments.get(CUSTOM_INPUT) if isinstance(arguments, dict) else None
            if block.get("name") in request.custom_tools and list(arguments) == [CUSTOM_INPUT] and isinstance(raw, str):
                item = {
                    "id": _item_id("ctc", response_id, index),
                    "type": "custom_tool_call",
                    "status": "completed",
                    "call_id": block["id"],
                    "name": block["name"],
                    "input": raw,
                }
            else:
                # A custom tool called with other arguments stays a function call: its
                # arguments then come back unchanged and the next prompt stays exact.
                item = {
                    "id": _item_id("fc", response_id, index),
                    "type": "function_call",
                    "status": "completed",
                    "call_id": block["id"],
                    "name": block["name"],
                    "arguments": json.dumps(arguments, ensure_ascii=False),
                }
                if block["name"] in request.namespaced:
                    item["namespace"], item["name"] = request.namespaced[block["name"]]
        else:
            continue  # no other block type comes out of the adapters
        items.append(item)
    if incomplete and items and "status" in items[-1]:
        items[-1]["status"] = "incomplete"
    return items


def reasoning_tokens(*, blocks: list[dict[str, Any]], encode: Callable[[str], list[int]]) -> int:
    """Ids of the sampled reasoning (its text re-encoded: the markers around it excluded)."""
    return sum(len(encode(b.get("thinking", ""))) for b in blocks if b.get("type") == "thinking")


def usage(*, input_tokens: int, output_tokens: int, reasoning: int) -> dict[str, Any]:
    # Prefix reuse is a tokenization saving, not a provider KV cache: no cached tokens.
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input_tokens + output_tokens,
    }


def response_object(
    *,
    response_id: str,
    created_at: int,
    model: str,
    request: ResponsesRequest,
    max_output_tokens: int,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The response object, at any stage (in_progress with no output, completed, ...)."""
    echo = request.echo
    reasoning = echo.get("reasoning") or {}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": echo.get("instructions"),
        "max_output_tokens": max_output_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": echo.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "store": echo.get("store", False),
        "temperature": 1.0 if echo.get("temperature") is None else echo["temperature"],
        "text": echo.get("text") or {"format": {"type": "text"}},
        "tool_choice": echo.get("tool_choice", "auto"),
        "tools": echo.get("tools", []),
        "top_p": 1.0 if echo.get("top_p") is None else echo["top_p"],
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": echo.get("metadata", {}),
    }

"""Validation and normalization of Anthropic Messages requests (what Claude Code sends).

Hand-written rather than a model class so that every message names the path of the bad
value (``messages.3.content.0.tool_use_id: ...``) and so that unknown fields and block
types pass through: Claude Code adds beta fields faster than any schema follows, and a
compatible server must accept them. Anything malformed is an ``InvalidRequest`` (400),
never an exception that would become a 500.

How each field is handled (act = changes what is sampled or returned; record = kept in
the captured interaction; ignore = accepted and dropped on purpose):

| field / header                         | handling |
|----------------------------------------|----------|
| model                                  | act: resolved to a model route (exact name, then alias, then glob alias); a scoped credential serves its own route whatever the name, except another route's exact name (403) |
| max_tokens                             | act: required, >= 0; clamped to the route's max_output (Claude Code sends 32000 for unknown models); 0 returns an empty turn without sampling (cache pre-warm) |
| messages                               | act: rendered by the family adapter; string content becomes one text block; consecutive same-role turns are merged (Anthropic does the same); a final assistant turn is a prefill the adapter continues |
| messages[].role == "system"            | act: mid-conversation system messages (beta) are kept in place for the adapter to render |
| system (str or text blocks)            | act: normalized to a list of text blocks and rendered as the system prompt |
| tools                                  | act: rendered by the adapter in the family's native tool format; beta fields strict, defer_loading, eager_input_streaming, cache_control are ignored |
| tool_choice                            | record + passed to the adapter; auto/any/tool/none are not enforced by constrained decoding; disable_parallel_tool_use is ignored |
| thinking                               | act: enabled/adaptive turn the template's thinking mode on, disabled off; budget_tokens is not enforced (max_tokens bounds the turn) |
| stop_sequences                         | act: the sampled text is cut at the first match, stop_reason "stop_sequence" (applied after sampling; the captured ids record the cut) |
| temperature, top_p, top_k              | act: passed to the sampler (temperature 0..1 as in Anthropic's contract) |
| stream                                 | act: SSE stream or one JSON message |
| metadata (user_id)                     | record; otherwise ignored |
| output_config (effort, format, ...)    | ignore: effort and structured-output formats are not enforced on open models |
| context_management (edits)             | ignore: edits such as clear_thinking are not applied; the family template decides which past reasoning it renders |
| cache_control (top level and blocks)   | ignore: prefix reuse is automatic (exact-token prefix cache); usage reports no cache tokens |
| service_tier, container, inference_geo, mcp_servers | ignore |
| content: text                          | act (citations, cache_control ignored) |
| content: image, document, search_result| passed to the adapter (text-only families render a placeholder) |
| content: thinking, redacted_thinking   | passed to the adapter; signatures are not verified (ours are opaque) |
| content: tool_use, tool_result         | act; tool_result.content may be a string or blocks; is_error is accepted, the text rendered as sent |
| other content block types              | passed to the adapter as they are (server tool blocks, container_upload, ...) |
| header anthropic-version               | ignore (accepted without checking) |
| header anthropic-beta                  | record; not acted on (unknown betas never cause an error) |
| query ?beta=true                       | ignore |
| x-claude-code-session-id, -agent-id, -parent-agent-id | record; they also scope the prefix cache |
| x-synth-trial (ANTHROPIC_CUSTOM_HEADERS) | record as the correlation id (the credential, not the header, is the authority) |
"""

from __future__ import annotations

import math
from typing import Any

from apps.proxy.errors import InvalidRequest

MAX_MESSAGES = 100_000
MAX_STOP_SEQUENCES = 64
ROLES = ("user", "assistant", "system")
THINKING_TYPES = ("enabled", "disabled", "adaptive")
TOOL_CHOICE_TYPES = ("auto", "any", "tool", "none")


def _fail(path: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{path}: {message}" if path else message, param=path or None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _block(value: Any, path: str) -> dict[str, Any]:
    """One content block: a dict with a string ``type``; the known types are checked."""
    if not isinstance(value, dict):
        raise _fail(path, "Input should be an object")
    btype = value.get("type")
    if not isinstance(btype, str) or not btype:
        raise _fail(f"{path}.type", "Field required (a string)")
    block = {k: v for k, v in value.items() if k != "cache_control"}
    if btype == "text":
        if not isinstance(value.get("text"), str):
            raise _fail(f"{path}.text", "Input should be a valid string")
    elif btype == "tool_use":
        if not isinstance(value.get("id"), str) or not isinstance(value.get("name"), str):
            raise _fail(path, "tool_use needs string id and name")
        if not isinstance(value.get("input", {}), dict):
            raise _fail(f"{path}.input", "Input should be an object")
        block.setdefault("input", {})
    elif btype == "tool_result":
        if not isinstance(value.get("tool_use_id"), str):
            raise _fail(f"{path}.tool_use_id", "Input should be a valid string")
        content = value.get("content", "")
        if content is None:
            content = ""
        if isinstance(content, list):
            block["content"] = [_block(b, f"{path}.content.{i}") for i, b in enumerate(content)]
        elif isinstance(content, str):
            block["content"] = content
        else:
            raise _fail(f"{path}.content", "Input should be a string or a list of blocks")
        if "is_error" in value and value["is_error"] is not None and not isinstance(value["is_error"], bool):
            raise _fail(f"{path}.is_error", "Input should be a boolean")
    elif btype == "thinking":
        if not isinstance(value.get("thinking"), str):
            raise _fail(f"{path}.thinking", "Input should be a valid string")
        if "signature" in value and not isinstance(value["signature"], (str, type(None))):
            raise _fail(f"{path}.signature", "Input should be a valid string")
    elif btype == "redacted_thinking":
        if not isinstance(value.get("data", ""), str):
            raise _fail(f"{path}.data", "Input should be a valid string")
    elif btype == "image":
        if not isinstance(value.get("source"), dict):
            raise _fail(f"{path}.source", "Input should be an object")
    return block


def _content(value: Any, path: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if not isinstance(value, list):
        raise _fail(path, "Input should be a string or a list of content blocks")
    return [_block(b, f"{path}.{i}") for i, b in enumerate(value)]


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise _fail("messages", "Input should be a valid list")
    if len(value) > MAX_MESSAGES:
        raise _fail("messages", f"at most {MAX_MESSAGES} messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(value):
        path = f"messages.{i}"
        if not isinstance(message, dict):
            raise _fail(path, "Input should be an object")
        role = message.get("role")
        if role not in ROLES:
            raise _fail(f"{path}.role", f"Input should be one of {', '.join(repr(r) for r in ROLES)}")
        if "content" not in message:
            raise _fail(f"{path}.content", "Field required")
        content = _content(message["content"], f"{path}.content")
        # Consecutive turns of the same role are one turn (Anthropic merges them too);
        # mid-conversation system messages are never merged into a neighbour.
        if out and out[-1]["role"] == role and role != "system":
            out[-1]["content"].extend(content)
        else:
            out.append({"role": role, "content": content})
    if not any(m["role"] != "system" for m in out):
        raise _fail("messages", "at least one user or assistant message is required")
    return out


def _system(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "text", "text": value}] if value else []
    if not isinstance(value, list):
        raise _fail("system", "Input should be a string or a list of text blocks")
    blocks = []
    for i, b in enumerate(value):
        block = _block(b, f"system.{i}")
        if block["type"] != "text":
            raise _fail(f"system.{i}.type", "system blocks must be text")
        blocks.append({"type": "text", "text": block["text"]})
    return blocks


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail("tools", "Input should be a valid list")
    tools = []
    names: set[str] = set()
    for i, tool in enumerate(value):
        path = f"tools.{i}"
        if not isinstance(tool, dict):
            raise _fail(path, "Input should be an object")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise _fail(f"{path}.name", "Field required (a non-empty string)")
        if name in names:
            raise _fail(f"{path}.name", f"tool names must be unique ({name!r} repeats)")
        names.add(name)
        schema = tool.get("input_schema")
        # Server tools (web_search_*, bash_*, ...) carry a type and no input_schema.
        if schema is not None and not isinstance(schema, dict):
            raise _fail(f"{path}.input_schema", "Input should be an object")
        if schema is None and tool.get("type") in (None, "custom"):
            raise _fail(f"{path}.input_schema", "Field required")
        if "description" in tool and not isinstance(tool["description"], (str, type(None))):
            raise _fail(f"{path}.description", "Input should be a valid string")
        tools.append(
            {k: v for k, v in tool.items() if k not in ("cache_control", "defer_loading", "eager_input_streaming")}
        )
    return tools


def _tool_choice(value: Any, tool_names: set[str]) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in TOOL_CHOICE_TYPES:
        raise _fail("tool_choice.type", f"Input should be one of {', '.join(TOOL_CHOICE_TYPES)}")
    if value["type"] == "tool":
        name = value.get("name")
        if not isinstance(name, str):
            raise _fail("tool_choice.name", "Field required")
        if name not in tool_names:
            raise _fail("tool_choice.name", f"no tool named {name!r} in tools")
    return dict(value)


def _thinking(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in THINKING_TYPES:
        raise _fail("thinking.type", f"Input should be one of {', '.join(THINKING_TYPES)}")
    if value["type"] == "enabled":
        budget = value.get("budget_tokens")
        if not _is_int(budget) or budget < 1024:
            raise _fail("thinking.budget_tokens", "Input should be an integer >= 1024")
    return dict(value)


def _optional_number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_number(value) or not (low <= value <= high):
        raise _fail(name, f"Input should be a number between {low:g} and {high:g}")
    return float(value)


def _common(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _fail("", "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise _fail("model", "Field required (a non-empty string)")
    if len(model) > 300:
        raise _fail("model", "at most 300 characters")
    if "messages" not in body:
        raise _fail("messages", "Field required")
    tools = _tools(body.get("tools"))
    return {
        "model": model,
        "system": _system(body.get("system")),
        "messages": _messages(body["messages"]),
        "tools": tools,
        "tool_choice": _tool_choice(body.get("tool_choice"), {t["name"] for t in tools}),
        "thinking": _thinking(body.get("thinking")),
    }


def messages_request_parse(body: Any) -> dict[str, Any]:
    """A validated, normalized POST /v1/messages body (see the table above)."""
    request = _common(body)
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise _fail("max_tokens", "Field required")
    if not _is_int(max_tokens) or max_tokens < 0:
        raise _fail("max_tokens", "Input should be a non-negative integer")
    stop = body.get("stop_sequences")
    if stop is None:
        stop = []
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise _fail("stop_sequences", "Input should be a list of non-empty strings")
    if len(stop) > MAX_STOP_SEQUENCES:
        raise _fail("stop_sequences", f"at most {MAX_STOP_SEQUENCES} stop sequences")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _fail("stream", "Input should be a valid boolean")
    top_k = body.get("top_k")
    if top_k is not None and (not _is_int(top_k) or top_k < 0):
        raise _fail("top_k", "Input should be a non-negative integer")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise _fail("metadata", "Input should be an object")
    request.update(
        {
            "max_tokens": max_tokens,
            "stop_sequences": list(stop),
            "stream": stream,
            "temperature": _optional_number(body, "temperature", 0.0, 1.0),
            "top_p": _optional_number(body, "top_p", 0.0, 1.0),
            "top_k": top_k or None,
            "metadata": metadata or {},
        }
    )
    return request


def count_tokens_request_parse(body: Any) -> dict[str, Any]:
    """A validated, normalized POST /v1/messages/count_tokens body."""
    return _common(body)

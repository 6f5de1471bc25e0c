"""Anthropic Messages request -> the chat-template messages every family renders.

All adapters share this mapping, so the families agree on how system blocks, user text
blocks, images, tool results and thinking blocks become template input:

- `system` (string or text blocks, joined with "\\n"; cache_control ignored) -> the first
  system message. A `role: "system"` message inside `messages` (Claude Code's
  mid-conversation system) stays where it is; each template decides where it renders.
- user text blocks (joined with "\\n", like vLLM's OpenAI content parts) -> a user message;
  images and other non-text blocks -> a short text note, e.g. "[image: image/png, 5120 bytes
  omitted]"; each tool_result -> a `tool` message holding exactly the text the harness sent,
  is_error or not (the official templates have no error flag and add no marker).
- assistant thinking blocks -> reasoning_content; text -> content; tool_use ->
  tool_calls (arguments as the input object; each template serializes them); redacted_thinking
  is dropped (its data is opaque).
- tools {name, description, input_schema} -> {"type": "function", "function": {name,
  description, parameters}}; tools without input_schema (Anthropic server tools) are skipped.
- thinking {"type": "disabled"} -> thinking off; enabled/adaptive -> on; absent -> the
  adapter's default (`thinking_enabled`).

The messages are HF-style dicts, as transformers passes them to a chat template.
"""

from __future__ import annotations

from typing import Any


def _image_note(block: dict[str, Any]) -> str:
    source = block.get("source") or {}
    kind = block.get("type", "image")
    if source.get("type") == "base64":
        data = source.get("data") or ""
        size = len(data) * 3 // 4 - data[-2:].count("=")  # decoded size, without decoding it
        return f"[{kind}: {source.get('media_type', 'unknown')}, {size} bytes omitted]"
    if source.get("type") == "url":
        return f"[{kind}: {source.get('url', '')}]"
    return f"[{kind} omitted]"


def _block_text(block: dict[str, Any] | str) -> str | None:
    """Text for a user-side content block (None for blocks that render nothing)."""
    if isinstance(block, str):
        return block
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "image":
        return _image_note(block)
    if kind == "document":
        source = block.get("source") or {}
        if source.get("type") == "text":
            return str(source.get("data", ""))
        return _image_note(block)
    if kind in ("thinking", "redacted_thinking"):
        return None
    return f"[{kind} block omitted]"


def _system_text(system: Any) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    return "\n".join(t for b in system if (t := _block_text(b)) is not None)


def _tool_result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    # is_error changes nothing: every official template renders an error result like any
    # other, and harnesses already say so in the text (Claude Code's "<tool_use_error>...").
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(t for b in content if (t := _block_text(b)) is not None)


def _tool_spec(tool: dict[str, Any]) -> dict[str, Any] | None:
    if "input_schema" not in tool:
        return None  # an Anthropic server tool (web_search_..., bash_...): not a function the model can call
    function: dict[str, Any] = {"name": tool["name"]}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    function["parameters"] = tool["input_schema"]
    return {"type": "function", "function": function}


def to_chat_messages(request: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Anthropic request -> (HF-style messages, function tools) for the chat templates.

    Consecutive assistant content is merged into one message (a Responses turn's reasoning,
    text and call items are one assistant message); each user message's text becomes one user
    message; tool_result blocks become `tool` messages in order.
    """
    messages: list[dict[str, Any]] = []
    system = _system_text(request.get("system"))
    if system:
        messages.append({"role": "system", "content": system})

    user_parts: list[str] = []

    def flush_user() -> None:
        if user_parts:
            messages.append({"role": "user", "content": "\n".join(user_parts)})
            user_parts.clear()

    for message in request.get("messages") or []:
        role = message.get("role")
        content = message.get("content")
        blocks: list[Any] = [content] if isinstance(content, str) else list(content or [])
        if role == "assistant":
            flush_user()
            if messages and messages[-1]["role"] == "assistant":
                current = messages[-1]
            else:
                current = {"role": "assistant", "content": "", "reasoning_content": "", "tool_calls": []}
                messages.append(current)
            for block in blocks:
                if isinstance(block, str):
                    current["content"] += block
                    continue
                kind = block.get("type")
                if kind == "text":
                    current["content"] += str(block.get("text", ""))
                elif kind == "thinking":
                    sep = "\n" if current["reasoning_content"] else ""
                    current["reasoning_content"] += sep + str(block.get("thinking", ""))
                elif kind == "tool_use":
                    current["tool_calls"].append(
                        {
                            "type": "function",
                            "id": block.get("id"),
                            "function": {"name": block.get("name", ""), "arguments": block.get("input", {})},
                        }
                    )
                # redacted_thinking and other assistant blocks render nothing.
        elif role == "system":
            flush_user()
            messages.append({"role": "system", "content": _system_text(content)})
        else:
            # Each user message is a turn of its own. Messages requests never have two in a
            # row (schema.py merges them, as Anthropic does); a Responses or Chat request's
            # consecutive user messages stay apart, as OpenAI's chat messages are rendered.
            flush_user()
            for block in blocks:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    flush_user()
                    messages.append(
                        {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": _tool_result_text(block)}
                    )
                elif (text := _block_text(block)) is not None:
                    user_parts.append(text)
    flush_user()
    for m in messages:
        if m["role"] == "assistant" and not m["tool_calls"]:
            del m["tool_calls"]  # the template tests `message.tool_calls`; keep messages minimal
    specs = [s for t in request.get("tools") or [] if (s := _tool_spec(t)) is not None]
    return messages, (specs or None)


def thinking_enabled(request: dict[str, Any], default: bool) -> bool:
    thinking = request.get("thinking")
    if not isinstance(thinking, dict) or "type" not in thinking:
        return default
    return thinking["type"] != "disabled"

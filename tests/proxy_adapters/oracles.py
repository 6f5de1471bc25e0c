"""Reference renderers the adapters are compared against (test-only).

- `jinja_text`: the vendored official template rendered in transformers' Jinja environment
  (apps.proxy.chat_templates.render_template; checked against transformers itself when
  transformers is installed).
- `tml_qwen3_ids`: tml-renderers' native Qwen3 renderer (Thinking Machines; Rust), an
  independent implementation. It needs torch at import, so callers importorskip it.
"""

from __future__ import annotations

import json
from typing import Any

from apps.proxy.chat_templates import load_template, render_template


def jinja_text(
    template_name: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> str:
    return render_template(
        load_template(template_name), messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs
    )


def tml_qwen3_ids(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *, enable_thinking: bool = True
) -> list[int]:
    from tml_renderers import chat, renderers

    oss: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant":
            parts: list[dict[str, Any]] = []
            if m.get("reasoning_content"):
                parts.append({"type": "thinking", "thinking": m["reasoning_content"]})
            if m["content"]:
                parts.append({"type": "text", "text": m["content"]})
            entry: dict[str, Any] = {"role": "assistant", "content": parts or ""}
            if m.get("tool_calls"):
                entry["tool_calls"] = [
                    {
                        "type": "function",
                        "id": c["id"],
                        "function": {
                            "name": c["function"]["name"],
                            "arguments": json.dumps(c["function"]["arguments"]),
                        },
                    }
                    for c in m["tool_calls"]
                ]
            oss.append(entry)
        elif m["role"] == "tool":
            oss.append({"role": "tool", "content": m["content"], "tool_call_id": m["tool_call_id"]})
        else:
            oss.append({"role": m["role"], "content": m["content"]})
    items = chat.MessageList.from_oss_messages(oss).messages
    if tools:
        specs = [
            chat.ToolSpecJson(
                t["type"], t["function"]["name"], t["function"].get("description", ""), t["function"]["parameters"]
            )
            for t in tools
        ]
        declare = chat.Message(chat.ToolDeclareJson(specs), chat.Author(chat.AuthorKind.System))
        at = 1 if items and items[0].author.kind == chat.AuthorKind.System else 0
        items = items[:at] + [declare] + items[at:]
    renderer = renderers.Qwen3() if enable_thinking else renderers.Qwen3.disable_thinking()
    spans, _parser = renderer.render_for_completion(chat.MessageList(items))
    return [t for s in spans for t in s.span.tokens]

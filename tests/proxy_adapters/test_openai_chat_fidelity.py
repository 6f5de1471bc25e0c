"""Chat Completions fidelity: OpenAI chat conversations, given natively to each family's
vendored official template, render exactly as our translation (apps.proxy.openai.chat_request)
followed by the family adapter, text and ids.

The reference is the official template on the OpenAI messages as a client sends them
(system, user, assistant tool_calls with JSON-text arguments, tool messages, reasoning_content)
and the tools in OpenAI's function format, with the same documented corrections the Messages
tests apply (conftest_families: the DeepSeek generation prompt and tool section, Kimi's ids
and compact sorted tools, the V3.1 edits) and two of the protocol's own:

- arguments: the translation parses the JSON text and the adapter serializes the object as the
  template's tojson does, as vLLM does before rendering; so the reference is given the
  arguments as objects where the template cannot print text (GLM raises on it, V3.1 applies
  tojson) and as json.dumps(..., ensure_ascii=False) text where it prints it as sent (Qwen3,
  Kimi, R1). A client's own spacing or escaping of arguments is normalized that way;
- content null beside tool calls is given to the templates as "" (Qwen3's template calls
  string methods on it);
- a function's `strict` flag is not rendered: it is an API switch (not enforced here), not
  part of the function the model is told about, and the Messages path renders none either.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.proxy.adapters import deepseek, deepseek_v31
from apps.proxy.adapters.deepseek import DeepSeekAdapter
from apps.proxy.adapters.deepseek_v31 import DeepSeekV31Adapter
from apps.proxy.adapters.glm import GlmAdapter
from apps.proxy.adapters.kimi import KimiK2Adapter, deep_sorted
from apps.proxy.adapters.qwen import Qwen3Adapter
from apps.proxy.chat_templates import load_template
from apps.proxy.openai.chat_request import chat_request_parse
from tests.proxy_adapters.conftest_families import (
    deepseek_r1_template,
    deepseek_v31_template,
    jinja,
    kimi_k2_thinking_template,
)

BOS = "<｜begin▁of▁sentence｜>"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
BASH = {
    "type": "function",
    "function": {
        "name": "Bash",
        "description": "Run a shell command. Über-useful: «quotes» and ünïcode.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
            "required": ["command"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
TOOLS = [WEATHER, BASH]


def arguments(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False)


def call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments(args)}}


def conversations(ids: tuple[str, str, str]) -> dict[str, dict[str, Any]]:
    a, b, c = ids
    return {
        "system_user": {
            "messages": [{"role": "system", "content": "You are careful."}, {"role": "user", "content": "Hello!"}]
        },
        "developer_and_parts": {
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "Answer briefly."}]},
                {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]},
            ]
        },
        "multi_turn": {
            "messages": [
                {"role": "system", "content": "You are helpful."},
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4."},
                {"role": "user", "content": "And 3+3?"},
                {"role": "assistant", "content": "6."},
                {"role": "user", "content": "Thanks!"},
            ]
        },
        "tool_loop_open": {
            "tools": TOOLS,
            "messages": [
                {"role": "system", "content": "You are an agent."},
                {"role": "user", "content": "List files."},
                {"role": "assistant", "content": None, "tool_calls": [call(a, "Bash", {"command": "ls -la"})]},
                {"role": "tool", "tool_call_id": a, "content": "a.txt\nb.txt"},
            ],
        },
        "parallel_calls_and_results": {
            "tools": TOOLS,
            "messages": [
                {"role": "system", "content": "You are an agent."},
                {"role": "user", "content": "Weather in Paris, and the date."},
                {
                    "role": "assistant",
                    "content": "Checking both.",
                    "tool_calls": [
                        call(a, "get_weather", {"city": "Paris", "days": 3}),
                        call(b, "Bash", {"command": "date", "timeout": 5}),
                    ],
                },
                {"role": "tool", "tool_call_id": a, "content": "Sunny, 24°C"},
                {"role": "tool", "tool_call_id": b, "content": [{"type": "text", "text": "Mon Jan 1"}]},
            ],
        },
        "several_rounds": {
            "tools": TOOLS,
            "messages": [
                {"role": "system", "content": "You are an agent."},
                {"role": "user", "content": "Do two things."},
                {"role": "assistant", "content": None, "tool_calls": [call(a, "Bash", {"command": "echo one"})]},
                {"role": "tool", "tool_call_id": a, "content": "one"},
                {"role": "assistant", "content": "", "tool_calls": [call(b, "Bash", {"command": "echo two"})]},
                {"role": "tool", "tool_call_id": b, "content": "two"},
                {"role": "assistant", "content": "Both done."},
                {"role": "user", "content": "And a third?"},
            ],
        },
        "reasoning": {
            "tools": TOOLS,
            "messages": [
                {"role": "system", "content": "Think first."},
                {"role": "user", "content": "Is 17 prime?"},
                {"role": "assistant", "content": "Yes.", "reasoning_content": "17 has no divisors."},
                {"role": "user", "content": "Check the weather in Oslo."},
                {
                    "role": "assistant",
                    "content": "Checking.",
                    "reasoning_content": "Use the tool.",
                    "tool_calls": [call(c, "get_weather", {"city": "Oslo"})],
                },
                {"role": "tool", "tool_call_id": c, "content": "Snow"},
            ],
        },
    }


def native(messages: list[dict[str, Any]], *, object_arguments: bool) -> list[dict[str, Any]]:
    """The OpenAI messages as the template gets them (see the module docstring)."""
    out = []
    for m in messages:
        m = dict(m)
        if m["role"] == "developer":
            m["role"] = "system"  # the templates know system; OpenAI's developer is its successor
        if isinstance(m.get("content"), list):
            m["content"] = "\n".join(p["text"] for p in m["content"])
        if m["role"] == "assistant" and m.get("content") is None:
            m["content"] = ""
        if object_arguments and m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def native_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    return [{**t, "function": {k: v for k, v in t["function"].items() if k != "strict"}} for t in tools]


def ours(adapter: Any, body: dict[str, Any], **extra: Any) -> tuple[str, list[int]]:
    request = chat_request_parse({"model": "m", **body, **extra})
    rendered = adapter.render(request={k: v for k, v in request.items() if k != "include_usage"})
    return rendered.text, list(rendered.token_ids)


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


# --- references, one per family (the Messages tests' corrections) ------------------------------


def qwen3_reference(body: dict[str, Any], **kwargs: Any) -> str:
    return jinja(
        load_template("qwen3"),
        native(body["messages"], object_arguments=False),
        native_tools(body.get("tools")),
        **kwargs,
    )


def glm_reference(body: dict[str, Any], **kwargs: Any) -> str:
    return jinja(
        load_template("glm-4.6"),
        native(body["messages"], object_arguments=True),
        native_tools(body.get("tools")),
        **kwargs,
    )


def kimi_reference(body: dict[str, Any], **kwargs: Any) -> str:
    tools = native_tools(body.get("tools"))
    messages = native(body["messages"], object_arguments=False)
    return jinja(kimi_k2_thinking_template(), messages, deep_sorted(tools) if tools else None, **kwargs)


def r1_reference(body: dict[str, Any], **kwargs: Any) -> str:
    messages = native(body["messages"], object_arguments=False)
    if native_tools(body.get("tools")):
        messages = [*messages, {"role": "system", "content": deepseek.tools_section(native_tools(body["tools"]) or [])}]
    return jinja(deepseek_r1_template(), messages, None, bos_token=BOS, **kwargs)


def v31_reference(body: dict[str, Any], **kwargs: Any) -> str:
    # deepseek_v31_template() prints the argument text as given (the V3.1 edits).
    messages = native(body["messages"], object_arguments=False)
    if native_tools(body.get("tools")):
        messages = [
            *messages,
            {"role": "system", "content": deepseek_v31.tools_section(native_tools(body["tools"]) or [])},
        ]
    return jinja(deepseek_v31_template(), messages, None, bos_token=BOS, **kwargs)


FAMILIES: dict[str, dict[str, Any]] = {
    "qwen3": {"tokenizer": "qwen3", "adapter": Qwen3Adapter, "reference": qwen3_reference, "ids": ("c1", "c2", "c3")},
    "glm": {"tokenizer": "glm-4.5", "adapter": GlmAdapter, "reference": glm_reference, "ids": ("c1", "c2", "c3")},
    "kimi": {
        "tokenizer": "kimi-k2",
        "adapter": KimiK2Adapter,
        "reference": kimi_reference,
        "ids": ("functions.Bash:0", "functions.Bash:1", "functions.get_weather:2"),
    },
    "deepseek-r1": {
        "tokenizer": "deepseek-v3",
        "adapter": DeepSeekAdapter,
        "reference": r1_reference,
        "ids": ("call_a", "call_b", "call_c"),
    },
    "deepseek-v3.1": {
        "tokenizer": "deepseek-v3.1",
        "adapter": DeepSeekV31Adapter,
        "reference": v31_reference,
        "ids": ("call_a", "call_b", "call_c"),
    },
}
CASES = sorted(conversations(("x", "y", "z")))
# The R1 template mis-renders a second tool round (it reopens no outputs block); the adapter
# fixes that, as test_deepseek.py's test_fixes_the_r1_template_on_multiple_tool_rounds shows.
TEMPLATE_BUGS = {("deepseek-r1", "several_rounds")}


@pytest.fixture(scope="module")
def families(load: Any) -> dict[str, tuple[Any, Any]]:
    out = {}
    for name, spec in FAMILIES.items():
        tokenizer = load(spec["tokenizer"])
        out[name] = (tokenizer, spec["adapter"](tokenizer=tokenizer))
    return out


@pytest.mark.parametrize(
    "family, case", [(f, c) for f in sorted(FAMILIES) for c in CASES if (f, c) not in TEMPLATE_BUGS]
)
def test_chat_conversation_renders_as_the_official_template(families: Any, family: str, case: str) -> None:
    tokenizer, adapter = families[family]
    spec = FAMILIES[family]
    body = conversations(spec["ids"])[case]
    text, ids = ours(adapter, body)
    expected = spec["reference"](body)
    assert text == expected
    assert ids == encode(tokenizer, expected)


@pytest.mark.parametrize(
    "family, kwargs",
    [
        ("qwen3", {"enable_thinking": False}),
        ("glm", {"enable_thinking": False}),
        ("deepseek-v3.1", {"thinking": False}),
    ],
)
def test_thinking_off_is_the_templates_own_switch(families: Any, family: str, kwargs: dict[str, Any]) -> None:
    tokenizer, adapter = families[family]
    spec = FAMILIES[family]
    for case in ("multi_turn", "reasoning"):
        body = conversations(spec["ids"])[case]
        expected = spec["reference"](body, **kwargs)
        for switch in ({"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}):
            text, ids = ours(adapter, body, **switch)
            assert text == expected, (case, switch)
            assert ids == encode(tokenizer, expected)

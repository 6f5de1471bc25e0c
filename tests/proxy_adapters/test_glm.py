"""GLM-4.5 / 4.6 adapter: rendering against the official GLM-4.6 template (the only reference:
tml-renderers and tinker-cookbook have GLM-5 renderers, another format), parsing, round trips."""

from __future__ import annotations

import random
from typing import Any

import pytest

from apps.proxy.adapters.glm import GlmAdapter, argument_value
from apps.proxy.adapters.registry import ADAPTERS
from apps.proxy.chat_templates import load_template
from tests.proxy_adapters.conftest_families import (
    ERROR_RESULTS_SENT,
    TOOLS,
    as_sent,
    chat_messages,
    conversations,
    error_results,
    error_results_then_user,
    hf_apply_chat_template,
    jinja,
    next_request,
    results_for,
)

IDS = ("call_a", "call_b", "call_c")
CONVERSATIONS = conversations(IDS)
OFF = {"type": "disabled"}
USER_ID, OBSERVATION_ID = 151336, 151338


@pytest.fixture(scope="module")
def tokenizer(load: Any) -> Any:
    return load("glm-4.5")


@pytest.fixture
def adapter(tokenizer: Any) -> GlmAdapter:
    return GlmAdapter(tokenizer=tokenizer)


def ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def official_text(request: dict[str, Any], *, sent: list[str] | None = None, **kwargs: Any) -> str:
    """`sent`: the tool results' texts as the harness sent them, given to the template directly."""
    messages, tools = chat_messages(request)
    messages = messages if sent is None else as_sent(messages, sent)
    if (request.get("thinking") or {}).get("type") == "disabled":
        kwargs["enable_thinking"] = False
    return jinja(load_template("glm-4.6"), messages, tools, **kwargs)


@pytest.mark.parametrize("thinking", [None, OFF], ids=["thinking", "nothink"])
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_render_matches_official_template(
    adapter: GlmAdapter, tokenizer: Any, name: str, thinking: dict[str, Any] | None
) -> None:
    request = dict(CONVERSATIONS[name])
    if thinking is not None:
        request["thinking"] = thinking
    rendered = adapter.render(request=request)
    expected = official_text(request)
    assert rendered.text == expected
    assert rendered.token_ids == ids(tokenizer, expected)
    assert adapter.count_tokens(request=request) == len(rendered.token_ids)
    assert adapter.render_text(request=request) == rendered.text


@pytest.mark.parametrize("thinking", [None, OFF], ids=["thinking", "nothink"])
@pytest.mark.parametrize("case", [error_results, error_results_then_user])
def test_error_results_render_as_the_harness_sent_them(
    adapter: GlmAdapter, tokenizer: Any, case: Any, thinking: dict[str, Any] | None
) -> None:
    request = case(IDS)
    if thinking is not None:
        request["thinking"] = thinking
    rendered = adapter.render(request=request)
    expected = official_text(request, sent=ERROR_RESULTS_SENT)
    assert rendered.text == expected
    assert rendered.token_ids == ids(tokenizer, expected)


@pytest.mark.parametrize("thinking", [None, OFF], ids=["thinking", "nothink"])
def test_reference_environment_is_transformers(
    adapter: GlmAdapter, tokenizer_root: Any, thinking: dict[str, Any] | None
) -> None:
    request = {**CONVERSATIONS["thinking"], "thinking": thinking}
    messages, tools = chat_messages(request)
    kwargs = {"enable_thinking": False} if thinking else {}
    text = hf_apply_chat_template(tokenizer_root / "glm-4.5", load_template("glm-4.6"), messages, tools, **kwargs)
    assert text == official_text(request) == adapter.render(request=request).text


def test_format_details(adapter: GlmAdapter, tokenizer: Any) -> None:
    text = adapter.render(request=CONVERSATIONS["multi_call"]).text
    assert text.startswith("[gMASK]<sop><|system|>\n# Tools\n\n")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather", "description": "Get the weather' in text
    assert "Über-useful" in text and "web_search" not in text  # ensure_ascii=False; server tool skipped
    assert text.count("<|system|>") == 2  # the tools block, then the system prompt
    assert (
        "<|assistant|>\n<think></think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris"
        "</arg_value>\n</tool_call>\n<tool_call>Bash\n<arg_key>command</arg_key>\n<arg_value>date</arg_value>\n"
        "<arg_key>run_in_background</arg_key>\n<arg_value>false</arg_value>\n</tool_call>"
        "<|observation|>\n<tool_response>\nRain\n</tool_response>\n<tool_response>\ncommand not found\n"
        "</tool_response><|assistant|>"
    ) in text
    rendered = adapter.render(request={**CONVERSATIONS["system_user"], "thinking": OFF})
    assert rendered.text == (
        "[gMASK]<sop><|system|>\nYou are a careful assistant.\nAnswer briefly.<|user|>\n"
        "Hello, world!/nothink<|assistant|>\n<think></think>"
    )
    # Literal ids: [gMASK] 151331, <sop> 151333, <|system|> 151335,
    # /nothink 151360, <|assistant|> 151337, <think> 151350, </think> 151351.
    assert rendered.token_ids[:3] == [151331, 151333, 151335]
    assert rendered.token_ids[-5:] == [151360, 151337, 198, 151350, 151351]
    assert adapter.stop_token_ids() == [151329, USER_ID, OBSERVATION_ID]


def test_reasoning_kept_only_after_the_last_user_message(adapter: GlmAdapter) -> None:
    text = adapter.render(request=CONVERSATIONS["thinking"]).text
    assert "<|assistant|>\n<think></think>\nYes.<|user|>" in text
    assert "<|assistant|>\n<think>Use the tool.</think>\nChecking.\n<tool_call>get_weather" in text


def test_mid_conversation_system_and_images(adapter: GlmAdapter) -> None:
    text = adapter.render(request=CONVERSATIONS["mid_system"]).text
    assert "\nHello<|system|>\nContext was compacted.<|user|>\nContinue<|assistant|>" in text
    text = adapter.render(request=CONVERSATIONS["blocks"]).text
    assert "<|user|>\n[image: image/png, 108 bytes omitted]\nWhat is in the image?<|assistant|>" in text
    assert (
        "<|observation|>\n<tool_response>\nPNG image\n[image: image/jpeg, 108 bytes omitted]\n</tool_response>"
        "<|user|>\n<system-reminder>Be brief.</system-reminder><|assistant|>"
    ) in text


def test_prefill(adapter: GlmAdapter) -> None:
    request = {"messages": [{"role": "user", "content": "JSON please"}, {"role": "assistant", "content": "{"}]}
    text = adapter.render(request=request).text
    assert text == "[gMASK]<sop><|user|>\nJSON please<|assistant|>\n<think></think>\n{"
    assert text == official_text(request, add_generation_prompt=False)


# --- parsing ---------------------------------------------------------------------------------


def sample(tokenizer: Any, text: str, stop: int | None = OBSERVATION_ID) -> list[int]:
    return ids(tokenizer, text) + ([stop] if stop is not None else [])


def call_text(name: str, args: list[tuple[str, str]]) -> str:
    return (
        "<tool_call>"
        + name
        + "\n"
        + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in args)
        + "</tool_call>"
    )


def test_parse_reasoning_and_text(adapter: GlmAdapter, tokenizer: Any) -> None:
    parsed = adapter.parse(
        token_ids=sample(tokenizer, "\n<think>Greeting.</think>\nHello there!", USER_ID), stopped=True
    )
    assert parsed.blocks == [
        {"type": "thinking", "thinking": "Greeting.", "signature": ""},
        {"type": "text", "text": "Hello there!"},
    ]
    assert parsed.stop_reason == "end_turn" and parsed.parse_errors == []
    nothink = adapter.parse(token_ids=sample(tokenizer, "\nHi.", USER_ID), stopped=True)
    assert nothink.blocks == [{"type": "text", "text": "Hi."}]


def test_parse_single_call_with_typed_arguments(adapter: GlmAdapter, tokenizer: Any) -> None:
    text = "\n<think>Need the weather.</think>\nLet me look.\n" + call_text(
        "get_weather", [("city", "New York"), ("days", "3")]
    )
    parsed = adapter.parse(token_ids=sample(tokenizer, text), stopped=True)
    assert [b["type"] for b in parsed.blocks] == ["thinking", "text", "tool_use"]
    use = parsed.blocks[2]
    assert use["name"] == "get_weather" and use["input"] == {"city": "New York", "days": 3}
    assert use["id"].startswith("toolu_") and parsed.stop_reason == "tool_use"


def test_parse_uses_the_schema_for_string_arguments(adapter: GlmAdapter, tokenizer: Any) -> None:
    text = "\n" + call_text("Bash", [("command", "42"), ("timeout", "1000"), ("run_in_background", "true")])
    without = adapter.parse(token_ids=sample(tokenizer, text), stopped=True)
    assert without.blocks[0]["input"] == {"command": 42, "timeout": 1000, "run_in_background": True}
    typed = adapter.parse(token_ids=sample(tokenizer, text), stopped=True, tools=TOOLS)
    assert typed.blocks[0]["input"] == {"command": "42", "timeout": 1000, "run_in_background": True}
    assert argument_value('{"a": [1, 2]}', None) == {"a": [1, 2]}
    assert argument_value('"quoted"', None) == '"quoted"' and argument_value("x y", {"integer"}) == "x y"


def test_parse_multiple_calls(adapter: GlmAdapter, tokenizer: Any) -> None:
    text = (
        "\n<think>Two things.</think>\n"
        + call_text("get_weather", [("city", "Paris")])
        + "\n"
        + call_text("Bash", [("command", "echo 'a\nb'")])
        + "\n"
        + call_text("noargs", [])
    )
    parsed = adapter.parse(token_ids=sample(tokenizer, text), stopped=True, id_seed="r")
    uses = [b for b in parsed.blocks if b["type"] == "tool_use"]
    assert [(u["name"], u["input"]) for u in uses] == [
        ("get_weather", {"city": "Paris"}),
        ("Bash", {"command": "echo 'a\nb'"}),
        ("noargs", {}),
    ]
    assert len({u["id"] for u in uses}) == 3 and parsed.stop_reason == "tool_use"


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",  # no name
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',  # JSON, not XML
        "<tool_call>get_weather\n<arg_key>city</arg_key>\nParis\n</tool_call>",  # value not wrapped
    ],
)
def test_malformed_call_becomes_text_with_an_error(adapter: GlmAdapter, tokenizer: Any, bad: str) -> None:
    parsed = adapter.parse(token_ids=sample(tokenizer, "\n" + bad), stopped=True)
    assert parsed.stop_reason == "end_turn"
    assert parsed.blocks == [{"type": "text", "text": bad}] and len(parsed.parse_errors) == 1


def test_truncated_output_is_max_tokens(adapter: GlmAdapter, tokenizer: Any) -> None:
    parsed = adapter.parse(token_ids=sample(tokenizer, "\n<think>Still going", None), stopped=False)
    assert parsed.stop_reason == "max_tokens"
    assert parsed.blocks == [{"type": "thinking", "thinking": "Still going", "signature": ""}]
    cut = "\n<think>ok</think>\n" + call_text("Bash", [("command", "ls")])[:-15]
    parsed = adapter.parse(token_ids=sample(tokenizer, cut, None), stopped=False)
    assert parsed.stop_reason == "max_tokens" and parsed.parse_errors and parsed.blocks[-1]["type"] == "text"


def test_parse_never_raises(adapter: GlmAdapter) -> None:
    rng = random.Random(5)
    specials = [151336, 151338, 151350, 151351, 151352, 151353, 151356, 151357, 151358, 151359]
    for _ in range(200):
        token_ids = [
            rng.choice(specials) if rng.random() < 0.3 else rng.randrange(100, 150000)
            for _ in range(rng.randrange(0, 40))
        ]
        assert adapter.parse(token_ids=token_ids, stopped=rng.random() < 0.5).stop_reason in (
            "end_turn",
            "tool_use",
            "max_tokens",
        )


# --- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("thinking", [None, OFF], ids=["thinking", "nothink"])
@pytest.mark.parametrize("canonical", [True, False], ids=["canonical", "non-canonical"])
def test_round_trip_of_a_tool_turn_is_append_only(
    tokenizer: Any, thinking: dict[str, Any] | None, canonical: bool
) -> None:
    """The sampled turn and its stop token (<|observation|>, which starts the tool results)
    are in the next prompt. Non-canonical: no newline between </arg_key> and <arg_value>,
    kept exact by the sampled-turn memo."""
    adapter = GlmAdapter(tokenizer=tokenizer)
    request = dict(CONVERSATIONS["tool_loop_open"])
    if thinking is not None:
        request["thinking"] = thinking
    prompt = adapter.render(request=request).token_ids
    call = call_text("Bash", [("command", "cat a.txt"), ("timeout", "5")])
    if not canonical:
        call = call.replace("</arg_key>\n<arg_value>", "</arg_key><arg_value>")
    body = ("\n<think>Read it.</think>\nReading.\n" if thinking is None else "\nReading.\n") + call
    sampled = sample(tokenizer, body)
    parsed = adapter.parse(token_ids=sampled, stopped=True, tools=TOOLS)
    assert parsed.stop_reason == "tool_use" and parsed.blocks[-1]["input"] == {"command": "cat a.txt", "timeout": 5}
    follow = adapter.render(request=next_request(request, parsed.blocks, results_for(parsed.blocks))).token_ids
    assert follow[: len(prompt) + len(sampled)] == prompt + sampled


def test_answer_reasoning_is_dropped_after_the_next_user_message(adapter: GlmAdapter, tokenizer: Any) -> None:
    request = CONVERSATIONS["multi_turn"]
    prompt = adapter.render(request=request).token_ids
    sampled = sample(tokenizer, "\n<think>Polite.</think>\nYou're welcome!", USER_ID)
    parsed = adapter.parse(token_ids=sampled, stopped=True)
    follow = next_request(request, parsed.blocks, [])
    follow["messages"].append({"role": "user", "content": "Bye"})
    rendered = adapter.render(request=follow).token_ids
    expected = prompt + ids(tokenizer, "\n<think></think>\nYou're welcome!") + [USER_ID]
    assert rendered[: len(expected)] == expected


def test_registered() -> None:
    assert ADAPTERS["glm-4.5"] is GlmAdapter and ADAPTERS["glm-4.6"] is GlmAdapter

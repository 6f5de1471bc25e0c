"""DeepSeek V3.1 adapter: rendering against V3.1's upstream template (llama.cpp's copy with its two
changes undone) and tml-renderers' DeepSeekV31, with thinking off, on and unspecified; how it
differs from R1; parsing and sampled -> next-prompt round trips."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.proxy.adapters.deepseek import DeepSeekAdapter
from apps.proxy.adapters.deepseek_v31 import DeepSeekV31Adapter, tools_section
from apps.proxy.adapters.registry import ADAPTERS
from apps.proxy.chat_templates import load_template
from tests.proxy_adapters.conftest_families import (
    ERROR_RESULTS_SENT,
    WEATHER_TOOL,
    as_sent,
    chat_messages,
    conversations,
    deepseek_v31_template,
    error_results,
    error_results_then_user,
    hf_apply_chat_template,
    jinja,
    next_request,
    results_for,
    tml_available,
    tml_ids,
    tool_result,
    with_string_arguments,
)

IDS = ("call_a", "call_b", "call_c")
CONVERSATIONS = {
    **conversations(IDS),
    "error_results": error_results(IDS),
    "error_results_then_user": error_results_then_user(IDS),
}
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
ON = {"type": "enabled", "budget_tokens": 2048}
OFF = {"type": "disabled"}
THINKING = {"unspecified": None, "off": OFF, "on": ON}


def dumps(arguments: Any) -> str:
    return json.dumps(arguments, ensure_ascii=False)


@pytest.fixture(scope="module")
def tokenizer(load: Any) -> Any:
    return load("deepseek-v3.1")


@pytest.fixture
def adapter(tokenizer: Any) -> DeepSeekV31Adapter:
    return DeepSeekV31Adapter(tokenizer=tokenizer)


def ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def with_thinking(request: dict[str, Any], thinking: dict[str, Any] | None) -> dict[str, Any]:
    request = {k: v for k, v in request.items() if k != "thinking"}
    return request if thinking is None else {**request, "thinking": thinking}


def template_messages(request: dict[str, Any], *, sent: list[str] | None = None) -> list[dict[str, Any]]:
    """The adapter's template messages (or, with `sent`, the tool results' texts as the harness
    sent them), arguments as strings (the upstream template prints them), and the tool
    description as the last system message (the template collects system messages in order)."""
    messages, tools = chat_messages(request)
    messages = with_string_arguments(messages if sent is None else as_sent(messages, sent), dumps=dumps)
    return [*messages, {"role": "system", "content": tools_section(tools)}] if tools else messages


def official_text(request: dict[str, Any], *, sent: list[str] | None = None, **kwargs: Any) -> str:
    thinking = request.get("thinking")
    if thinking is not None:
        kwargs["thinking"] = thinking["type"] != "disabled"  # absent: the template's own default
    return jinja(deepseek_v31_template(), template_messages(request, sent=sent), None, bos_token=BOS, **kwargs)


@pytest.mark.parametrize("thinking", sorted(THINKING))
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_render_matches_the_official_v31_template(
    adapter: DeepSeekV31Adapter, tokenizer: Any, name: str, thinking: str
) -> None:
    request = with_thinking(CONVERSATIONS[name], THINKING[thinking])
    rendered = adapter.render(request=request)
    expected = official_text(request, sent=ERROR_RESULTS_SENT if name.startswith("error_results") else None)
    assert rendered.text == expected
    assert rendered.token_ids == ids(tokenizer, expected)
    assert adapter.count_tokens(request=request) == len(rendered.token_ids)
    assert adapter.render_text(request=request) == rendered.text


@pytest.mark.parametrize("name", ["tools", "multi_call", "thinking", "mid_system"])
def test_llama_cpp_copy_differs_only_by_its_think_markers(adapter: DeepSeekV31Adapter, name: str) -> None:
    """llama.cpp's file as shipped, on mapping arguments (its tojson gives our serialization):
    the only difference left is "<think></think>" for upstream's "</think>"."""
    request = with_thinking(CONVERSATIONS[name], OFF)
    messages, tools = chat_messages(request)
    messages = [*messages, {"role": "system", "content": tools_section(tools)}] if tools else messages
    shipped = jinja(load_template("deepseek-v3.1"), messages, None, bos_token=BOS, thinking=False)
    ours = adapter.render(request=request).text
    assert shipped != ours and shipped.replace("<think></think>", "</think>") == ours


@pytest.mark.parametrize("thinking", [False, True])
def test_reference_environment_is_transformers(
    adapter: DeepSeekV31Adapter, tokenizer_root: Any, thinking: bool
) -> None:
    request = with_thinking(CONVERSATIONS["multi_round"], ON if thinking else OFF)
    messages = template_messages(request)
    text = hf_apply_chat_template(
        tokenizer_root / "deepseek-v3", deepseek_v31_template(), messages, None, thinking=thinking
    )
    assert text == official_text(request) == adapter.render(request=request).text


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_chunked_ids_equal_whole_tokenization(adapter: DeepSeekV31Adapter, tokenizer: Any, name: str) -> None:
    for thinking in THINKING.values():
        rendered = adapter.render(request=with_thinking(CONVERSATIONS[name], thinking))
        assert rendered.token_ids == ids(tokenizer, rendered.text)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_v31_renders_every_conversation_unlike_r1(tokenizer: Any, name: str) -> None:
    """Why V3.1 is a family of its own: no conversation renders as R1 renders it."""
    v31 = DeepSeekV31Adapter(tokenizer=tokenizer)
    r1 = DeepSeekAdapter(tokenizer=tokenizer)
    for thinking in (OFF, ON):
        request = with_thinking(CONVERSATIONS[name], thinking)
        assert v31.render(request=request).token_ids != r1.render(request=request).token_ids


def test_generation_prompts_and_history(adapter: DeepSeekV31Adapter) -> None:
    request = CONVERSATIONS["multi_turn"]
    off = adapter.render(request=request)
    assert off.text == (
        f"{BOS}You are helpful.<｜User｜>What is 2+2?<｜Assistant｜></think>4.{EOS}"
        f"<｜User｜>And 3+3?<｜Assistant｜></think>6.{EOS}<｜User｜>Thanks!<｜Assistant｜></think>"
    )
    # Literal ids: <｜Assistant｜>=128804, <think>=128798, </think>=128799.
    assert off.token_ids[-2:] == [128804, 128799] and off.token_ids[0] == 0
    assert adapter.render(request=with_thinking(request, OFF)).token_ids == off.token_ids
    on = adapter.render(request=with_thinking(request, ON))
    assert on.text == off.text.removesuffix("</think>") + "<think>" and on.token_ids[-2:] == [128804, 128798]
    assert adapter.render(request=with_thinking(request, {"type": "adaptive"})).text == on.text
    assert adapter.stop_token_ids() == [1]


def test_tool_calls_results_and_system_messages(adapter: DeepSeekV31Adapter) -> None:
    text = adapter.render(request=CONVERSATIONS["multi_call"]).text
    assert text.startswith(f"{BOS}You are an agent.\n\n## Tools\n")
    assert (
        "<｜User｜>Weather in Paris and run date.<｜Assistant｜></think><｜tool▁calls▁begin｜>"
        '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
        '<｜tool▁call▁begin｜>Bash<｜tool▁sep｜>{"command": "date", "run_in_background": false}<｜tool▁call▁end｜>'
        f"<｜tool▁calls▁end｜>{EOS}<｜tool▁output▁begin｜>Rain<｜tool▁output▁end｜>"
        "<｜tool▁output▁begin｜>command not found<｜tool▁output▁end｜>"
    ) in text
    assert text.endswith("<｜tool▁output▁end｜>")  # the model continues the tool loop right there
    text = adapter.render(request=CONVERSATIONS["tools"]).text
    assert f"<｜tool▁output▁end｜>It will be sunny.{EOS}<｜User｜>Great." in text
    text = adapter.render(request=CONVERSATIONS["mid_system"]).text
    assert text.startswith(f"{BOS}S1.\n\nContext was compacted.<｜User｜>Hi<｜Assistant｜></think>Hello{EOS}")
    text = adapter.render(request=CONVERSATIONS["thinking"]).text
    assert "17 has no divisors" not in text and "Use the tool" not in text  # reasoning is never rendered


def test_tool_section_is_the_model_cards() -> None:
    _messages, tools = chat_messages({"tools": [WEATHER_TOOL], "messages": [{"role": "user", "content": "x"}]})
    assert tools_section(tools or []) == (
        "## Tools\nYou have access to the following tools:\n\n"
        "### get_weather\nDescription: Get the weather for a city.\n\n"
        'Parameters: {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}, '
        '"days": {"type": "integer"}}, "required": ["city"]}\n\n'
        "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments"
        "<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>\n\n"
        "Where:\n\n- `tool_call_name` must be an exact match to one of the available tools\n"
        "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
        "- For multiple tool calls, chain them directly without separators or spaces"
    )


@pytest.mark.parametrize("thinking", [OFF, ON], ids=["off", "on"])
def test_prefill_is_the_templates_prefix_continuation(adapter: DeepSeekV31Adapter, thinking: dict[str, Any]) -> None:
    request = {
        "thinking": thinking,
        "messages": [{"role": "user", "content": "JSON please"}, {"role": "assistant", "content": "{"}],
    }
    text = adapter.render(request=request).text
    opener = "<think>" if thinking is ON else "</think>"
    assert text == f"{BOS}<｜User｜>JSON please<｜Assistant｜>{opener}{{"
    messages = [{"role": "user", "content": "JSON please"}, {"role": "assistant", "content": "{", "prefix": True}]
    official = jinja(
        deepseek_v31_template(),
        messages,
        None,
        add_generation_prompt=False,
        bos_token=BOS,
        thinking=thinking is ON,
    )
    assert text == official.removesuffix(EOS)


# --- independent reference: tml-renderers DeepSeekV31 ----------------------------------------


def _without_tools(request: dict[str, Any]) -> dict[str, Any]:
    """tml's DeepSeek renderers take no tool declarations: compare without them (calls and
    results stay)."""
    return {k: v for k, v in request.items() if k != "tools"}


def _tml(request: dict[str, Any], *, sent: list[str] | None = None) -> list[int]:
    from tml_renderers import renderers

    messages, _tools = chat_messages(request)
    thinking = (request.get("thinking") or {}).get("type") not in (None, "disabled")
    renderer = renderers.DeepSeekV31.thinking() if thinking else renderers.DeepSeekV31()
    return tml_ids(renderer, messages if sent is None else as_sent(messages, sent), None, dumps=dumps)


TML_CASES = sorted(set(CONVERSATIONS) - {"thinking"})


@pytest.mark.parametrize("thinking", [OFF, ON], ids=["off", "on"])
@pytest.mark.parametrize("name", TML_CASES)
def test_render_matches_tml_deepseek_v31(adapter: DeepSeekV31Adapter, name: str, thinking: dict[str, Any]) -> None:
    tml_available()
    request = with_thinking(_without_tools(CONVERSATIONS[name]), thinking)
    sent = ERROR_RESULTS_SENT if name.startswith("error_results") else None
    assert adapter.render(request=request).token_ids == _tml(request, sent=sent)


def test_tml_differs_only_where_a_turn_has_text_and_calls(adapter: DeepSeekV31Adapter, tokenizer: Any) -> None:
    """tml ends the text of a turn that also calls tools ("Checking.") with an end-of-sentence
    before the calls; the template (and we) write the calls right after the text."""
    tml_available()
    request = with_thinking(_without_tools(CONVERSATIONS["thinking"]), OFF)
    ours = adapter.render(request=request).text
    theirs = tokenizer.decode(_tml(request), skip_special_tokens=False)
    assert theirs == ours.replace("Checking.<｜tool▁calls▁begin｜>", f"Checking.{EOS}<｜tool▁calls▁begin｜>")


# --- parsing ---------------------------------------------------------------------------------


def sample(tokenizer: Any, text: str, *, stop: bool = True) -> list[int]:
    return ids(tokenizer, text) + ([1] if stop else [])


def call_text(name: str, args: str) -> str:
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"


def test_parse_v31_calls_and_reasoning(adapter: DeepSeekV31Adapter, tokenizer: Any) -> None:
    text = (
        "Let me check.<｜tool▁calls▁begin｜>"
        + call_text("get_weather", '{"city": "Zürich"}')
        + call_text("Bash", '{"command": "ls"}')
        + "<｜tool▁calls▁end｜>"
    )
    parsed = adapter.parse(token_ids=sample(tokenizer, text), stopped=True, id_seed="req-1")
    assert [b["type"] for b in parsed.blocks] == ["text", "tool_use", "tool_use"]
    assert [(b["name"], b["input"]) for b in parsed.blocks[1:]] == [
        ("get_weather", {"city": "Zürich"}),
        ("Bash", {"command": "ls"}),
    ]
    assert parsed.stop_reason == "tool_use" and parsed.parse_errors == []
    thought = adapter.parse(token_ids=sample(tokenizer, "Greeting.</think>Hello!"), stopped=True)
    assert thought.blocks == [
        {"type": "thinking", "thinking": "Greeting.", "signature": ""},
        {"type": "text", "text": "Hello!"},
    ]
    bad = adapter.parse(
        token_ids=sample(tokenizer, "<｜tool▁calls▁begin｜>" + call_text("Bash", "{oops") + "<｜tool▁calls▁end｜>"),
        stopped=True,
    )
    assert bad.stop_reason == "end_turn" and len(bad.parse_errors) == 1 and bad.blocks[0]["type"] == "text"


# --- round trips (thinking off: what V3.1 calls tools in) --------------------------------------


def test_round_trip_of_a_tool_loop_is_append_only(adapter: DeepSeekV31Adapter, tokenizer: Any) -> None:
    request = {
        "system": "You are an agent.",
        "tools": CONVERSATIONS["tools"]["tools"],
        "messages": [{"role": "user", "content": "Weather in Zürich, then list files."}],
    }
    prompt = adapter.render(request=request).token_ids
    calls = sample(
        tokenizer,
        "<｜tool▁calls▁begin｜>" + call_text("get_weather", dumps({"city": "Zürich"})) + "<｜tool▁calls▁end｜>",
    )
    parsed = adapter.parse(token_ids=calls, stopped=True)
    follow_request = next_request(request, parsed.blocks, results_for(parsed.blocks))
    follow = adapter.render(request=follow_request).token_ids
    assert follow[: len(prompt) + len(calls)] == prompt + calls
    # After the tool outputs the model continues without a header; that turn re-renders exactly too.
    more = sample(
        tokenizer, "<｜tool▁calls▁begin｜>" + call_text("Bash", dumps({"command": "ls"})) + "<｜tool▁calls▁end｜>"
    )
    parsed2 = adapter.parse(token_ids=more, stopped=True)
    again = adapter.render(request=next_request(follow_request, parsed2.blocks, results_for(parsed2.blocks)))
    assert again.token_ids[: len(follow) + len(more)] == follow + more
    answer = sample(tokenizer, "It is sunny; two files.")
    parsed3 = adapter.parse(token_ids=answer, stopped=True)
    after = next_request(next_request(follow_request, parsed2.blocks, results_for(parsed2.blocks)), parsed3.blocks, [])
    last = adapter.render(request={**after, "messages": [*after["messages"], {"role": "user", "content": "ok"}]})
    assert last.token_ids[: len(again.token_ids) + len(answer)] == again.token_ids + answer


def test_round_trip_of_non_canonical_arguments_uses_the_sampled_ids(tokenizer: Any) -> None:
    adapter = DeepSeekV31Adapter(tokenizer=tokenizer)
    request = CONVERSATIONS["tool_loop_open"]
    prompt = adapter.render(request=request).token_ids
    sampled = sample(
        tokenizer, "<｜tool▁calls▁begin｜>" + call_text("Bash", '{"command":"ls  -1"}') + "<｜tool▁calls▁end｜>"
    )
    parsed = adapter.parse(token_ids=sampled, stopped=True)
    follow_request = next_request(request, parsed.blocks, [tool_result(parsed.blocks[0]["id"], "x")])
    follow = adapter.render(request=follow_request).token_ids
    assert follow[: len(prompt) + len(sampled)] == prompt + sampled
    canonical = DeepSeekV31Adapter(tokenizer=tokenizer).render(request=follow_request)
    assert '{"command": "ls  -1"}' in canonical.text and canonical.token_ids != follow


def test_registered_with_the_deepseek_tokenizer(load: Any) -> None:
    assert ADAPTERS["deepseek-v3.1"] is DeepSeekV31Adapter
    assert load("deepseek-v3.1") is load("deepseek-v3")

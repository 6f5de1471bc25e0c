"""DeepSeek V3 / R1 adapter: rendering against the official R1 template (current revision) and
tml-renderers' DeepSeekR1, parsing, and sampled -> next-prompt round trips."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from apps.proxy.adapters.deepseek import GENERATION_PROMPT, DeepSeekAdapter, tools_section
from apps.proxy.adapters.registry import ADAPTERS
from tests.proxy_adapters.conftest_families import (
    ERROR_RESULTS_SENT,
    WEATHER_TOOL,
    as_sent,
    chat_messages,
    conversations,
    deepseek_r1_template,
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
CONVERSATIONS = conversations(IDS)
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"


@pytest.fixture(scope="module")
def tokenizer(load: Any) -> Any:
    return load("deepseek-v3")


@pytest.fixture
def adapter(tokenizer: Any) -> DeepSeekAdapter:
    return DeepSeekAdapter(tokenizer=tokenizer)


def ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def official_text(request: dict[str, Any], *, sent: list[str] | None = None) -> str:
    """The R1 template on the adapter's template messages. The template does not render tools;
    the adapter's tool section is appended as the last system message (the template collects
    system messages, in order, into the opening prompt), so everything else is compared.
    `sent`: the tool results' texts as the harness sent them, given to the template directly."""
    messages, tools = chat_messages(request)
    messages = with_string_arguments(messages if sent is None else as_sent(messages, sent))
    if tools:
        messages = [*messages, {"role": "system", "content": tools_section(tools)}]
    return jinja(deepseek_r1_template(), messages, None, bos_token=BOS)


# Conversations on which the R1 template has none of the bugs the adapter fixes.
OFFICIAL_CASES = [
    "system_user",
    "user_only",
    "multi_turn",
    "tools",
    "tool_loop_open",
    "multi_call",
    "thinking",
    "mid_system",
]


@pytest.mark.parametrize("name", OFFICIAL_CASES)
def test_render_matches_official_r1_template(adapter: DeepSeekAdapter, tokenizer: Any, name: str) -> None:
    request = CONVERSATIONS[name]
    rendered = adapter.render(request=request)
    expected = official_text(request)
    assert rendered.text == expected
    assert rendered.token_ids == ids(tokenizer, expected)


def test_error_results_render_as_the_harness_sent_them(adapter: DeepSeekAdapter, tokenizer: Any) -> None:
    request = error_results(IDS)
    rendered = adapter.render(request=request)
    expected = official_text(request, sent=ERROR_RESULTS_SENT)
    assert rendered.text == expected
    assert rendered.token_ids == ids(tokenizer, expected)


def test_reference_environment_is_transformers(adapter: DeepSeekAdapter, tokenizer_root: Any) -> None:
    request = CONVERSATIONS["multi_call"]
    messages, tools = chat_messages(request)
    messages = [*with_string_arguments(messages), {"role": "system", "content": tools_section(tools or [])}]
    text = hf_apply_chat_template(tokenizer_root / "deepseek-v3", deepseek_r1_template(), messages, None)
    assert text == official_text(request) == adapter.render(request=request).text


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_chunked_ids_equal_whole_tokenization(adapter: DeepSeekAdapter, tokenizer: Any, name: str) -> None:
    rendered = adapter.render(request=CONVERSATIONS[name])
    assert rendered.token_ids == ids(tokenizer, rendered.text)
    assert adapter.count_tokens(request=CONVERSATIONS[name]) == len(rendered.token_ids)
    assert adapter.render_text(request=CONVERSATIONS[name]) == rendered.text


def test_generation_prompt_is_current_r1_revision(adapter: DeepSeekAdapter, tokenizer: Any) -> None:
    rendered = adapter.render(request=CONVERSATIONS["system_user"])
    assert (
        rendered.text
        == f"{BOS}You are a careful assistant.\nAnswer briefly.<｜User｜>Hello, world!<｜Assistant｜><think>\n"
    )
    # Literal ids: <｜Assistant｜>=128804, <think>=128798, "\n"=201.
    assert rendered.token_ids[-3:] == [128804, 128798, 201]
    assert rendered.token_ids[0] == 0


def test_system_messages_are_collected_into_the_opening_prompt(adapter: DeepSeekAdapter) -> None:
    text = adapter.render(request=CONVERSATIONS["mid_system"]).text
    assert text.startswith(f"{BOS}S1.\n\nContext was compacted.<｜User｜>Hi<｜Assistant｜>Hello{EOS}")
    assert text.count("Context was compacted.") == 1


def test_tool_section_is_the_documented_one_in_r1_syntax() -> None:
    messages, tools = chat_messages({"tools": [WEATHER_TOOL], "messages": [{"role": "user", "content": "x"}]})
    assert tools_section(tools or []) == (
        "## Tools\nYou have access to the following tools:\n\n"
        "### get_weather\nDescription: Get the weather for a city.\n\n"
        'Parameters: {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}, '
        '"days": {"type": "integer"}}, "required": ["city"]}\n\n'
        "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>tool_call_name\n```json\n"
        "tool_call_arguments\n```<｜tool▁call▁end｜>{additional_tool_calls}<｜tool▁calls▁end｜>\n\n"
        "Where:\n- `tool_call_name` must be an exact match to one of the available tools\n"
        "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
        "- For multiple tool calls, chain them with a newline as separator"
    )


def test_tools_follow_the_system_prompt_and_server_tools_are_skipped(adapter: DeepSeekAdapter) -> None:
    text = adapter.render(request=CONVERSATIONS["tools"]).text
    assert text.startswith(f"{BOS}You are an agent.\n\n## Tools\n")
    assert "### get_weather\n" in text and "### Bash\n" in text and "web_search" not in text
    assert text.index("## Tools") < text.index("<｜User｜>")


def test_fixes_the_r1_template_on_multiple_tool_rounds(adapter: DeepSeekAdapter) -> None:
    request = CONVERSATIONS["multi_round"]
    text = adapter.render(request=request).text
    official = official_text(request)
    assert text != official
    call = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>Bash\n```json\n{}\n```<｜tool▁call▁end｜>"
    first = call.replace("{}", json.dumps({"command": "echo one"}))
    second = call.replace("{}", json.dumps({"command": "echo two"}))
    outputs = "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{}<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"
    assert (
        f"<｜Assistant｜><｜tool▁calls▁begin｜>{first}<｜tool▁calls▁end｜>{EOS}"
        + outputs.replace("{}", "one")
        + f"<｜tool▁calls▁begin｜>{second}<｜tool▁calls▁end｜>{EOS}"
        + outputs.replace("{}", "two")
        + f"Both done.{EOS}<｜User｜>And a third?<｜Assistant｜><think>\n"
    ) in text
    # The official file loses the second turn's opener and the second outputs' begin/end.
    assert "<｜tool▁output▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>Bash" in official
    assert f"<｜tool▁calls▁end｜>{EOS}<｜tool▁output▁begin｜>two" in official


def test_closes_tool_outputs_before_a_user_turn(adapter: DeepSeekAdapter) -> None:
    text = adapter.render(request=CONVERSATIONS["blocks"]).text
    assert "<｜tool▁output▁end｜><｜tool▁outputs▁end｜><｜User｜><system-reminder>Be brief.</system-reminder>" in text
    assert "<｜User｜>[image: image/png, 108 bytes omitted]\nWhat is in the image?<｜Assistant｜>" in text
    assert "PNG image\n[image: image/jpeg, 108 bytes omitted]<｜tool▁output▁end｜>" in text


def test_error_results_and_block_results(adapter: DeepSeekAdapter) -> None:
    text = adapter.render(request=CONVERSATIONS["multi_call"]).text
    assert "<｜tool▁output▁begin｜>Rain<｜tool▁output▁end｜><｜tool▁output▁begin｜>command not found<" in text
    assert text.endswith("<｜tool▁output▁end｜><｜tool▁outputs▁end｜>")  # no generation prompt after outputs
    text = adapter.render(request=CONVERSATIONS["tool_loop_open"]).text
    assert "<｜tool▁output▁begin｜>a.txt\nb.txt<｜tool▁output▁end｜>" in text


def test_reasoning_is_dropped_from_history(adapter: DeepSeekAdapter) -> None:
    text = adapter.render(request=CONVERSATIONS["thinking"]).text
    assert "17 has no divisors" not in text and "Use the tool" not in text
    assert f"<｜Assistant｜>Yes.{EOS}" in text
    assert "<｜Assistant｜>Checking.<｜tool▁calls▁begin｜>" in text


def test_thinking_option_does_not_change_r1(adapter: DeepSeekAdapter) -> None:
    request = CONVERSATIONS["multi_turn"]
    for thinking in ({"type": "disabled"}, {"type": "adaptive"}):
        assert adapter.render(request={**request, "thinking": thinking}).text == adapter.render(request=request).text


def test_prefill_continues_the_final_assistant_message(adapter: DeepSeekAdapter) -> None:
    request = {"messages": [{"role": "user", "content": "JSON please"}, {"role": "assistant", "content": "{"}]}
    assert adapter.render(request=request).text == f"{BOS}<｜User｜>JSON please<｜Assistant｜>{{"


# --- independent reference: tml-renderers DeepSeekR1 ------------------------------------------


def _without_tools(request: dict[str, Any]) -> dict[str, Any]:
    """tml's DeepSeek renderers take no tool declarations, and encode message text as ordinary
    text (our tool section names special tokens, which HF's tokenization maps to their ids):
    compare the conversations without the declaration (calls and results stay)."""
    return {k: v for k, v in request.items() if k != "tools"}


@pytest.mark.parametrize("name", ["system_user", "user_only", "multi_turn", "tools", "multi_round", "blocks"])
def test_render_matches_tml_deepseek_r1(adapter: DeepSeekAdapter, name: str) -> None:
    tml_available()
    from tml_renderers import renderers

    request = _without_tools(CONVERSATIONS[name])
    messages, _tools = chat_messages(request)
    assert adapter.render(request=request).token_ids == tml_ids(renderers.DeepSeekR1(), messages, None)


@pytest.mark.parametrize("case", [error_results, error_results_then_user])
def test_error_results_match_tml_deepseek_r1_as_sent(adapter: DeepSeekAdapter, tokenizer: Any, case: Any) -> None:
    tml_available()
    from tml_renderers import renderers

    request = _without_tools(case(IDS))
    ours = adapter.render(request=request).token_ids
    messages, _tools = chat_messages(request)
    expected = tml_ids(renderers.DeepSeekR1(), as_sent(messages), None)
    if case is error_results:  # tml adds a generation prompt after tool outputs (see below)
        expected = expected[: -len(ids(tokenizer, GENERATION_PROMPT))]
    assert ours == expected


@pytest.mark.parametrize("name", ["tool_loop_open", "multi_call"])
def test_tml_differs_only_by_a_generation_prompt_after_tool_outputs(
    adapter: DeepSeekAdapter, tokenizer: Any, name: str
) -> None:
    tml_available()
    from tml_renderers import renderers

    request = _without_tools(CONVERSATIONS[name])
    ours = adapter.render(request=request).token_ids
    messages, _tools = chat_messages(request)
    assert tml_ids(renderers.DeepSeekR1(), messages, None) == ours + ids(tokenizer, GENERATION_PROMPT)


# --- parsing ---------------------------------------------------------------------------------


def sample(tokenizer: Any, text: str, *, stop: bool = True) -> list[int]:
    return ids(tokenizer, text) + ([1] if stop else [])


def call_text(name: str, args: str) -> str:
    return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"


def test_parse_reasoning_and_text(adapter: DeepSeekAdapter, tokenizer: Any) -> None:
    parsed = adapter.parse(token_ids=sample(tokenizer, "The user greets.\n</think>\n\nHello!"), stopped=True)
    assert parsed.blocks == [
        {"type": "thinking", "thinking": "The user greets.", "signature": ""},
        {"type": "text", "text": "Hello!"},
    ]
    assert parsed.stop_reason == "end_turn" and parsed.parse_errors == []
    assert adapter.stop_token_ids() == [1]


def test_parse_single_tool_call(adapter: DeepSeekAdapter, tokenizer: Any) -> None:
    text = (
        "Need weather.\n</think>\n\nLet me check.<｜tool▁calls▁begin｜>"
        + call_text("get_weather", '{"city": "Paris"}')
        + "<｜tool▁calls▁end｜>"
    )
    parsed = adapter.parse(token_ids=sample(tokenizer, text), stopped=True)
    kinds = [b["type"] for b in parsed.blocks]
    assert kinds == ["thinking", "text", "tool_use"]
    assert parsed.blocks[1]["text"] == "Let me check."
    use = parsed.blocks[2]
    assert use["name"] == "get_weather" and use["input"] == {"city": "Paris"} and use["id"].startswith("toolu_")
    assert parsed.stop_reason == "tool_use"


def test_parse_multiple_tool_calls_and_v31_syntax(adapter: DeepSeekAdapter, tokenizer: Any) -> None:
    text = (
        "<｜tool▁calls▁begin｜>"
        + call_text("get_weather", '{"city": "Paris"}')
        + "\n"
        + call_text("Bash", '{"command": "ls"}')
        + "\n"
        + '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Rome"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    )
    parsed = adapter.parse(token_ids=sample(tokenizer, text), stopped=True, id_seed="req-1")
    uses = [b for b in parsed.blocks if b["type"] == "tool_use"]
    assert [(u["name"], u["input"]) for u in uses] == [
        ("get_weather", {"city": "Paris"}),
        ("Bash", {"command": "ls"}),
        ("get_weather", {"city": "Rome"}),
    ]
    assert len({u["id"] for u in uses}) == 3
    assert parsed.blocks == [b for b in parsed.blocks if b["type"] == "tool_use"]
    assert parsed.stop_reason == "tool_use"
    other = adapter.parse(token_ids=sample(tokenizer, text), stopped=True, id_seed="req-2")
    assert [b["id"] for b in other.blocks] != [u["id"] for u in uses]


@pytest.mark.parametrize(
    "bad",
    [
        call_text("get_weather", '{"city": "Par'),  # invalid JSON
        call_text("get_weather", '["Paris"]'),  # not an object
        "<｜tool▁call▁begin｜>get_weather Paris<｜tool▁call▁end｜>",  # no separator
        call_text("", "{}"),  # no name
    ],
)
def test_malformed_tool_call_becomes_text_with_an_error(adapter: DeepSeekAdapter, tokenizer: Any, bad: str) -> None:
    text = "<｜tool▁calls▁begin｜>" + bad + "<｜tool▁calls▁end｜>"
    parsed = adapter.parse(token_ids=sample(tokenizer, text), stopped=True)
    assert parsed.stop_reason == "end_turn"
    assert [b["type"] for b in parsed.blocks] == ["text"] and parsed.blocks[0]["text"] == bad
    assert len(parsed.parse_errors) == 1


def test_one_good_and_one_malformed_call(adapter: DeepSeekAdapter, tokenizer: Any) -> None:
    text = (
        "<｜tool▁calls▁begin｜>"
        + call_text("Bash", '{"command": "ls"}')
        + "\n"
        + call_text("Bash", "{oops}")
        + "<｜tool▁calls▁end｜>"
    )
    parsed = adapter.parse(token_ids=sample(tokenizer, text), stopped=True)
    assert [b["type"] for b in parsed.blocks] == ["tool_use", "text"]
    assert parsed.stop_reason == "tool_use" and len(parsed.parse_errors) == 1


def test_truncated_output_is_max_tokens(adapter: DeepSeekAdapter, tokenizer: Any) -> None:
    text = "Plan.\n</think>\n\n<｜tool▁calls▁begin｜>" + call_text("Bash", '{"command": "l')[:-20]
    parsed = adapter.parse(token_ids=sample(tokenizer, text, stop=False), stopped=False)
    assert parsed.stop_reason == "max_tokens"
    assert parsed.blocks[0]["type"] == "thinking" and parsed.blocks[-1]["type"] == "text"
    assert parsed.parse_errors
    plain = adapter.parse(token_ids=sample(tokenizer, "Some long answer", stop=False), stopped=False)
    assert plain.stop_reason == "max_tokens" and plain.blocks == [{"type": "text", "text": "Some long answer"}]


def test_parse_never_raises(adapter: DeepSeekAdapter, tokenizer: Any) -> None:
    rng = random.Random(7)
    specials = [128798, 128799, 128806, 128807, 128808, 128809, 128814, 1]
    for _ in range(200):
        token_ids = [
            rng.choice(specials) if rng.random() < 0.3 else rng.randrange(100, 120000)
            for _ in range(rng.randrange(0, 40))
        ]
        parsed = adapter.parse(token_ids=token_ids, stopped=rng.random() < 0.5)
        assert parsed.stop_reason in ("end_turn", "tool_use", "max_tokens")


# --- round trips -----------------------------------------------------------------------------


def test_round_trip_after_tool_outputs_is_append_only(adapter: DeepSeekAdapter, tokenizer: Any) -> None:
    request = CONVERSATIONS["tool_loop_open"]
    prompt = adapter.render(request=request).token_ids
    sampled = sample(
        tokenizer,
        "<｜tool▁calls▁begin｜>"
        + call_text("Bash", json.dumps({"command": "cat a.txt"}))
        + "\n"
        + call_text("get_weather", json.dumps({"city": "Zürich"}))
        + "<｜tool▁calls▁end｜>",
    )
    parsed = adapter.parse(token_ids=sampled, stopped=True)
    assert parsed.stop_reason == "tool_use"
    follow = adapter.render(request=next_request(request, parsed.blocks, results_for(parsed.blocks))).token_ids
    assert follow[: len(prompt) + len(sampled)] == prompt + sampled
    # ...and then the final answer, also without reasoning.
    answer = sample(tokenizer, "Both files are listed.")
    parsed2 = adapter.parse(token_ids=answer, stopped=True)
    after = next_request(next_request(request, parsed.blocks, results_for(parsed.blocks)), parsed2.blocks, [])
    again = adapter.render(request={**after, "messages": [*after["messages"], {"role": "user", "content": "ok"}]})
    assert again.token_ids[: len(follow) + len(answer)] == follow + answer


def test_round_trip_with_reasoning_keeps_the_sampled_calls(adapter: DeepSeekAdapter, tokenizer: Any) -> None:
    request = {
        "system": "You are an agent.",
        "tools": CONVERSATIONS["tools"]["tools"],
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
    }
    prompt = adapter.render(request=request).token_ids
    calls = "<｜tool▁calls▁begin｜>" + call_text("get_weather", json.dumps({"city": "Paris"})) + "<｜tool▁calls▁end｜>"
    after_think = sample(tokenizer, calls)
    sampled = ids(tokenizer, "I will call the tool.\n</think>\n\n") + after_think
    parsed = adapter.parse(token_ids=sampled, stopped=True)
    assert [b["type"] for b in parsed.blocks] == ["thinking", "tool_use"]
    follow = adapter.render(request=next_request(request, parsed.blocks, [tool_result(parsed.blocks[1]["id"], "Sun")]))
    # R1 drops reasoning (and its forced "<think>\n") from history: the calls are kept exactly.
    gen = ids(tokenizer, GENERATION_PROMPT)
    head = prompt[: -len(gen)] + ids(tokenizer, "<｜Assistant｜>")
    assert follow.token_ids[: len(head) + len(after_think)] == head + after_think


def test_round_trip_of_non_canonical_arguments_uses_the_sampled_ids(tokenizer: Any) -> None:
    adapter = DeepSeekAdapter(tokenizer=tokenizer)
    request = CONVERSATIONS["tool_loop_open"]
    prompt = adapter.render(request=request).token_ids
    sampled = sample(
        tokenizer, "<｜tool▁calls▁begin｜>" + call_text("Bash", '{"command":"ls  -1"}') + "<｜tool▁calls▁end｜>"
    )
    parsed = adapter.parse(token_ids=sampled, stopped=True)
    follow_request = next_request(request, parsed.blocks, results_for(parsed.blocks))
    follow = adapter.render(request=follow_request).token_ids
    assert follow[: len(prompt) + len(sampled)] == prompt + sampled
    # A process without the memo renders the canonical (template) form instead.
    canonical = DeepSeekAdapter(tokenizer=tokenizer).render(request=follow_request)
    assert '{"command": "ls  -1"}' in canonical.text and canonical.token_ids != follow


def test_registered() -> None:
    assert ADAPTERS["deepseek-v3"] is DeepSeekAdapter and ADAPTERS["deepseek-r1"] is DeepSeekAdapter

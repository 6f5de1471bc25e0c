"""Fitting bulky tool results and skill content into the prompt budget."""

from __future__ import annotations

import pytest

from apps.proxy.adapters.qwen import Qwen3Adapter
from apps.proxy.errors import PromptTooLong
from apps.proxy.fitting import MARKER, SKILL_PREFIX, prompt_fit


@pytest.fixture
def adapter(qwen3_tokenizer):
    return Qwen3Adapter(tokenizer=qwen3_tokenizer)


def render(adapter):
    return lambda req: adapter.render(request=req)


def tool_turn(i: int, content) -> list[dict]:
    return [
        {"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i}", "name": "Read", "input": {"i": i}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": content}]},
    ]


def big(label: str, lines: int = 300) -> str:
    return "\n".join(f"{label} line {n}: the quick brown fox jumps over the lazy dog" for n in range(lines))


def test_nothing_cut_when_it_fits(adapter):
    req = {"messages": [{"role": "user", "content": "hi"}]}
    fitted = prompt_fit(request=req, budget=1000, render=render(adapter))
    assert fitted.request is req and fitted.record == []


def test_oldest_tool_results_are_cut_first_with_markers(adapter):
    messages = [{"role": "user", "content": "read the files"}]
    messages += tool_turn(0, big("old"))
    messages += tool_turn(1, [{"type": "text", "text": big("mid")}])
    messages += tool_turn(2, big("new", 40))
    req = {"messages": messages}
    full = len(adapter.render(request=req).token_ids)
    budget = full - 2000
    fitted = prompt_fit(request=req, budget=budget, render=render(adapter))
    assert len(fitted.rendered.token_ids) <= budget
    assert fitted.original_tokens == full
    # The oldest result took the cut; the newest is untouched; the caller's request too.
    old = fitted.request["messages"][2]["content"][0]["content"]
    assert "characters omitted by the proxy to fit the context window" in old
    assert old.startswith("old line 0:") and old.rstrip().endswith("lazy dog")
    assert fitted.request["messages"][6]["content"][0]["content"] == big("new", 40)
    assert messages[2]["content"][0]["content"] == big("old")
    [record] = [r for r in fitted.record if r["tool_use_id"] == "toolu_0"]
    assert record["kind"] == "tool_result" and record["omitted_chars"] > 0
    assert MARKER.format(n=record["omitted_chars"]) in old
    assert record["original_chars"] - record["kept_chars"] == record["omitted_chars"]


def test_nested_text_and_skill_content_are_candidates(adapter):
    skill = SKILL_PREFIX + " /skills/pdf\n\n" + big("skill")
    messages = [{"role": "user", "content": [{"type": "text", "text": skill}, {"type": "text", "text": "use it"}]}]
    messages += tool_turn(0, [{"type": "text", "text": big("nested")}])
    req = {"messages": messages}
    full = len(adapter.render(request=req).token_ids)
    fitted = prompt_fit(request=req, budget=full // 3, render=render(adapter))
    kinds = {r["kind"] for r in fitted.record}
    assert kinds == {"skill", "tool_result"}
    assert "omitted by the proxy" in fitted.request["messages"][0]["content"][0]["text"]
    assert fitted.request["messages"][0]["content"][1]["text"] == "use it"  # ordinary text is never cut


def test_still_too_long_is_prompt_too_long(adapter):
    req = {"messages": [{"role": "user", "content": "plain user text " * 500}]}
    with pytest.raises(PromptTooLong) as err:
        prompt_fit(request=req, budget=100, render=render(adapter))
    assert err.value.maximum == 100 and err.value.tokens > 100
    assert str(err.value) == f"prompt is too long: {err.value.tokens} tokens > 100 maximum"

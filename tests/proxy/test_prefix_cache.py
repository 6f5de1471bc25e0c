"""Exact-token prefix reuse: identical ids with and without the cache."""

from __future__ import annotations

import json

import pytest

from apps.proxy import calls
from apps.proxy.adapters.qwen import Qwen3Adapter
from apps.proxy.prefix_cache import PrefixCache, assistant_boundary, chatml_tokenize
from apps.proxy.prefix_cache import cache as global_cache

KEY = ("org_a", "mcr_a", "qwen3-8b", "qwen3", "session", "")


@pytest.fixture
def adapter(qwen3_tokenizer):
    return Qwen3Adapter(tokenizer=qwen3_tokenizer)


def conversation(turns: int, *, thinking: bool = False) -> list[dict]:
    """A Claude Code-like tool loop, `turns` tool cycles long, with awkward content:
    unicode, digits, whitespace runs and text that looks like markup."""
    messages: list[dict] = [{"role": "user", "content": "Fix the failing test in café/naïve_test.py  \n\n"}]
    for i in range(turns):
        content: list[dict] = []
        if thinking:
            content.append({"type": "thinking", "thinking": f"Step {i}: inspect   things 123456", "signature": "s"})
        content += [
            {"type": "text", "text": f"Running step {i} — ok?"},
            {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": f"pytest -k t{i}", "n": i}},
        ]
        messages.append({"role": "assistant", "content": content})
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"toolu_{i}",
                        "content": f"=== {i} passed ===\n\t  x = {{}}\n",
                    },
                    {"type": "text", "text": "<system-reminder>keep going</system-reminder>"},
                ],
            }
        )
    return messages


def request(messages: list[dict], **extra) -> dict:
    return {
        "system": [{"type": "text", "text": "You are a coding agent."}],
        "tools": [
            {
                "name": "Bash",
                "description": "Run",
                "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
            }
        ],
        "messages": messages,
        **extra,
    }


def cached_render(adapter, req, cache_key=KEY):
    return calls.render_with_cache(adapter=adapter, family="qwen3", request=req, key=cache_key)


def remember(adapter, rendered, cache_key=KEY, cache=global_cache, incremental=True):
    """As the proxy remembers a prompt: a hit's entry extended (``incremental``), or the
    whole prompt searched."""
    turn_end_id, sep = calls._turn_end_ids(adapter, "qwen3")
    cache.remember(
        key=cache_key,
        family="qwen3",
        text=rendered.text,
        ids=list(rendered.token_ids),
        turn_end_id=turn_end_id,
        separator_ids=sep,
        tokenized=getattr(rendered, "tokenized", None) if incremental else None,
    )


@pytest.mark.parametrize("thinking", [False, True])
def test_multi_turn_ids_identical_with_and_without_cache(adapter, qwen3_tokenizer, thinking):
    global_cache.clear()
    reused_total = 0
    for turns in range(0, 8):
        req = request(conversation(turns, thinking=thinking), thinking={"type": "adaptive"})
        with_cache = cached_render(adapter, req)
        without = adapter.render(request=req)
        plain = qwen3_tokenizer.encode(without.text, add_special_tokens=False).ids
        assert list(with_cache.token_ids) == list(without.token_ids) == plain, turns
        reused_total += with_cache.reused
        if turns >= 2:
            assert with_cache.reused > 0, f"turn {turns} should reuse the previous prompt"
        remember(adapter, with_cache)
    assert reused_total > 0


def test_changed_history_misses_and_stays_exact(adapter):
    global_cache.clear()
    first = cached_render(adapter, request(conversation(3)))
    remember(adapter, first)
    # A compaction rewrites history: the cached text is no longer a prefix.
    edited = conversation(4)
    edited[0] = {"role": "user", "content": "Summary of the earlier conversation."}
    again = cached_render(adapter, request(edited))
    assert again.reused == 0
    assert list(again.token_ids) == list(adapter.render(request=request(edited)).token_ids)


def test_sampled_turn_splices_survive_the_cache(adapter):
    """A turn the model sampled with non-canonical ids is rendered back as those ids by the
    adapter; a cache hit must give the same ids."""
    global_cache.clear()
    messages = conversation(1)
    req = request(messages)
    first = cached_render(adapter, req)
    remember(adapter, first)
    # The model answers with extra spaces in its tool-call JSON (non-canonical).
    sampled_text = (
        'Done.\n<tool_call>\n{"name":   "Bash", "arguments": {"command": "ls", "n": 9}}\n</tool_call><|im_end|>'
    )
    sampled = adapter.encode(sampled_text)
    parsed = adapter.parse(token_ids=sampled, stopped=True, id_seed="x")
    assert len(adapter.memo) >= 1
    messages = messages + [
        {"role": "assistant", "content": parsed.blocks},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": parsed.blocks[-1]["id"], "content": "ok"}]},
    ]
    req2 = request(messages)
    second = cached_render(adapter, req2)
    full = adapter.render(request=req2)
    assert second.reused > 0
    assert list(second.token_ids) == list(full.token_ids)
    # The adapter spliced the sampled ids in (a plain re-tokenization would differ).
    body = sampled[:-1]
    ids = list(full.token_ids)
    assert any(ids[i : i + len(body)] == body for i in range(len(ids) - len(body) + 1))
    assert ids != adapter.encode(full.text)


def test_entries_are_scoped_by_conversation(adapter):
    global_cache.clear()
    req = request(conversation(3))
    remember(adapter, cached_render(adapter, req))
    other_agent = (*KEY[:-1], "agent-2")
    other_org = ("org_b", *KEY[1:])
    assert cached_render(adapter, req, other_agent).reused == 0
    assert cached_render(adapter, req, other_org).reused == 0
    assert cached_render(adapter, req).reused > 0


def test_a_sampled_turn_is_not_tokenized_again_by_the_next_call(adapter, monkeypatch):
    """Parsing a sampled turn tokenizes its canonical rendering (to tell whether the sample
    re-tokenizes the same); those ids are kept, and the next call's suffix takes them instead
    of tokenizing the turn again. Its ids stay exact."""
    global_cache.clear()
    messages = conversation(1)
    remember(adapter, cached_render(adapter, request(messages)))
    long_text = "Here is what I found: " + "the test fails because the fixture is stale; " * 20
    sampled = adapter.encode(
        f'{long_text}\n<tool_call>\n{{"name": "Bash", "arguments": {{"command": "ls"}}}}\n</tool_call>'
    )
    parsed = adapter.parse(token_ids=sampled + adapter.encode("<|im_end|>"), stopped=True, id_seed="y")
    messages = messages + [
        {"role": "assistant", "content": parsed.blocks},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": parsed.blocks[-1]["id"], "content": "ok"}]},
    ]
    encoded: list[str] = []
    encode = adapter.encode
    monkeypatch.setattr(adapter, "encode", lambda text: encoded.append(text) or encode(text))
    second = cached_render(adapter, request(messages))
    assert second.reused > 0
    assert list(second.token_ids) == list(adapter.render(request=request(messages)).token_ids)
    assert encoded and not [t for t in encoded if "the fixture is stale" in t], encoded
    assert any("tool_response" in t for t in encoded)  # the new tool result is tokenized


@pytest.mark.parametrize("thinking", [False, True])
def test_each_tool_result_is_tokenized_once(adapter, qwen3_tokenizer, monkeypatch, thinking):
    """The cache holds a prompt up to its last complete turn (the tool results the model is
    asked to act on): the next call reuses all of it and tokenizes only its new assistant
    turn and tool results, never the previous ones again; its ids stay exact."""
    global_cache.clear()
    encoded: list[str] = []
    encode = adapter.encode
    monkeypatch.setattr(adapter, "encode", lambda text: encoded.append(text) or encode(text))
    previous = None
    for turns in range(0, 6):
        req = request(conversation(turns, thinking=thinking), thinking={"type": "adaptive"})
        encoded.clear()
        with_cache = cached_render(adapter, req)
        assert list(with_cache.token_ids) == list(adapter.render(request=req).token_ids), turns
        if previous is not None:
            last_turn = previous.text.rindex("<|im_end|>\n") + len("<|im_end|>\n")
            assert with_cache.reused == len(qwen3_tokenizer.encode(previous.text[:last_turn]).ids) > 0
            assert encoded and not [t for t in encoded if f"=== {turns - 2} passed ===" in t], encoded
            assert [t for t in encoded if f"=== {turns - 1} passed ===" in t]  # the new result, once
        remember(adapter, with_cache)
        previous = with_cache


def test_a_rewritten_last_turn_falls_back_to_the_last_assistant_turn(adapter, qwen3_tokenizer):
    """A harness that rewrites its latest message before the next call (a reminder moved, a
    result truncated) breaks the longer cut; the entry's shorter one, the end of the last
    completed assistant turn, is still reused, and the ids stay exact."""
    global_cache.clear()
    first = cached_render(adapter, request(conversation(2)))
    remember(adapter, first)
    rewritten = conversation(3)
    rewritten[4]["content"][1]["text"] = "<system-reminder>rewritten</system-reminder>"  # the last turn of `first`
    again = cached_render(adapter, request(rewritten))
    assert list(again.token_ids) == list(adapter.render(request=request(rewritten)).token_ids)
    assistant_end = assistant_boundary(
        first.text, assistant_open="<|im_start|>assistant", turn_end="<|im_end|>", separator="\n"
    )
    assert again.reused == len(qwen3_tokenizer.encode(first.text[:assistant_end]).ids) > 0
    # The last complete turn is further on: the fallback is the shorter cut, not the same.
    assert again.reused < len(qwen3_tokenizer.encode(first.text[: first.text.rindex("<|im_end|>")]).ids)


@pytest.mark.parametrize("thinking", [False, True])
def test_an_entry_extended_from_a_hit_is_the_entry_a_full_search_makes(adapter, thinking):
    """remember() after a hit searches only the ids after the reused ones; the entry (text,
    ids, turn ends, fallback cut) is the one searching the whole prompt gives, turn after
    turn, through a sampled turn spliced in, a rewritten last turn (a fallback hit) and a
    compaction (a miss)."""
    from apps.proxy.prefix_cache import _Entry

    global_cache.clear()
    whole = PrefixCache()

    def req(messages):
        return request(messages, thinking={"type": "adaptive"})

    requests = [req(conversation(turns, thinking=thinking)) for turns in range(6)]
    rewritten = conversation(6, thinking=thinking)
    rewritten[10]["content"][1]["text"] = "<system-reminder>rewritten</system-reminder>"  # the last turn before
    compacted = conversation(7, thinking=thinking)
    compacted[0] = {"role": "user", "content": "Summary of the earlier conversation."}
    # A turn sampled with ids a re-tokenization would not give (the adapter splices them in).
    sampled_text = '<tool_call>\n{"name":  "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
    adapter.parse(token_ids=adapter.encode(sampled_text) + adapter.encode("<|im_end|>"), stopped=True)
    spliced = conversation(7, thinking=thinking) + [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t_x", "name": "Bash", "input": {"command": "ls"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t_x", "content": "a b"}]},
    ]
    sampled_ids = adapter.encode(sampled_text)
    spliced_ids = list(adapter.render(request=req(spliced)).token_ids)
    assert any(spliced_ids[i : i + len(sampled_ids)] == sampled_ids for i in range(len(spliced_ids)))
    assert sampled_ids != adapter.encode(sampled_text.replace(":  ", ": "))  # spliced, not re-tokenized
    after = spliced + [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Thanks; once more."}]
    requests += [req(rewritten), req(compacted), req(conversation(7, thinking=thinking)), req(spliced), req(after)]
    kinds = []
    for req in requests:
        rendered = cached_render(adapter, req)
        assert list(rendered.token_ids) == list(adapter.render(request=req).token_ids)
        kinds.append("miss" if rendered.reused == 0 else "hit")
        remember(adapter, rendered)
        remember(adapter, rendered, cache=whole, incremental=False)
        ours, theirs = global_cache._entries[KEY], whole._entries[KEY]
        assert isinstance(ours, _Entry) and (ours.text, ours.ids, ours.turn_ends, ours.fallback) == (
            theirs.text,
            theirs.ids,
            theirs.turn_ends,
            theirs.fallback,
        )
    assert kinds == ["miss"] + ["hit"] * 5 + ["hit", "miss", "miss", "hit", "hit"], kinds


def test_boundary_is_the_last_completed_assistant_turn():
    text = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n<|im_start|>user\nr<|im_end|>\n<|im_start|>assistant\n"
    end = assistant_boundary(text, assistant_open="<|im_start|>assistant", turn_end="<|im_end|>", separator="\n")
    assert text[:end].endswith("assistant\na<|im_end|>\n")
    assert (
        assistant_boundary(
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n",
            assistant_open="<|im_start|>assistant",
            turn_end="<|im_end|>",
            separator="\n",
        )
        is None
    )


def test_bounded_lru(adapter):
    small = PrefixCache(max_entries=2, max_bytes=10**9)
    turn_end_id, sep = calls._turn_end_ids(adapter, "qwen3")
    rendered = adapter.render(request=request(conversation(2)))
    for i in range(5):
        small.remember(
            key=("k", str(i)),
            family="qwen3",
            text=rendered.text,
            ids=list(rendered.token_ids),
            turn_end_id=turn_end_id,
            separator_ids=sep,
        )
    assert len(small) == 2
    tiny = PrefixCache(max_entries=10, max_bytes=100)
    tiny.remember(
        key=("k",),
        family="qwen3",
        text=rendered.text,
        ids=list(rendered.token_ids),
        turn_end_id=turn_end_id,
        separator_ids=sep,
    )
    assert len(tiny) == 0  # larger than the whole budget: not kept
    other = PrefixCache()
    other.remember(
        key=("k",),
        family="glm-4.5",
        text=rendered.text,
        ids=list(rendered.token_ids),
        turn_end_id=turn_end_id,
        separator_ids=sep,
    )
    assert len(other) == 0  # families without an exact boundary are never cached


def test_chatml_tokenize_matches_plain_encoding_without_splices(adapter):
    text = adapter.render(request=request(conversation(2))).text
    assert chatml_tokenize(adapter=adapter, text=text) == adapter.encode(text)
    assert json.dumps(chatml_tokenize(adapter=adapter, text="")) == "[]"


def test_render_text_is_the_rendered_text(adapter):
    req = request(conversation(3), thinking={"type": "disabled"})
    assert adapter.render_text(request=req) == adapter.render(request=req).text

"""POST /v1/messages, count_tokens and /v1/models through the async views (AsyncClient)."""

from __future__ import annotations

import asyncio
import json

import pytest

from apps.proxy import calls
from apps.proxy.samplers.base import Sampler, SampleRequest, SampleResult
from tests.conftest import make_member
from tests.proxy.conftest import assert_error, call, encode, make_route, scripted

pytestmark = pytest.mark.django_db

TOOL_CALL = (
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls -la", "description": "list"}}\n</tool_call><|im_end|>'
)

# What Claude Code sends (as observed on the wire), trimmed: every field must be accepted.
CLAUDE_CODE_BODY = {
    "model": "claude-sonnet-4-5-20250929",
    "max_tokens": 32000,
    "stream": True,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>be brief</system-reminder>"},
                {"type": "text", "text": "list files", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should run ls.", "signature": "synth.abc"},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt\nb.txt", "is_error": False}
            ],
        },
        {"role": "system", "content": "Mid-conversation system note."},
        {"role": "user", "content": "thanks"},
    ],
    "tools": [
        {
            "name": "Bash",
            "description": "Run a command",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
            "cache_control": {"type": "ephemeral"},
            "eager_input_streaming": True,
        },
        {"name": "Read", "input_schema": {"type": "object", "properties": {}}, "strict": True, "defer_loading": False},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
    ],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": False},
    "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
    "thinking": {"type": "adaptive"},
    "output_config": {"effort": "high"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "cache_control": {"type": "ephemeral"},
    "service_tier": "auto",
    "stop_sequences": [],
    "temperature": 1,
    "container": None,
    "some_future_field": {"x": 1},
}
CC_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27",
    "x-app": "cli",
    "x-claude-code-session-id": "3f1c0d52-0000-4000-8000-000000000001",
}


@pytest.fixture
def alice():
    return make_member("team", "alice")


def test_text_message(alice, qwen3_tokenizer):
    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "Hello there!<|im_end|>"))
    r = call(
        "/v1/messages",
        secret=alice.secret,
        body={"model": "qwen3-test", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status == 200, r.body
    msg = r.json()
    assert msg["id"].startswith("msg_") and msg["type"] == "message" and msg["role"] == "assistant"
    assert msg["content"] == [{"type": "text", "text": "Hello there!"}]
    assert msg["stop_reason"] == "end_turn" and msg["stop_sequence"] is None
    assert msg["usage"]["output_tokens"] == 4
    assert r.headers["request-id"].startswith("req_")


def test_stream_tool_use_then_text(alice, qwen3_tokenizer):
    make_route(
        backend="scripted",
        config=scripted(qwen3_tokenizer, "Let me look.\n" + TOOL_CALL, "Two files: a.txt and b.txt.<|im_end|>"),
    )
    body = {
        "model": "qwen3-test",
        "max_tokens": 200,
        "stream": True,
        "tools": CLAUDE_CODE_BODY["tools"][:1],
        "messages": [{"role": "user", "content": "list files"}],
    }
    r = call("/v1/messages?beta=true", secret=alice.secret, body=body)
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    events = r.events()
    names = [e for e, _ in events if e != "ping"]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["usage"]["input_tokens"] > 0
    text_delta = events[2][1]["delta"]
    assert text_delta == {"type": "text_delta", "text": "Let me look."}
    tool_start = events[4][1]["content_block"]
    assert tool_start["type"] == "tool_use" and tool_start["name"] == "Bash" and tool_start["input"] == {}
    assert tool_start["id"].startswith("toolu_")
    partial = "".join(
        d["delta"]["partial_json"] for e, d in events if d.get("delta", {}).get("type") == "input_json_delta"
    )
    assert json.loads(partial) == {"command": "ls -la", "description": "list"}
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert delta["usage"]["output_tokens"] == len(encode(qwen3_tokenizer, "Let me look.\n" + TOOL_CALL))

    # The tool loop continues: the result goes back, the model answers in text.
    body["messages"] += [
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Let me look."}, {**tool_start, "input": json.loads(partial)}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_start["id"], "content": "a.txt\nb.txt"}],
        },
    ]
    r2 = call("/v1/messages?beta=true", secret=alice.secret, body=body)
    text = "".join(d["delta"]["text"] for e, d in r2.events() if d.get("delta", {}).get("type") == "text_delta")
    assert text == "Two files: a.txt and b.txt."
    assert r2.events()[-2][1]["delta"]["stop_reason"] == "end_turn"


def test_stream_thinking_block_and_long_text_chunks(alice, qwen3_tokenizer):
    long_text = "word " * 200
    make_route(
        backend="scripted",
        config=scripted(qwen3_tokenizer, f"<think>\nLet me think.\n</think>\n\n{long_text}<|im_end|>"),
    )
    r = call(
        "/v1/messages",
        secret=alice.secret,
        body={
            "model": "qwen3-test",
            "max_tokens": 1000,
            "stream": True,
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "messages": [{"role": "user", "content": "think"}],
        },
    )
    events = [(e, d) for e, d in r.events() if e != "ping"]
    assert events[1][1]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    deltas = [d["delta"] for e, d in events if e == "content_block_delta" and d["index"] == 0]
    assert deltas[0] == {"type": "thinking_delta", "thinking": "Let me think."}
    assert deltas[-1]["type"] == "signature_delta" and deltas[-1]["signature"].startswith("synth.")
    text_parts = [d["delta"]["text"] for e, d in events if e == "content_block_delta" and d["index"] == 1]
    assert len(text_parts) > 1 and "".join(text_parts) == long_text


def test_pings_while_the_sampler_works(alice, qwen3_tokenizer, monkeypatch, settings):
    class SlowSampler(Sampler):
        async def sample(self, request: SampleRequest) -> SampleResult:
            await asyncio.sleep(0.35)
            ids = encode(qwen3_tokenizer, "done<|im_end|>")
            return SampleResult(token_ids=ids, logprobs=[-0.1] * len(ids), finish="stop", snapshot={"slow": True})

    async def slow(*, route, snapshot):
        return SlowSampler()

    monkeypatch.setattr(calls, "sampler_get", slow)
    settings.SYNTH_PROXY_PING_SECONDS = 0.05
    make_route()
    r = call(
        "/v1/messages",
        secret=alice.secret,
        body={"model": "qwen3-test", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "x"}]},
    )
    names = [e for e, _ in r.events()]
    assert names[0] == "message_start"
    assert names.count("ping") >= 3
    first_content = names.index("content_block_start")
    assert all(n == "ping" for n in names[1:first_content])


def test_claude_code_request_is_accepted(alice, qwen3_tokenizer):
    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "You're welcome.<|im_end|>"))
    r = call("/v1/messages?beta=true", secret=alice.secret, body=CLAUDE_CODE_BODY, headers=CC_HEADERS)
    assert r.status == 200, r.body
    events = r.events()
    assert events[0][1]["message"]["model"] == CLAUDE_CODE_BODY["model"]  # echoes the name sent
    assert events[-1][0] == "message_stop"
    # count_tokens accepts the same body (what /context sends).
    body = {k: v for k, v in CLAUDE_CODE_BODY.items() if k not in ("max_tokens", "stream")}
    c = call("/v1/messages/count_tokens?beta=true", secret=alice.secret, body=body, headers=CC_HEADERS)
    assert c.status == 200 and c.json()["input_tokens"] == events[0][1]["message"]["usage"]["input_tokens"]


def test_count_tokens_is_exact(alice, qwen3_tokenizer):
    make_route()
    body = {"model": "qwen3-test", "system": "Be terse.", "messages": [{"role": "user", "content": "Hello, world!"}]}
    r = call("/v1/messages/count_tokens", secret=alice.secret, body=body)
    assert r.status == 200
    expected = encode(
        qwen3_tokenizer,
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHello, world!<|im_end|>\n<|im_start|>assistant\n",
    )
    assert r.json() == {"input_tokens": len(expected)}


def test_stop_sequences_cut_the_text(alice, qwen3_tokenizer):
    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "one two STOP three four<|im_end|>"))
    r = call(
        "/v1/messages",
        secret=alice.secret,
        body={
            "model": "qwen3-test",
            "max_tokens": 50,
            "stop_sequences": ["STOP"],
            "messages": [{"role": "user", "content": "count"}],
        },
    )
    msg = r.json()
    assert msg["stop_reason"] == "stop_sequence" and msg["stop_sequence"] == "STOP"
    assert msg["content"] == [{"type": "text", "text": "one two "}]
    assert msg["usage"]["output_tokens"] < len(encode(qwen3_tokenizer, "one two STOP three four<|im_end|>"))


def test_max_tokens_is_clamped_to_the_route_and_zero_samples_nothing(alice, qwen3_tokenizer, monkeypatch):
    seen: list[SampleRequest] = []

    class Recording(Sampler):
        async def sample(self, request: SampleRequest) -> SampleResult:
            seen.append(request)
            return SampleResult(token_ids=[request.stop_token_ids[0]], logprobs=[0.0], finish="stop")

    async def recording(*, route, snapshot):
        return Recording()

    monkeypatch.setattr(calls, "sampler_get", recording)
    make_route(max_output=256)
    body = {"model": "qwen3-test", "max_tokens": 32000, "messages": [{"role": "user", "content": "x"}]}
    assert call("/v1/messages", secret=alice.secret, body=body).status == 200
    assert seen[0].max_tokens == 256 and seen[0].temperature == 1.0
    r = call("/v1/messages", secret=alice.secret, body={**body, "max_tokens": 0})
    assert r.status == 200 and r.json()["content"] == [] and r.json()["stop_reason"] == "max_tokens"
    assert len(seen) == 1
    r = call("/v1/messages", secret=alice.secret, body={**body, "max_tokens": 0, "stream": True})
    assert [e for e, _ in r.events()] == ["message_start", "message_delta", "message_stop"]


def test_truncated_turn_is_max_tokens(alice, qwen3_tokenizer):
    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "a b c d e f g h i j k l m n o p"))
    r = call(
        "/v1/messages",
        secret=alice.secret,
        body={"model": "qwen3-test", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
    )
    msg = r.json()
    assert msg["stop_reason"] == "max_tokens" and msg["usage"]["output_tokens"] == 5


def test_models_list_and_detail(alice):
    make_route("qwen3-a")
    make_route("qwen3-b")
    make_route("qwen3-off", inference_enabled=False)
    r = call("/v1/models", secret=alice.secret, method="get")
    assert r.status == 200
    data = r.json()
    assert [m["id"] for m in data["data"]] == ["qwen3-a", "qwen3-b"]
    assert data["data"][0]["type"] == "model" and data["has_more"] is False and data["first_id"] == "qwen3-a"
    d = call("/v1/models/qwen3-b", secret=alice.secret, method="get")
    assert d.status == 200 and d.json()["id"] == "qwen3-b"
    assert_error(call("/v1/models/qwen3-off", secret=alice.secret, method="get"), 404, "not_found_error")


def test_sampler_failure_after_200_is_an_error_event(alice, monkeypatch):
    from apps.proxy.samplers.factory import SamplerUnavailable

    class Down(Sampler):
        async def sample(self, request: SampleRequest) -> SampleResult:
            raise SamplerUnavailable("connection refused")

    async def down(*, route, snapshot):
        return Down()

    monkeypatch.setattr(calls, "sampler_get", down)
    make_route()
    body = {"model": "qwen3-test", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
    assert_error(call("/v1/messages", secret=alice.secret, body=body), 529, "overloaded_error")
    r = call("/v1/messages", secret=alice.secret, body={**body, "stream": True})
    assert r.status == 200
    last_event, last = r.events()[-1]
    assert last_event == "error" and last["error"]["type"] == "overloaded_error"


def test_a_small_body_is_rendered_on_the_event_loop_and_a_large_one_in_the_pool(alice, qwen3_tokenizer, monkeypatch):
    import threading

    from apps.proxy.exchange import INLINE_BODY_BYTES

    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "ok<|im_end|>", "ok<|im_end|>"))
    rendered_on: list[tuple[bool, str]] = []  # (on an event loop's thread, the thread's name)
    prepare = calls._prepare_sync

    def spied(**kwargs):
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        rendered_on.append((on_loop, threading.current_thread().name))
        return prepare(**kwargs)

    monkeypatch.setattr(calls, "_prepare_sync", spied)
    small = {"model": "qwen3-test", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
    large = {**small, "messages": [{"role": "user", "content": "word " * (INLINE_BODY_BYTES // 4)}]}
    assert len(json.dumps(large)) > INLINE_BODY_BYTES >= len(json.dumps(small))
    for body in (small, large):
        r = call("/v1/messages", secret=alice.secret, body=body)
        assert r.status == 200 and r.json()["content"] == [{"type": "text", "text": "ok"}], r.body
    # The small one where its body was decoded (no thread hop); the large one off the loop,
    # so that one long conversation cannot hold up every stream.
    assert rendered_on[0][0] is True
    assert rendered_on[1][0] is False and rendered_on[1][1].startswith("proxy-cpu")

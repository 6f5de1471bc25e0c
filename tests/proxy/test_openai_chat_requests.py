"""POST /v1/chat/completions through the async views (AsyncClient): what the translation
accepts, refuses (OpenAI's 400 naming the field) and sends to the model, SSE framing,
keepalives and errors after the 200."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest

from apps.proxy import calls
from apps.proxy.models import Interaction
from apps.proxy.openai import chat
from apps.proxy.openai.chat_request import chat_request_parse
from apps.proxy.samplers.base import Sampler, SampleRequest, SampleResult
from tests.conftest import make_member
from tests.proxy.conftest import Reply, call, encode, make_route, scripted

pytestmark = pytest.mark.django_db

PATH = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(64)).decode()


@pytest.fixture
def alice():
    return make_member("team", "alice")


def data_events(reply: Reply) -> list[Any]:
    """The `data:` payloads of an SSE body (comments skipped), [DONE] as the string."""
    out: list[Any] = []
    for chunk in reply.body.decode().split("\n\n"):
        lines = [line for line in chunk.splitlines() if line.startswith("data: ")]
        for line in lines:
            payload = line[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def assert_openai_error(reply: Reply, status: int, param: str | None = None) -> dict[str, Any]:
    assert reply.status == status, reply.body
    body = reply.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    if param is not None:
        assert body["error"]["param"] == param, body
    return body["error"]


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user"}]}, "messages.0.content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
            "messages.0.content.0.type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]}]},
            "messages.0.content.0.image_url.url",
        ),
        (
            {
                "messages": [
                    *USER,
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}],
                    },
                ]
            },
            "messages.1.tool_calls.0.function.arguments",
        ),
        ({"messages": [*USER, {"role": "tool", "content": "x"}]}, "messages.1.tool_call_id"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools.0.function.name"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": "5"}, "max_completion_tokens"),
        ({"temperature": 2.5}, "temperature"),
        ({"n": 3}, "n"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"stop": 5}, "stop"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
        ({"model": ""}, "model"),
    ],
)
def test_malformed_requests_are_openai_400s(alice, extra, param):
    make_route()
    body = {"model": "qwen3-test", "messages": USER, **extra}
    error = assert_openai_error(call(PATH, secret=alice.secret, body=body), 400, param)
    assert error["type"] == "invalid_request_error" and error["message"].startswith(param)


def test_translation_to_the_internal_request():
    request = chat_request_parse(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "S"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "hmm",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
                        {"id": "c2", "type": "function", "function": {"name": "f", "arguments": ""}},
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "one"},
                {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "two"}]},
                {"role": "user", "content": "next"},
                {"role": "developer", "content": "later note"},
            ],
            "tools": [{"type": "function", "function": {"name": "f", "strict": True}}],
            "tool_choice": "required",
            "stop": "END",
            "max_completion_tokens": 50,
            "max_tokens": 10,
            "temperature": 1.5,
            "seed": 3,
            "user": "u1",
            "parallel_tool_calls": False,
            "some_future_field": {"x": 1},
        }
    )
    assert request["system"] == [{"type": "text", "text": "S"}]
    user, assistant, results, note = request["messages"]
    assert user["content"][1] == {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    assert assistant["content"] == [
        {"type": "thinking", "thinking": "hmm"},
        {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}},
        {"type": "tool_use", "id": "c2", "name": "f", "input": {}},
    ]
    # Both tool results and the user text after them are one user turn, in order.
    assert [b["type"] for b in results["content"]] == ["tool_result", "tool_result", "text"]
    assert note == {"role": "system", "content": [{"type": "text", "text": "later note"}]}
    assert request["tools"] == [{"name": "f", "input_schema": {"type": "object", "properties": {}}}]
    assert request["tool_choice"] == {"type": "any"}
    assert request["stop_sequences"] == ["END"] and request["max_tokens"] == 50  # max_completion_tokens wins
    assert (request["temperature"], request["seed"], request["metadata"]) == (1.5, 3, {"user": "u1"})
    assert chat_request_parse({"model": "m", "messages": USER})["max_tokens"] is None


def test_absent_max_tokens_is_the_routes_limit_and_seed_reaches_the_sampler(alice, qwen3_tokenizer):
    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "ok<|im_end|>"), max_output=300)
    reply = call(PATH, secret=alice.secret, body={"model": "qwen3-test", "messages": USER, "seed": 11})
    assert reply.status == 200, reply.body
    assert reply.json()["choices"][0]["message"]["content"] == "ok"
    from apps.proxy.samplers.factory import sampler_build

    # The route's sampler, as the proxy built it (cached by backend and config).
    sampler = sampler_build(backend="scripted", config=scripted(qwen3_tokenizer, "ok<|im_end|>"))
    assert [(r.seed, r.max_tokens) for r in sampler.requests] == [(11, 300)]
    interaction = Interaction.objects.get()
    assert interaction.payload["sampling"]["max_tokens"] == 300
    assert interaction.payload["sampling"]["max_tokens_requested"] is None
    assert interaction.payload["sampling"]["seed"] == 11


def test_stop_sequence_cuts_the_text_and_finishes_stop(alice, qwen3_tokenizer):
    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "one two END three<|im_end|>"))
    reply = call(PATH, secret=alice.secret, body={"model": "qwen3-test", "messages": USER, "stop": ["END"]})
    choice = reply.json()["choices"][0]
    assert choice["message"]["content"] == "one two " and choice["finish_reason"] == "stop"


def test_max_tokens_reached_finishes_length(alice, qwen3_tokenizer):
    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "a b c d e f g h<|im_end|>"))
    reply = call(PATH, secret=alice.secret, body={"model": "qwen3-test", "messages": USER, "max_tokens": 3})
    body = reply.json()
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 3


def test_stream_framing_without_usage(alice, qwen3_tokenizer):
    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "Hello.<|im_end|>"))
    reply = call(PATH, secret=alice.secret, body={"model": "qwen3-test", "messages": USER, "stream": True})
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/event-stream")
    events = data_events(reply)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "Hello."
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}


def test_keepalive_comments_while_the_sampler_works(alice, qwen3_tokenizer, monkeypatch, settings):
    keepalives = 0
    enough = asyncio.Event()
    original = chat._ChatStream.keepalive

    def counting(self):  # type: ignore[no-untyped-def]
        nonlocal keepalives
        keepalives += 1
        if keepalives == 3:
            enough.set()
        return original(self)

    class WaitingSampler(Sampler):
        async def sample(self, request: SampleRequest) -> SampleResult:
            await enough.wait()  # answers only once three keepalives went out
            ids = encode(qwen3_tokenizer, "done<|im_end|>")
            return SampleResult(token_ids=ids, logprobs=[-0.1] * len(ids), finish="stop", snapshot={})

    async def waiting(*, route, snapshot):
        return WaitingSampler()

    monkeypatch.setattr(chat._ChatStream, "keepalive", counting)
    monkeypatch.setattr(calls, "sampler_get", waiting)
    settings.SYNTH_PROXY_PING_SECONDS = 0.01
    make_route()
    reply = call(PATH, secret=alice.secret, body={"model": "qwen3-test", "messages": USER, "stream": True})
    frames = [f for f in reply.body.decode().split("\n\n") if f]
    assert frames[1:4] == [": keepalive"] * 3
    assert data_events(reply)[-1] == "[DONE]"


def test_sampler_failure_is_a_503_or_an_error_chunk_after_200(alice, monkeypatch):
    from apps.proxy.samplers.factory import SamplerUnavailable

    class Down(Sampler):
        async def sample(self, request: SampleRequest) -> SampleResult:
            raise SamplerUnavailable("connection refused")

    async def down(*, route, snapshot):
        return Down()

    monkeypatch.setattr(calls, "sampler_get", down)
    make_route()
    body = {"model": "qwen3-test", "messages": USER}
    reply = call(PATH, secret=alice.secret, body=body)
    assert assert_openai_error(reply, 503)["code"] == "overloaded" and reply.headers["retry-after"]
    reply = call(PATH, secret=alice.secret, body={**body, "stream": True})
    assert reply.status == 200
    events = data_events(reply)
    assert events[-1] == "[DONE]" and events[-2]["error"]["type"] == "server_error"
    assert Interaction.objects.filter(protocol="chat", delivery="failed").count() == 2

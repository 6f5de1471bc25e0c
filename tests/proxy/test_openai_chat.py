"""The official openai SDK against POST /v1/chat/completions and /v1/models, live (uvicorn)."""

from __future__ import annotations

import json
import socket
import threading
import time

import anthropic
import openai
import pytest

from apps.proxy import calls, capture
from apps.proxy.adapters.registry import adapter_for
from apps.proxy.models import Delivery, Interaction
from apps.proxy.samplers.factory import sampler_build
from tests.conftest import make_member
from tests.proxy.conftest import encode, issue, make_route, scripted

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BASH = {
    "type": "function",
    "function": {
        "name": "Bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        "strict": True,
    },
}
TOOL_CALL = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'
THOUGHT = "<think>\nThe user wants the files.\n</think>\n\n"


@pytest.fixture
def member(live_server_asgi):
    return make_member("team", "alice")


def client(server, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=secret, max_retries=0, timeout=60)


def settled(request_id: str) -> Interaction:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        interaction = Interaction.objects.filter(request_id=request_id).first()
        if interaction is not None and interaction.delivery != Delivery.PENDING:
            return interaction
        time.sleep(0.05)
    raise AssertionError(f"interaction of {request_id} never settled")


def rerendered(interaction: Interaction) -> tuple[list[int], list[int]]:
    payload = capture.staged_payload(interaction=interaction)
    request = json.loads(payload["request_json"])
    return list(adapter_for("qwen3").render(request=request).token_ids), payload["prompt_ids"]


def test_plain_streamed_tool_call_and_tool_result_turns(live_server_asgi, member, qwen3_tokenizer):
    make_route(
        "qwen3-chat",
        backend="scripted",
        config=scripted(
            qwen3_tokenizer,
            "Hello there.<|im_end|>",
            THOUGHT + "I'll list them.\n" + TOOL_CALL,
            "There are two files: a.txt and b.txt.<|im_end|>",
            "Streamed answer.<|im_end|>",
        ),
    )
    secret = issue(member.org, "qwen3-chat", trial="trl_chat", run="run_chat")
    sdk = client(live_server_asgi, secret)

    # Plain.
    plain = sdk.chat.completions.with_raw_response.create(
        model="qwen3-chat",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_tokens=64,
        temperature=0.2,
        seed=7,
    )
    first = plain.parse()
    assert first.object == "chat.completion" and first.id.startswith("chatcmpl-")
    assert first.model == "qwen3-chat" and first.choices[0].finish_reason == "stop"
    assert first.choices[0].message.content == "Hello there." and first.choices[0].message.tool_calls is None
    assert first.usage.completion_tokens == len(encode(qwen3_tokenizer, "Hello there.<|im_end|>"))
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    row = settled(plain.headers["x-request-id"])
    assert row.protocol == "chat" and not row.stream and row.trial_id == "trl_chat"
    assert row.payload["sampling"]["seed"] == 7 and row.payload["sampling"]["temperature"] == 0.2
    assert rerendered(row)[0] == rerendered(row)[1]

    # Streamed, with a function tool: reasoning, content and tool-call deltas, usage chunk, [DONE].
    messages = [{"role": "user", "content": "What files are here?"}]
    stream = sdk.chat.completions.create(
        model="qwen3-chat",
        messages=messages,
        tools=[BASH],
        tool_choice="auto",
        parallel_tool_calls=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning == "The user wants the files." and content == "I'll list them."
    call_deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert call_deltas[0].id and call_deltas[0].function.name == "Bash" and call_deltas[0].type == "function"
    arguments = "".join(d.function.arguments or "" for d in call_deltas)
    assert json.loads(arguments) == {"command": "ls"}
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(
        encode(qwen3_tokenizer, THOUGHT + "I'll list them.\n" + TOOL_CALL)
    )
    streamed = Interaction.objects.filter(protocol="chat", stream=True).get()
    streamed = settled(streamed.request_id)
    assert streamed.delivery == Delivery.DELIVERED and streamed.stop_reason == "tool_use"

    # The tool-result turn: the assistant's tool call (arguments as JSON text) and the result.
    messages += [
        {
            "role": "assistant",
            "content": content,
            "reasoning_content": reasoning,
            "tool_calls": [
                {
                    "id": call_deltas[0].id,
                    "type": "function",
                    "function": {"name": "Bash", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_deltas[0].id, "content": "a.txt\nb.txt"},
    ]
    third = sdk.chat.completions.with_raw_response.create(model="qwen3-chat", messages=messages, tools=[BASH])
    answer = third.parse()
    assert answer.choices[0].message.content == "There are two files: a.txt and b.txt."
    row = settled(third.headers["x-request-id"])
    ids, prompt_ids = rerendered(row)
    assert ids == prompt_ids
    # The sampled tool-call turn is in the next prompt as the ids that were sampled.
    sampled = capture.staged_payload(interaction=streamed)["output_ids"]
    assert any(prompt_ids[i : i + len(sampled) - 1] == sampled[:-1] for i in range(len(prompt_ids)))

    # The SDK's stream helper accumulates the same deltas.
    with sdk.chat.completions.stream(model="qwen3-chat", messages=[{"role": "user", "content": "x"}]) as helper:
        for _ in helper:
            pass
        final = helper.get_final_completion()
    assert final.choices[0].message.content == "Streamed answer."


def test_tool_call_without_text_has_null_content(live_server_asgi, member, qwen3_tokenizer):
    make_route("qwen3-calls", backend="scripted", config=scripted(qwen3_tokenizer, TOOL_CALL))
    sdk = client(live_server_asgi, issue(member.org, "qwen3-calls"))
    reply = sdk.chat.completions.create(
        model="gpt-4o",  # a scoped credential serves its own route whatever the name
        messages=[{"role": "user", "content": "ls please"}],
        tools=[BASH],
        tool_choice={"type": "function", "function": {"name": "Bash"}},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert reply.model == "gpt-4o"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("Bash", {"command": "ls"})
    ]


def test_errors_in_openai_shape(live_server_asgi, member):
    make_route("qwen3-small", context_window=600, max_output=100)
    sdk = client(live_server_asgi, member.secret)
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert missing.value.code == "model_not_found"
    assert missing.value.body["message"] == "The model `gpt-4o` does not exist or you do not have access to it."
    with pytest.raises(openai.AuthenticationError) as bad_key:
        client(live_server_asgi, "syn_wrong_secret").chat.completions.create(
            model="qwen3-small", messages=[{"role": "user", "content": "x"}]
        )
    assert bad_key.value.code == "invalid_api_key"
    with pytest.raises(openai.BadRequestError) as malformed:
        sdk.chat.completions.create(
            model="qwen3-small",
            messages=[
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": "{"}}],
                },
            ],
        )
    body = malformed.value.body
    assert set(body) == {"message", "type", "param", "code"} and body["type"] == "invalid_request_error"
    assert body["param"] == "messages.1.tool_calls.0.function.arguments" and "not valid JSON" in body["message"]
    with pytest.raises(openai.BadRequestError) as too_long:
        sdk.chat.completions.create(model="qwen3-small", messages=[{"role": "user", "content": "word " * 3000}])
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="only n=1"):
        sdk.chat.completions.create(model="qwen3-small", messages=[{"role": "user", "content": "x"}], n=2)
    with pytest.raises(openai.BadRequestError, match="response_format"):
        sdk.chat.completions.create(
            model="qwen3-small", messages=[{"role": "user", "content": "x"}], response_format={"type": "json_object"}
        )


def test_models_list_and_retrieve_parse_in_both_sdks(live_server_asgi, member):
    make_route("qwen3-a")
    make_route("qwen3-b")
    oai = client(live_server_asgi, member.secret)
    listed = list(oai.models.list())
    assert [m.id for m in listed] == ["qwen3-a", "qwen3-b"]
    assert all(m.object == "model" and m.owned_by == "synth" and isinstance(m.created, int) for m in listed)
    assert oai.models.retrieve("qwen3-b").id == "qwen3-b"
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("nope")
    ant = anthropic.Anthropic(base_url=live_server_asgi.url, api_key=member.secret, max_retries=0, timeout=60)
    assert [m.id for m in ant.models.list()] == ["qwen3-a", "qwen3-b"]
    assert ant.models.retrieve("qwen3-a").display_name == "qwen3-a"
    with pytest.raises(anthropic.NotFoundError):
        ant.models.retrieve("nope")


def test_a_client_that_disconnects_cancels_its_generation(live_proxy):
    """As on /v1/messages: a client leaving mid-generation stops the model and the call is
    recorded as abandoned."""
    member = make_member("team", "alice")
    route = make_route("qwen3-local", backend="local", config={"tiny": True, "family": "qwen3", "seed": 0})
    sampler = sampler_build(backend="local", config=calls.sampler_config(route=route, snapshot=""))
    forwards = 0
    third, proceed = threading.Event(), threading.Event()

    def hook(module, args, output):  # type: ignore[no-untyped-def]
        nonlocal forwards
        forwards += 1
        if forwards == 3:
            third.set()
            proceed.wait(60)

    handle = sampler.model.register_forward_hook(hook)
    try:
        body = json.dumps(
            {"model": "qwen3-local", "max_tokens": 256, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        ).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {issue(member.org, 'qwen3-local')}\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        sock = socket.create_connection(("127.0.0.1", live_proxy.port))
        sock.sendall(head + body)
        assert third.wait(60), "the generation did not start"
        sock.close()
        deadline = time.monotonic() + 60
        while not Interaction.objects.filter(delivery=Delivery.CLIENT_DISCONNECTED, protocol="chat").exists():
            assert time.monotonic() < deadline, "the proxy never noticed the client leave"
            time.sleep(0.05)
        proceed.set()
        sampler._executor.submit(lambda: None).result(timeout=60)
        assert forwards == 3
    finally:
        proceed.set()
        handle.remove()

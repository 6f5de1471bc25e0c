"""The real Anthropic Python SDK against the proxy served by uvicorn (ASGI), live."""

from __future__ import annotations

import json
import time

import anthropic
import pytest

from apps.proxy import capture
from apps.proxy.models import Delivery, Eligibility, Integrity, Interaction
from tests.conftest import make_member
from tests.proxy.conftest import encode, issue, make_route, scripted

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BASH = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}
TOOL_CALL = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'


@pytest.fixture
def member(live_server_asgi):
    return make_member("team", "alice")


def client(server, secret: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=secret, max_retries=0, timeout=60)


def wait_settled(request_id: str) -> Interaction:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        interaction = Interaction.objects.filter(request_id=request_id).first()
        if interaction is not None and interaction.delivery != Delivery.PENDING:
            return interaction
        time.sleep(0.05)
    raise AssertionError(f"interaction of {request_id} never settled")


def test_tool_loop_streaming_and_not(live_server_asgi, member, qwen3_tokenizer):
    make_route(
        "qwen3-script",
        backend="scripted",
        config=scripted(qwen3_tokenizer, "I'll list them.\n" + TOOL_CALL, "There are two files.<|im_end|>", TOOL_CALL),
    )
    secret = issue(member.org, "qwen3-script", trial="trl_sdk", run="run_sdk")
    sdk = client(live_server_asgi, secret)
    messages = [{"role": "user", "content": "What files are here?"}]

    with sdk.messages.stream(model="claude-sonnet-4-5", max_tokens=256, tools=[BASH], messages=messages) as stream:
        kinds = [event.type for event in stream]
        first = stream.get_final_message()
    assert "content_block_delta" in kinds and kinds[-1] == "message_stop"
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["text", "tool_use"]
    tool_use = first.content[1]
    assert tool_use.name == "Bash" and tool_use.input == {"command": "ls"} and tool_use.id.startswith("toolu_")
    assert first.usage.output_tokens == len(encode(qwen3_tokenizer, "I'll list them.\n" + TOOL_CALL))

    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "a.txt\nb.txt"}]},
    ]
    second = sdk.messages.create(model="claude-sonnet-4-5", max_tokens=256, tools=[BASH], messages=messages)
    assert second.stop_reason == "end_turn"
    assert second.content[0].type == "text" and second.content[0].text == "There are two files."
    # Claude Code's path: the beta client posts to /v1/messages?beta=true
    third = sdk.beta.messages.create(model="haiku", max_tokens=256, tools=[BASH], messages=messages)
    assert third.content[0].type == "tool_use"

    rows = list(Interaction.objects.order_by("id"))
    assert len(rows) == 3 and all(r.trial_id == "trl_sdk" and r.route.name == "qwen3-script" for r in rows)
    settled = wait_settled(rows[1].request_id)  # a non-streamed JSON: settled by response.close()
    assert settled.delivery == Delivery.DELIVERED and settled.eligibility == Eligibility.ELIGIBLE
    assert rows[0].stream and not rows[1].stream
    # The third call extends the second: its prompt reused the cached prefix, exactly.
    payload = capture.staged_payload(interaction=rows[2])
    assert payload["prompt_reused_ids"] > 0
    from apps.proxy.adapters.registry import adapter_for

    assert (
        list(adapter_for("qwen3").render(request=json.loads(payload["request_json"])).token_ids)
        == payload["prompt_ids"]
    )


def test_tiny_local_model_plain_text(live_server_asgi, member):
    make_route("qwen3-tiny", backend="local", config={"family": "qwen3", "tiny": True, "seed": 0})
    sdk = client(live_server_asgi, member.secret)
    message = sdk.messages.create(
        model="qwen3-tiny",
        max_tokens=12,
        thinking={"type": "disabled"},
        messages=[{"role": "user", "content": "Say hello."}],
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert 0 < message.usage.output_tokens <= 12 and message.usage.input_tokens > 5
    interaction = wait_settled(message._request_id)
    payload = interaction.payload
    assert payload["snapshot"]["backend"] == "local" and payload["snapshot"]["model"].startswith("tiny-random-qwen3")
    assert len(payload["logprobs"]) == len(payload["output_ids"]) == message.usage.output_tokens
    assert all(lp is not None and lp <= 0 for lp in payload["logprobs"])
    assert interaction.integrity == Integrity.STAGED  # publication is the evidence worker's job


def test_count_tokens_models_and_errors(live_server_asgi, member):
    make_route("qwen3-a", context_window=600, max_output=100)
    make_route("qwen3-b")
    sdk = client(live_server_asgi, member.secret)
    count = sdk.messages.count_tokens(model="qwen3-a", messages=[{"role": "user", "content": "Hello, world!"}])
    assert count.input_tokens > 5
    assert [m.id for m in sdk.models.list()] == ["qwen3-a", "qwen3-b"]
    assert sdk.models.retrieve("qwen3-b").id == "qwen3-b"

    with pytest.raises(anthropic.BadRequestError) as too_long:
        sdk.messages.create(model="qwen3-a", max_tokens=100, messages=[{"role": "user", "content": "word " * 3000}])
    assert (
        "prompt is too long" in too_long.value.message
        and too_long.value.body["error"]["type"] == "invalid_request_error"
    )
    with pytest.raises(anthropic.NotFoundError):
        sdk.messages.create(model="gpt-4o", max_tokens=10, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.AuthenticationError):
        client(live_server_asgi, "syn_wrong_secret").models.list()
    scoped = client(live_server_asgi, issue(member.org, "qwen3-a"))
    with pytest.raises(anthropic.PermissionDeniedError):
        scoped.messages.create(model="qwen3-b", max_tokens=10, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError):
        sdk.messages.create(model="qwen3-b", max_tokens=-1, messages=[{"role": "user", "content": "x"}])


def test_concurrent_streams(live_server_asgi, member, qwen3_tokenizer):
    import asyncio

    make_route(
        "qwen3-many", backend="scripted", config={**scripted(qwen3_tokenizer, "Done here.<|im_end|>"), "cycle": True}
    )
    secret = issue(member.org, "qwen3-many")

    async def one(sdk: anthropic.AsyncAnthropic, i: int) -> str:
        async with sdk.messages.stream(
            model="sonnet",
            max_tokens=20,
            messages=[{"role": "user", "content": f"job {i}"}],
            extra_headers={"x-claude-code-session-id": f"s{i}"},
        ) as stream:
            return await stream.get_final_text()

    async def many() -> list[str]:
        sdk = anthropic.AsyncAnthropic(base_url=live_server_asgi.url, api_key=secret, max_retries=0, timeout=60)
        return await asyncio.gather(*(one(sdk, i) for i in range(12)))

    assert asyncio.run(many()) == ["Done here."] * 12
    deadline = time.monotonic() + 10
    while Interaction.objects.filter(delivery=Delivery.DELIVERED).count() < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Interaction.objects.filter(delivery=Delivery.DELIVERED).count() == 12
    assert sorted(Interaction.objects.values_list("session_id", flat=True)) == sorted(f"s{i}" for i in range(12))

"""The official openai Python SDK's Responses API against the proxy served by uvicorn, live.

A scripted sampler emits Qwen3's native markup, so each test knows the ids that were sampled
and can check what the next prompt holds: Qwen3's template is append-only inside a tool loop
(reasoning after the last user query is kept), so turn N+1's captured prompt starts with
turn N's prompt followed by exactly the ids turn N sampled.
"""

from __future__ import annotations

import json
import time
from typing import Any

import openai
import pytest

from apps.proxy import capture
from apps.proxy.adapters.registry import adapter_for
from apps.proxy.models import Delivery, Interaction
from tests.conftest import make_member
from tests.proxy.conftest import encode, issue, make_route, scripted

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a shell command.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
PATCH = '*** Begin Patch\n*** Add File: a.txt\n+hello "world"\n+\ttabbed\n*** End Patch'
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files with a patch. This is a FREEFORM tool.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" LF hunk+ "*** End Patch"'},
}
CALL_EXEC = (
    "<think>\nI should look first.\n</think>\n\n"
    '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "ls -a"}}\n</tool_call><|im_end|>'
)
CALL_PATCH = (
    "<think>\nNow write the file.\n</think>\n\n"
    '<tool_call>\n{"name": "apply_patch", "arguments": {"input": ' + json.dumps(PATCH) + "}}\n</tool_call><|im_end|>"
)
ANSWER = "<think>\nAll written.\n</think>\n\nDone: a.txt is written.<|im_end|>"


@pytest.fixture
def member(live_server_asgi):
    return make_member("team", "alice")


def client(server, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=secret, max_retries=0, timeout=60)


def settled(request_id: str) -> Interaction:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        interaction = Interaction.objects.filter(request_id=request_id).first()
        if interaction is not None and interaction.delivery != Delivery.PENDING:
            return interaction
        time.sleep(0.05)
    raise AssertionError(f"interaction of {request_id} never settled")


def payloads() -> list[dict[str, Any]]:
    return [capture.staged_payload(interaction=i) for i in Interaction.objects.order_by("id")]


def as_input(items: list[Any]) -> list[dict[str, Any]]:
    """Output items passed back as input, as the SDK's users and Codex do."""
    return [item.model_dump(exclude_none=True) for item in items]


def test_plain_create(live_server_asgi, member, qwen3_tokenizer):
    make_route("qwen3-r", backend="scripted", config=scripted(qwen3_tokenizer, "Hello there.<|im_end|>"))
    secret = issue(member.org, "qwen3-r", trial="trl_resp", run="run_resp")
    response = client(live_server_asgi, secret).responses.create(
        model="qwen3-r",
        instructions="Be brief.",
        input="Say hello.",
        reasoning={"effort": "none"},
        prompt_cache_key="thread-1",
        metadata={"purpose": "test"},
    )
    assert response.id.startswith("resp_") and response.object == "response" and response.status == "completed"
    assert response.output_text == "Hello there."
    assert [item.type for item in response.output] == ["message"]
    assert response.output[0].role == "assistant" and response.output[0].status == "completed"
    sampled = encode(qwen3_tokenizer, "Hello there.<|im_end|>")
    assert response.usage.output_tokens == len(sampled)
    assert response.usage.output_tokens_details.reasoning_tokens == 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.instructions == "Be brief." and response.metadata == {"purpose": "test"}

    interaction = settled(Interaction.objects.get(route__name="qwen3-r").request_id)
    assert interaction.delivery == Delivery.DELIVERED and interaction.trial_id == "trl_resp"
    assert interaction.protocol == "responses"
    assert interaction.session_id == "thread-1"  # prompt_cache_key keys the session
    (payload,) = payloads()
    assert payload["output_ids"] == sampled and len(payload["prompt_ids"]) == response.usage.input_tokens
    prompt = qwen3_tokenizer.decode(payload["prompt_ids"], skip_special_tokens=False)
    # Instructions are the system prompt; effort "none" turns Qwen3's thinking off.
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSay hello.<|im_end|>\n")
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tool_loop_with_function_and_custom_tools_renders_what_was_sampled(live_server_asgi, member, qwen3_tokenizer):
    """Codex's loop: a function call, then an apply_patch custom call, then the answer; each
    turn passes the previous output back (reasoning only as encrypted_content on the last)."""
    make_route("qwen3-loop", backend="scripted", config=scripted(qwen3_tokenizer, CALL_EXEC, CALL_PATCH, ANSWER))
    sdk = client(live_server_asgi, issue(member.org, "qwen3-loop"))
    common: dict[str, Any] = {
        "model": "qwen3-loop",
        "tools": [EXEC, APPLY_PATCH],
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-loop",
        "store": False,
    }
    conversation: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "You are a coding agent."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context/>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Write a.txt."}]},
    ]
    first = sdk.responses.create(input=conversation, **common)
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    reasoning, call = first.output
    assert reasoning.content[0].text == "I should look first." and reasoning.summary == []
    assert reasoning.encrypted_content and reasoning.encrypted_content.startswith("synth1.")
    assert call.name == "exec_command" and json.loads(call.arguments) == {"cmd": "ls -a"}
    assert call.call_id and call.id.startswith("fc_") and call.status == "completed"

    conversation += as_input(first.output)
    conversation.append({"type": "function_call_output", "call_id": call.call_id, "output": "total 0\n"})
    second = sdk.responses.create(input=conversation, **common)
    assert [item.type for item in second.output] == ["reasoning", "custom_tool_call"]
    patch_call = second.output[1]
    assert patch_call.name == "apply_patch" and patch_call.input == PATCH  # the raw text, multi-line
    assert patch_call.id.startswith("ctc_")

    # Reasoning kept only as encrypted_content (content dropped) must come back exactly.
    back = as_input(second.output)
    del back[0]["content"]
    conversation += back
    conversation.append({"type": "custom_tool_call_output", "call_id": patch_call.call_id, "output": "Success."})
    third = sdk.responses.create(input=conversation, **common)
    assert third.output_text == "Done: a.txt is written." and third.status == "completed"

    p1, p2, p3 = payloads()
    for before, after in ((p1, p2), (p2, p3)):
        expected = before["prompt_ids"] + before["output_ids"]
        assert after["prompt_ids"][: len(expected)] == expected
    assert p1["output_ids"] == encode(qwen3_tokenizer, CALL_EXEC)
    assert p2["output_ids"] == encode(qwen3_tokenizer, CALL_PATCH)
    assert p3["prompt_reused_ids"] > 0  # the session's prefix cache served the shared prefix
    # The captured request re-renders to the captured ids.
    assert list(adapter_for("qwen3").render(request=json.loads(p3["request_json"])).token_ids) == p3["prompt_ids"]
    prompt = qwen3_tokenizer.decode(p1["prompt_ids"], skip_special_tokens=False)
    # The custom tool is shown as a function with one string parameter, its grammar described;
    # the two user messages stay two turns.
    assert '"name": "apply_patch"' in prompt and '"required": ["input"]' in prompt and "lark grammar" in prompt
    assert "<|im_start|>user\n<environment_context/><|im_end|>\n<|im_start|>user\nWrite a.txt.<|im_end|>" in prompt


def test_stream_events(live_server_asgi, member, qwen3_tokenizer):
    make_route("qwen3-s", backend="scripted", config=scripted(qwen3_tokenizer, CALL_PATCH, CALL_EXEC))
    sdk = client(live_server_asgi, issue(member.org, "qwen3-s"))
    events = list(
        sdk.responses.create(model="qwen3-s", input="Patch it.", tools=[EXEC, APPLY_PATCH], stream=True, include=[])
    )
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    reasoning_text = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    patch_text = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    assert reasoning_text == "Now write the file." and patch_text == PATCH
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in done] == ["reasoning", "custom_tool_call"]
    assert "encrypted_content" not in done[0].model_dump(exclude_none=True)  # not asked for
    final = events[-1].response
    assert final.status == "completed" and final.output[1].input == PATCH
    assert final.usage.output_tokens == len(encode(qwen3_tokenizer, CALL_PATCH))
    assert final.usage.output_tokens_details.reasoning_tokens == len(encode(qwen3_tokenizer, "Now write the file."))

    # The SDK's stream helper accumulates the same answer (it checks item identities).
    with sdk.responses.stream(model="qwen3-s", input="List.", tools=[EXEC]) as stream:
        argument_deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        response = stream.get_final_response()
    call = response.output[1]
    assert call.type == "function_call" and "".join(argument_deltas) == call.arguments
    assert json.loads(call.arguments) == {"cmd": "ls -a"}
    rows = list(Interaction.objects.order_by("id"))
    assert len(rows) == 2 and all(r.stream for r in rows)
    assert all(settled(r.request_id).delivery == Delivery.DELIVERED for r in rows)


def test_text_stream_helper_and_incomplete(live_server_asgi, member, qwen3_tokenizer):
    make_route("qwen3-t", backend="scripted", config={**scripted(qwen3_tokenizer, ANSWER), "cycle": True})
    sdk = client(live_server_asgi, issue(member.org, "qwen3-t"))
    with sdk.responses.stream(model="qwen3-t", input="Status?") as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        response = stream.get_final_response()
    assert text == "Done: a.txt is written." == response.output_text
    assert [i.type for i in response.output] == ["reasoning", "message"]

    cut = sdk.responses.create(model="qwen3-t", input="Status?", max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 3 and cut.max_output_tokens == 3
    events = list(sdk.responses.create(model="qwen3-t", input="Status?", max_output_tokens=3, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"


def test_errors(live_server_asgi, member, qwen3_tokenizer):
    make_route("qwen3-e", context_window=600, max_output=100)
    make_route("qwen3-empty", backend="scripted", config={"sequences": []})
    sdk = client(live_server_asgi, member.secret)
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.responses.create(model="gpt-5-codex", input="x")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        client(live_server_asgi, "syn_wrong_secret").responses.create(model="qwen3-e", input="x")
    with pytest.raises(openai.BadRequestError) as stateful:
        sdk.responses.create(model="qwen3-e", input="x", previous_response_id="resp_123")
    assert "previous_response_id" in stateful.value.message
    with pytest.raises(openai.BadRequestError) as bad_item:
        sdk.responses.create(model="qwen3-e", input=[{"type": "bogus"}])
    assert "input.0.type" in bad_item.value.message
    with pytest.raises(openai.BadRequestError) as bad_args:
        sdk.responses.create(
            model="qwen3-e",
            input=[
                {"role": "user", "content": "x"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{not json"},
            ],
        )
    assert "input.1.arguments" in bad_args.value.message
    with pytest.raises(openai.BadRequestError) as too_long:
        sdk.responses.create(model="qwen3-e", input="word " * 3000)
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as too_long_streamed:  # refused before the stream starts
        sdk.responses.create(model="qwen3-e", input="word " * 3000, stream=True)
    assert too_long_streamed.value.code == "context_length_exceeded"

    # A sampler failure after the 200 is response.failed, and the call is recorded as failed.
    events = list(sdk.responses.create(model="qwen3-empty", input="x", stream=True))
    assert [e.type for e in events] == ["response.created", "response.in_progress", "response.failed"]
    assert events[-1].response.status == "failed" and events[-1].response.error.code == "server_error"
    failed = Interaction.objects.get(route__name="qwen3-empty")
    assert failed.delivery == Delivery.FAILED


def test_keepalive_while_sampling_is_accepted_by_the_stream_helper(
    live_server_asgi, member, qwen3_tokenizer, monkeypatch, settings
):
    """The sampler is held until the client has seen a keepalive (a second
    response.in_progress); the SDK's stream helper takes it and completes the response."""
    import threading

    from apps.proxy import calls
    from apps.proxy.samplers.base import Sampler, SampleRequest, SampleResult

    release = threading.Event()
    sampled = encode(qwen3_tokenizer, "Held, then done.<|im_end|>")

    class Held(Sampler):
        async def sample(self, request: SampleRequest) -> SampleResult:
            import asyncio

            await asyncio.to_thread(release.wait, 30)
            return SampleResult(token_ids=sampled, logprobs=[0.0] * len(sampled), finish="stop", snapshot={})

    async def held(*, route, snapshot):
        return Held()

    monkeypatch.setattr(calls, "sampler_get", held)
    settings.SYNTH_PROXY_PING_SECONDS = 0.05
    make_route("qwen3-held")
    sdk = client(live_server_asgi, issue(member.org, "qwen3-held"))
    kinds: list[str] = []
    with sdk.responses.stream(model="qwen3-held", input="Wait.", reasoning={"effort": "none"}) as stream:
        for event in stream:
            kinds.append(event.type)
            if kinds.count("response.in_progress") == 2:
                release.set()
        response = stream.get_final_response()
    assert response.output_text == "Held, then done." and response.status == "completed"
    first_item = kinds.index("response.output_item.added")
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert set(kinds[1:first_item]) == {"response.in_progress"} and first_item >= 3

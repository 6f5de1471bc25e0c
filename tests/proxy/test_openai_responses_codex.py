"""Codex CLI's own requests (recorded from the pinned @openai/codex, tests/fixtures/codex) through
POST /v1/responses: every recorded body is accepted and answered with a stream Codex parses,
and a Codex-shaped tool loop (its tools, developer messages, namespace and hosted tools, the
lark apply_patch tool; the items passed back the way Codex serializes them) renders each
next prompt as the previous prompt followed by exactly the ids that were sampled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from apps.proxy import capture
from apps.proxy.adapters.registry import adapter_for
from apps.proxy.models import Interaction
from tests.proxy.conftest import call, encode, issue, make_route, scripted

pytestmark = pytest.mark.django_db

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "codex"
RECORDED = sorted(FIXTURES.glob("*/[0-9][0-9]-POST-v1_responses.json"))
# The item fields Codex's ResponseItem serializes (what it sends back of our output items).
CODEX_FIELDS = {
    "reasoning": ("type", "id", "summary", "content", "encrypted_content"),
    "function_call": ("type", "status", "id", "name", "arguments", "call_id"),
    "custom_tool_call": ("type", "id", "status", "call_id", "name", "input"),
    "message": ("type", "id", "role", "content"),
}


def recorded(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    record = json.loads(path.read_text())
    headers = {
        k: v
        for k, v in record["headers"].items()
        if k not in ("authorization", "host", "content-length", "content-type")
    }
    return record["body"], headers


def answer(reply: Any) -> dict[str, Any]:
    assert reply.status == 200, reply.body
    events = reply.events()
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert all(name == data["type"] for name, data in events)
    assert events[0][0] == "response.created" and events[-1][0] == "response.completed"
    done = [data["item"] for name, data in events if name == "response.output_item.done"]
    final = events[-1][1]["response"]
    assert final["output"] == done and final["id"].startswith("resp_")
    assert set(final["usage"]) == {
        "input_tokens",
        "input_tokens_details",
        "output_tokens",
        "output_tokens_details",
        "total_tokens",
    }
    return final


def as_codex_sends(item: dict[str, Any]) -> dict[str, Any]:
    return {k: item.get(k) for k in CODEX_FIELDS[item["type"]]}


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: f"{p.parent.name}/{p.name[:2]}")
def test_every_recorded_request_is_answered(alice, qwen3_tokenizer, path: Path):
    body, headers = recorded(path)
    make_route(body["model"], backend="scripted", config=scripted(qwen3_tokenizer, "Done.<|im_end|>"))
    final = answer(call("/v1/responses", secret=issue(alice.org, body["model"]), body=body, headers=headers))
    assert final["output"][-1]["content"][0]["text"] == "Done."
    interaction = Interaction.objects.get()
    assert interaction.protocol == "responses" and interaction.session_id == body["prompt_cache_key"]
    payload = capture.staged_payload(interaction=interaction)
    rerendered = adapter_for("qwen3").render(request=json.loads(payload["request_json"])).token_ids
    assert list(rerendered) == payload["prompt_ids"]


def test_codex_tool_loop_renders_what_was_sampled(alice, qwen3_tokenizer):
    first, headers = recorded(FIXTURES / "catalog" / "01-POST-v1_responses.json")
    third, _ = recorded(FIXTURES / "catalog" / "03-POST-v1_responses.json")
    outputs = [i for i in third["input"] if i["type"] in ("function_call_output", "custom_tool_call_output")]
    patch = next(i for i in third["input"] if i["type"] == "custom_tool_call")["input"]
    sampled = [
        "<think>\nRun it first.\n</think>\n\n"
        '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "echo recorded > out.txt && cat out.txt"}}\n'
        "</tool_call><|im_end|>",
        "<think>\nThen the patch.\n</think>\n\n"
        '<tool_call>\n{"name": "apply_patch", "arguments": {"input": '
        + json.dumps(patch)
        + "}}\n</tool_call><|im_end|>",
        "<think>\nBoth written.\n</think>\n\nDone: out.txt and patched.txt are written.<|im_end|>",
    ]
    make_route(first["model"], backend="scripted", config=scripted(qwen3_tokenizer, *sampled))
    secret = issue(alice.org, first["model"])
    body = dict(first)
    finals = []
    for turn in range(3):
        final = answer(call("/v1/responses", secret=secret, body=body, headers=headers))
        finals.append(final)
        if turn < 2:
            calls = [i for i in final["output"] if i["type"] != "reasoning"]
            assert [c["type"] for c in calls] == [["function_call"], ["custom_tool_call"]][turn]
            result = {**outputs[turn], "call_id": calls[0]["call_id"]}
            body = {**body, "input": [*body["input"], *map(as_codex_sends, final["output"]), result]}
    assert finals[1]["output"][1]["input"] == patch  # the raw patch text, as Codex applies it
    assert finals[2]["output"][-1]["content"][0]["text"] == "Done: out.txt and patched.txt are written."
    payloads = [capture.staged_payload(interaction=i) for i in Interaction.objects.order_by("id")]
    assert [p["output_ids"] for p in payloads] == [encode(qwen3_tokenizer, s) for s in sampled]
    for before, after in zip(payloads, payloads[1:], strict=False):
        expected = before["prompt_ids"] + before["output_ids"]
        assert after["prompt_ids"][: len(expected)] == expected
    # One session (the thread id): from the first prompt holding an assistant turn on, the
    # prefix cache serves what the previous call rendered.
    assert payloads[2]["prompt_reused_ids"] > 0

"""The Responses translation on its own (apps.proxy.openai.responses, responses_output): the
mapping decisions the live tests do not reach, each with what a client would see."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.proxy.errors import InvalidRequest
from apps.proxy.openai.responses import (
    reasoning_seal,
    reasoning_unseal,
    responses_request_parse,
)
from apps.proxy.openai.responses_output import output_items

KEY = b"secret"


def parse(**body: Any):
    return responses_request_parse({"model": "m", "input": "hi", **body}, key=KEY)


def refused(**body: Any) -> str:
    with pytest.raises(InvalidRequest) as error:
        parse(**body)
    return error.value.message


def test_sealed_reasoning_round_trips_and_resists_forgery():
    text = 'Step 1: ünïcode.\n\nStep 2: "quotes".'
    sealed = reasoning_seal(text=text, key=KEY)
    assert reasoning_unseal(sealed=sealed, key=KEY) == text
    assert reasoning_unseal(sealed=sealed, key=b"other") is None
    head, payload, tag = sealed.split(".")
    forged = reasoning_seal(text="Something else.", key=KEY).split(".")[1]
    assert reasoning_unseal(sealed=f"{head}.{forged}.{tag}", key=KEY) is None
    # Another server's (or OpenAI's) encrypted reasoning without readable content is refused.
    message = refused(
        input=[{"role": "user", "content": "q"}, {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA"}]
    )
    assert message == "input.1.encrypted_content: was not issued by this server"


def test_assistant_items_join_one_turn_and_user_messages_stay_apart():
    request = parse(
        input=[
            {"role": "user", "content": "a"},
            {"role": "user", "content": "b"},
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "s1"}, {"type": "summary_text", "text": "s2"}],
            },
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "t"}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": ""},
            {"type": "web_search_call", "id": "ws", "status": "completed", "action": {"type": "search", "query": "q"}},
            {"type": "function_call_output", "call_id": "c", "output": "o"},
        ]
    ).internal
    assert [(m["role"], [b["type"] for b in m["content"]]) for m in request["messages"]] == [
        ("user", ["text"]),
        ("user", ["text"]),
        ("assistant", ["thinking", "text", "tool_use"]),
        ("user", ["tool_result"]),
    ]
    thinking, _, call = request["messages"][2]["content"]
    assert thinking["thinking"] == "s1\n\ns2"  # only a summary was sent back
    assert call["input"] == {}  # empty arguments are an empty object


def test_tools_and_tool_choice():
    tools = [
        {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}},
        {
            "type": "namespace",
            "name": "agents",
            "tools": [{"type": "function", "name": "spawn_agent"}, {"type": "function", "name": "wait"}],
        },
        {"type": "custom", "name": "apply_patch", "format": {"type": "text"}},
        {"type": "web_search", "external_web_access": False},
    ]
    request = parse(tools=tools, tool_choice={"type": "custom", "name": "apply_patch"}, parallel_tool_calls=False)
    assert [t["name"] for t in request.internal["tools"]] == [
        "spawn_agent",
        "agents__spawn_agent",
        "wait",
        "apply_patch",
    ]
    assert request.namespaced == {"agents__spawn_agent": ("agents", "spawn_agent"), "wait": ("agents", "wait")}
    assert request.internal["tools"][3]["input_schema"]["required"] == ["input"]
    assert request.internal["tool_choice"] == {"type": "tool", "name": "apply_patch", "disable_parallel_tool_use": True}
    assert parse(tool_choice="required").internal["tool_choice"] == {"type": "any"}
    # A namespaced call in the history is rendered under the name the model was shown.
    history = [
        {"role": "user", "content": "q"},
        {"type": "function_call", "call_id": "c", "name": "spawn_agent", "namespace": "agents", "arguments": "{}"},
    ]
    assert parse(tools=tools, input=history).internal["messages"][1]["content"][0]["name"] == "agents__spawn_agent"
    assert "tools.0.type" in refused(tools=[{"type": "local_shell"}])
    assert "tools.1.name" in refused(tools=[tools[0], tools[0]])
    assert "tool_choice.name" in refused(tool_choice={"type": "function", "name": "nope"})


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input.0.type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role"),
        ({"input": [{"role": "developer", "content": "only a system turn"}]}, "input"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": 2.5}, "temperature"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"input": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "input.0.content.0.type"),
    ],
)
def test_refusals_name_the_field(body: dict[str, Any], where: str):
    assert refused(**body).startswith(where + ":")


def test_output_items_from_parsed_blocks():
    request = parse(
        tools=[
            {"type": "custom", "name": "apply_patch"},
            {"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "wait"}]},
        ],
        include=["reasoning.encrypted_content"],
    )
    blocks = [
        {"type": "thinking", "thinking": "plan", "signature": "x"},
        {"type": "text", "text": "Patching."},
        {
            "type": "tool_use",
            "id": "call_1",
            "name": "apply_patch",
            "input": {"input": "*** Begin Patch\n*** End Patch"},
        },
        {"type": "tool_use", "id": "call_2", "name": "apply_patch", "input": {"patch": "x"}},
        {"type": "tool_use", "id": "call_3", "name": "wait", "input": {"ms": 5}},
    ]
    items = output_items(blocks=blocks, request=request, response_id="resp_1", incomplete=False, key=KEY)
    assert [i["type"] for i in items] == ["reasoning", "message", "custom_tool_call", "function_call", "function_call"]
    assert reasoning_unseal(sealed=items[0]["encrypted_content"], key=KEY) == "plan"
    assert items[2]["input"] == "*** Begin Patch\n*** End Patch" and items[2]["call_id"] == "call_1"
    # A custom tool called with other arguments stays a function call (its arguments come back as sampled).
    assert json.loads(items[3]["arguments"]) == {"patch": "x"}
    assert items[4]["name"] == "wait" and items[4]["namespace"] == "agents"
    # Passed back as input, the items give the blocks they came from.
    back = parse(
        tools=[
            {"type": "custom", "name": "apply_patch"},
            {"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "wait"}]},
        ],
        input=[{"role": "user", "content": "q"}, *items],
    )
    assert back.internal["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "plan", "signature": ""},
        {"type": "text", "text": "Patching."},
        *[{k: b[k] for k in ("type", "id", "name", "input")} for b in blocks[2:]],
    ]

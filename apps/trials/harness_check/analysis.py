"""What ``harness_check`` concludes from one scripted attempt: the request shapes the harness
sent, whether each captured call re-renders to its captured prompt ids, whether each sampled
tool call came back unchanged, and whether the harness did the task.

Pure functions of what was recorded (shapes, payloads, the attempt's outcome); each check
returns its rows and the failures it found, in words an operator can act on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from apps.proxy.prompt_store import ID_BYTES, pack


@dataclass(frozen=True)
class Call:
    """One captured model call: its row id, conversation and token payload."""

    id: str
    session_id: str
    agent_id: str
    payload: dict[str, Any]

    @property
    def request(self) -> dict[str, Any]:
        return json.loads(self.payload["request_json"])

    @property
    def sampled_ids(self) -> list[int]:
        ids = list(self.payload["output_ids"])
        cut = self.payload.get("delivered_output_ids")
        return ids[:cut] if cut is not None else ids


def shapes_summary(*, shapes: list[dict[str, Any]]) -> dict[str, Any]:
    """The union of what the harness sent: endpoints, header names, body keys, tool names."""
    endpoints: dict[str, int] = {}
    body_keys: dict[str, set[str]] = {}
    tools: list[str] = []
    headers: set[str] = set()
    values: dict[str, set[str]] = {}
    models: set[str] = set()
    for shape in shapes:
        endpoint = f"{shape['method']} {shape['path']}"
        endpoints[endpoint] = endpoints.get(endpoint, 0) + 1
        headers.update(shape.get("headers", []))
        for name, value in (shape.get("header_values") or {}).items():
            values.setdefault(name, set()).add(value)
        if "body_keys" in shape:
            body_keys.setdefault(endpoint, set()).update(shape["body_keys"])
        for tool in shape.get("tools") or []:
            if isinstance(tool, str) and tool not in tools:
                tools.append(tool)
        if isinstance(shape.get("model"), str):
            models.add(shape["model"])
    return {
        "count": len(shapes),
        "endpoints": endpoints,
        "header_names": sorted(headers),
        "header_values": {name: sorted(v) for name, v in sorted(values.items())},
        "body_keys": {endpoint: sorted(keys) for endpoint, keys in sorted(body_keys.items())},
        "tool_names": tools,
        "models": sorted(models),
    }


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def rerender_check(*, calls: list[Call]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every captured call's request, re-rendered by the route's adapter, is its prompt ids."""
    from apps.proxy.fidelity import payload_render_ids

    rows, failures = [], []
    for call in calls:
        captured = list(call.payload["prompt_ids"])
        row: dict[str, Any] = {
            "id": call.id,
            "agent_id": call.agent_id,
            "stop_reason": call.payload.get("stop_reason", ""),
            "prompt_tokens": len(captured),
            "output_tokens": len(call.payload["output_ids"]),
        }
        try:
            rendered = payload_render_ids(payload=call.payload)
        except Exception as exc:  # noqa: BLE001 - any failure to re-render is the finding
            row.update(rerenders=False, error=f"{type(exc).__name__}: {exc}")
            failures.append(f"call {call.id}: its captured request does not re-render ({row['error']})")
        else:
            difference = _first_difference(rendered, captured)
            row.update(rerenders=difference is None, first_difference=difference)
            if difference is not None:
                failures.append(
                    f"call {call.id}: its captured request re-renders to other ids than it was sampled with "
                    f"(first difference at token {difference} of {len(captured)})"
                )
        rows.append(row)
    return rows, failures


def _contains(haystack: list[int], needle: list[int]) -> bool:
    """Whether ``needle`` occurs contiguously in ``haystack`` (packed: a bytes search)."""
    big, small = pack(haystack), pack(needle)
    if big is None or small is None or not needle:
        return False
    at = big.find(small)
    while at != -1:
        if at % ID_BYTES == 0:
            return True
        at = big.find(small, at + 1)
    return False


def _tool_uses(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]


def _tool_result_ids(request: dict[str, Any]) -> set[Any]:
    ids: set[Any] = set()
    for message in request.get("messages") or []:
        if message.get("role") == "user" and isinstance(message.get("content"), list):
            ids.update(b.get("tool_use_id") for b in message["content"] if isinstance(b, dict))
    return ids


def tool_round_trip(*, calls: list[Call]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each sampled tool call comes back in a later call's request as it was sampled (name,
    id, input with its key order), with its result, and that request's prompt holds the
    sampled ids unchanged."""
    rows, failures = [], []
    for index, call in enumerate(calls):
        for block in call.payload.get("content") or []:
            if not isinstance(block, dict) or block.get("type") != "tool_use":
                continue
            row: dict[str, Any] = {"call": call.id, "tool_use_id": block.get("id"), "name": block.get("name")}
            rows.append(row)
            later = None
            for other in calls[index + 1 :]:
                request = other.request
                sent = next(
                    (b for m in request.get("messages") or [] for b in _tool_uses(m) if b.get("id") == block.get("id")),
                    None,
                )
                if sent is not None:
                    later = (other, request, sent)
                    break
            if later is None:
                row["returned"] = False
                failures.append(
                    f"tool call {block.get('name')} ({block.get('id')}) of call {call.id} never came back in a "
                    "later request"
                )
                continue
            other, request, sent = later
            same = sent.get("name") == block.get("name") and json.dumps(sent.get("input")) == json.dumps(
                block.get("input")
            )
            in_prompt = _contains(list(other.payload["prompt_ids"]), call.sampled_ids)
            extends = list(other.payload["prompt_ids"][: len(call.payload["prompt_ids"]) + len(call.sampled_ids)]) == (
                list(call.payload["prompt_ids"]) + call.sampled_ids
            )
            row.update(
                returned=True,
                returned_in=other.id,
                request_matches=same,
                result_sent=block.get("id") in _tool_result_ids(request),
                sampled_ids_in_next_prompt=in_prompt,
                next_prompt_extends=extends,
            )
            if not same:
                failures.append(
                    f"tool call {block.get('name')} ({block.get('id')}) came back changed in call {other.id}: "
                    f"sampled {json.dumps(block.get('input'))}, sent back {json.dumps(sent.get('input'))}"
                )
            if not row["result_sent"]:
                failures.append(f"tool call {block.get('id')}: call {other.id} carries no tool_result for it")
            if not in_prompt:
                failures.append(
                    f"tool call {block.get('id')}: the prompt of call {other.id} does not hold the "
                    f"{len(call.sampled_ids)} sampled ids of call {call.id} unchanged"
                )
    return rows, failures

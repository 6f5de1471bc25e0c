"""The Responses API's server-sent events, built from the answer's output items.

As for Messages (streaming.py), the whole completion is sampled and parsed first, then
streamed in chunked deltas. Every event carries `sequence_number`, counting from 0:

    response.created, response.in_progress
    (response.in_progress)*        while the sampler works: the keepalive
    for each output item (output_index i):
        response.output_item.added {item as it starts}
        reasoning: content_part.added (reasoning_text), reasoning_text.delta+, reasoning_text.done, content_part.done
        message:   content_part.added (output_text), output_text.delta+, output_text.done, content_part.done
        function_call:    function_call_arguments.delta+, function_call_arguments.done
        custom_tool_call: custom_tool_call_input.delta+, custom_tool_call_input.done
        response.output_item.done {the whole item}
    response.completed | response.incomplete   {the response object with usage}

A failure after the 200 is response.failed with the error in the response object.

The keepalive is a repeated response.in_progress because both clients that matter accept
it: Codex resets its stream idle timeout on any event and ignores this one, and the openai
SDK's stream helper takes it as a lifecycle event of the same response (an event type it
does not know would be passed through untyped).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

from apps.proxy.streaming import CHUNK_CHARS


def _chunks(text: str) -> Iterator[str]:
    for i in range(0, len(text), CHUNK_CHARS):
        yield text[i : i + CHUNK_CHARS]


class ResponseEvents:
    """Numbers the events of one response stream."""

    def __init__(self) -> None:
        self.sequence = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()

    def lifecycle(self, kind: str, response: dict[str, Any]) -> bytes:
        """response.created / in_progress / completed / incomplete / failed."""
        return self.event(kind, response=response)

    def item(self, *, index: int, item: dict[str, Any]) -> Iterator[bytes]:
        kind = item["type"]
        item_id = item["id"]
        where = {"item_id": item_id, "output_index": index}
        started = copy.deepcopy(item)
        if kind == "message":
            started = {**started, "status": "in_progress", "content": []}
        elif kind == "reasoning":
            started["content"] = []
            started.pop("encrypted_content", None)
        elif kind == "function_call":
            started = {**started, "status": "in_progress", "arguments": ""}
        elif kind == "custom_tool_call":
            started = {**started, "status": "in_progress", "input": ""}
        yield self.event("response.output_item.added", output_index=index, item=started)
        if kind in ("message", "reasoning"):
            for part_index, part in enumerate(item.get("content") or []):
                yield from self._part(where=where, part_index=part_index, part=part)
        elif kind == "function_call":
            for piece in _chunks(item["arguments"]):
                yield self.event("response.function_call_arguments.delta", **where, delta=piece)
            yield self.event(
                "response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"]
            )
        elif kind == "custom_tool_call":
            for piece in _chunks(item["input"]):
                yield self.event("response.custom_tool_call_input.delta", **where, delta=piece)
            yield self.event("response.custom_tool_call_input.done", **where, input=item["input"])
        yield self.event("response.output_item.done", output_index=index, item=item)

    def _part(self, *, where: dict[str, Any], part_index: int, part: dict[str, Any]) -> Iterator[bytes]:
        text = part.get("text", "")
        empty = {**part, "text": ""}
        yield self.event("response.content_part.added", **where, content_index=part_index, part=empty)
        if part["type"] == "reasoning_text":
            for piece in _chunks(text):
                yield self.event("response.reasoning_text.delta", **where, content_index=part_index, delta=piece)
            yield self.event("response.reasoning_text.done", **where, content_index=part_index, text=text)
        else:
            for piece in _chunks(text):
                yield self.event(
                    "response.output_text.delta", **where, content_index=part_index, delta=piece, logprobs=[]
                )
            yield self.event("response.output_text.done", **where, content_index=part_index, text=text, logprobs=[])
        yield self.event("response.content_part.done", **where, content_index=part_index, part=part)

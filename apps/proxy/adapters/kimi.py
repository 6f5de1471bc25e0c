"""Kimi K2 (Thinking): Anthropic Messages <-> Moonshot's Kimi-K2-Thinking chat template.

Template followed: Kimi-K2-Thinking's, i.e. apps/proxy/chat_templates/Kimi-K2-Thinking.jinja
(llama.cpp's copy) with llama.cpp's modifications undone, which is the form tml-renderers'
KimiK2 renderer (an independent implementation by Thinking Machines) reproduces token for
token (tests):
- tool-call ids are the messages' own ids (`tool_call['id']`, `message.tool_call_id`), not
  ids llama.cpp invents from a counter with `list.append` (which transformers' sandbox
  forbids anyway);
- the tool list is compact JSON with keys sorted recursively: Moonshot's tokenizer
  (tokenization_kimi.py) deep-sorts `tools` before rendering and the template prints them
  with `tojson(separators=(',', ':'))`; llama.cpp prints spaced, unsorted JSON;
- the history/suffix split uses the LAST assistant turn without tool calls (the template's
  own comment says so; llama.cpp's copy, lacking a `break`, takes the first). Reasoning is
  kept for assistant turns after it and dropped (`<think></think>`) up to it.

Format:
    <|im_system|>tool_declare<|im_middle|>[tools json]<|im_end|>            (if tools)
    <|im_system|>system<|im_middle|>{system}<|im_end|>                      (default text if none)
    <|im_user|>user<|im_middle|>{text}<|im_end|>
    <|im_assistant|>assistant<|im_middle|><think>{reasoning}</think>{text}
      <|tool_calls_section_begin|><|tool_call_begin|>{id}<|tool_call_argument_begin|>{json}
      <|tool_call_end|>...<|tool_calls_section_end|><|im_end|>
    <|im_system|>tool<|im_middle|>## Return of {id}\\n{result}<|im_end|>
    <|im_assistant|>assistant<|im_middle|>                                  (generation prompt)
(one line per message here; the template puts no newlines between them.)

Tool-call ids are part of the prompt ("functions.NAME:N", N counting calls in the
conversation). `parse` returns the model's own id as the Anthropic tool_use id, Claude Code
sends it back as tool_result.tool_use_id, and the next prompt shows exactly the id the model
wrote; renaming ids (toolu_...) would make the next prompt differ from what was sampled.

Other decisions (tested):
- Mid-conversation system messages are rendered where they stand, as the template does.
- Tool-call arguments are rendered as the template's `tojson` renders an object
  (`json.dumps(ensure_ascii=False)`: ", " and ": " separators), which is also what
  tml-renderers produces; a sample with other spacing stays exact through the sampled-turn
  memo (template_base).
- `thinking` in the request is ignored: K2 Thinking always opens "<think>" itself.
- A final assistant message (prefill) is rendered as the template renders it, without its
  "<|im_end|>".

Parsing returns reasoning and text verbatim (the template re-renders them verbatim), so a
tool-calling turn re-renders to exactly the sampled ids.
"""

from __future__ import annotations

import json
import re
from typing import Any

from apps.proxy.adapters.base import ParsedOutput
from apps.proxy.adapters.messages import to_chat_messages
from apps.proxy.adapters.render_cache import rendered_by_value
from apps.proxy.adapters.template_base import (
    Chunk,
    TemplateAdapter,
    assistant_message,
    text_block,
    thinking_block,
    tool_calls_scan,
)

IM_END = "<|im_end|>"
IM_USER = "<|im_user|>"
IM_ASSISTANT = "<|im_assistant|>"
IM_SYSTEM = "<|im_system|>"
IM_MIDDLE = "<|im_middle|>"
EOS = "[EOS]"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
DEFAULT_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."
ASSISTANT_HEADER = IM_ASSISTANT + "assistant" + IM_MIDDLE

_CALL_ID = re.compile(r"(?P<head>\S+):(?P<index>\d+)")


def deep_sorted(value: Any) -> Any:
    """Moonshot's `deep_sort_dict`: dict keys sorted at every level (lists keep their order)."""
    if isinstance(value, dict):
        return {k: deep_sorted(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [deep_sorted(v) for v in value]
    return value


@rendered_by_value
def tool_declaration(tools: list[dict[str, Any]]) -> str:
    return json.dumps(deep_sorted(tools), ensure_ascii=False, separators=(",", ":"))


def arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def tool_calls_text(calls: list[dict[str, Any]]) -> str:
    if not calls:
        return ""
    return (
        SECTION_BEGIN
        + "".join(
            f"{CALL_BEGIN}{c.get('id') or ''}{ARGUMENT_BEGIN}{arguments_text(c['function']['arguments'])}{CALL_END}"
            for c in calls
        )
        + SECTION_END
    )


def call_name(call_id: str) -> str | None:
    """The function name in a Kimi tool-call id ("functions.NAME:N"), or None if malformed."""
    match = _CALL_ID.fullmatch(call_id)
    if match is None:
        return None
    head = match.group("head")
    name = head[len("functions.") :] if head.startswith("functions.") else head.split(".")[-1]
    return name or None


class KimiK2Adapter(TemplateAdapter):
    """Kimi K2 Thinking. See the module docstring."""

    family = "kimi-k2"
    stop_tokens = (IM_END, EOS)

    def __init__(self, *, tokenizer: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer=tokenizer, **kwargs)
        self.im_end_id = self.token_id(IM_END)

    # --- rendering ---------------------------------------------------------------------------

    @staticmethod
    def _body(message: dict[str, Any], *, keep_reasoning: bool) -> str:
        """An assistant turn after its header, up to (not including) <|im_end|>."""
        reasoning = (message.get("reasoning_content") or "") if keep_reasoning else ""
        return (
            THINK_OPEN
            + reasoning
            + THINK_CLOSE
            + (message.get("content") or "")
            + tool_calls_text(message.get("tool_calls") or [])
        )

    def _chunks(self, request: dict[str, Any]) -> list[Chunk]:
        messages, tools = to_chat_messages(request)
        prefill = bool(messages) and messages[-1]["role"] == "assistant"
        # Reasoning is kept only after the last assistant turn that made no tool call.
        history_end = -1
        for index in range(len(messages) - 1, -1, -1):
            if messages[index]["role"] == "assistant" and not messages[index].get("tool_calls"):
                history_end = index
                break
        chunks: list[Chunk] = []
        if tools:
            chunks.append(IM_SYSTEM + "tool_declare" + IM_MIDDLE + tool_declaration(tools) + IM_END)
        if not messages or messages[0]["role"] != "system":
            chunks.append(IM_SYSTEM + "system" + IM_MIDDLE + DEFAULT_SYSTEM + IM_END)
        last = len(messages) - 1
        for index, m in enumerate(messages):
            role = m["role"]
            if role == "assistant":
                body = self._body(m, keep_reasoning=index > history_end)
                if prefill and index == last:
                    chunks.append(ASSISTANT_HEADER + body)
                else:
                    chunks.append(self._turn(ASSISTANT_HEADER, body + IM_END))
            elif role == "user":
                chunks.append(IM_USER + "user" + IM_MIDDLE + m["content"] + IM_END)
            elif role == "tool":
                chunks.append(
                    IM_SYSTEM
                    + "tool"
                    + IM_MIDDLE
                    + f"## Return of {m.get('tool_call_id') or ''}\n"
                    + m["content"]
                    + IM_END
                )
            else:
                chunks.append(IM_SYSTEM + role + IM_MIDDLE + m["content"] + IM_END)
        if not prefill:
            chunks.append(ASSISTANT_HEADER)
        return chunks

    # --- parsing -----------------------------------------------------------------------------

    def parse(
        self, *, token_ids: list[int], stopped: bool, id_seed: str = "", tools: list[dict[str, Any]] | None = None
    ) -> ParsedOutput:
        body_ids, stop_id = self._split_stop(token_ids, stopped)
        text = self.decode(body_ids)
        blocks: list[dict[str, Any]] = []
        errors: list[str] = []
        rest = text
        if text.startswith(THINK_OPEN):
            close = text.find(THINK_CLOSE)
            if close == -1:  # still reasoning when sampling stopped
                reasoning, rest = text[len(THINK_OPEN) :], ""
            else:
                reasoning, rest = text[len(THINK_OPEN) : close], text[close + len(THINK_CLOSE) :]
            if reasoning:
                blocks.append(thinking_block(reasoning))
        calls = self._parse_calls(
            rest, stopped=stopped, digest=self._digest(id_seed, body_ids), blocks=blocks, errors=errors
        )
        if stop_id == self.im_end_id and not errors:
            # As the next request will render this turn (it made tool calls, so it is in the
            # part of the conversation whose reasoning the template keeps).
            message = assistant_message(blocks)
            self._remember(self._body(message, keep_reasoning=True) + IM_END, body_ids + [stop_id])
        return ParsedOutput(blocks=blocks, stop_reason=self._stop_reason(stopped, calls), parse_errors=errors)

    def _parse_calls(
        self, text: str, *, stopped: bool, digest: str, blocks: list[dict[str, Any]], errors: list[str]
    ) -> int:
        start = text.find(SECTION_BEGIN)
        if start == -1:
            if text.strip():
                blocks.append(text_block(text))
            return 0
        if text[:start].strip():
            blocks.append(text_block(text[:start]))
        end = text.find(SECTION_END, start)
        section = text[start + len(SECTION_BEGIN) : len(text) if end == -1 else end]
        after = "" if end == -1 else text[end + len(SECTION_END) :]
        calls = tool_calls_scan(
            section=section,
            call_begin=CALL_BEGIN,
            call_end=CALL_END,
            stopped=stopped,
            parse_one=self._parse_one,
            # The model's own call id is kept: Kimi re-renders it into the next prompt.
            to_block=lambda index, call: {
                "type": "tool_use",
                "id": call[0] or self._tool_use_id(digest, index),
                "name": call[1],
                "input": call[2],
            },
            blocks=blocks,
            errors=errors,
        )
        if end == -1 and calls and not stopped:
            errors.append("tool-call section not closed (output truncated)")
        if after.strip():
            blocks.append(text_block(after))
        return calls

    @staticmethod
    def _parse_one(body: str) -> tuple[tuple[str, str, dict[str, Any]] | None, str | None]:
        if ARGUMENT_BEGIN not in body:
            return None, "missing <|tool_call_argument_begin|>"
        call_id, _, args = body.partition(ARGUMENT_BEGIN)
        call_id = call_id.strip()
        name = call_name(call_id)
        if name is None:
            return None, f"tool-call id {call_id[:80]!r} is not functions.NAME:N"
        try:
            arguments = json.loads(args) if args.strip() else {}
        except ValueError as exc:
            return None, f"arguments are not valid JSON: {exc}"
        if not isinstance(arguments, dict):
            return None, "arguments are not a JSON object"
        return (call_id, name, arguments), None

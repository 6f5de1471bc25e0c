"""Qwen3 and Qwen2.5: Anthropic Messages <-> the official Qwen chat templates.

Rendering is plain Python that mirrors, branch for branch, the official templates vendored in
apps/proxy/chat_templates/ (Qwen-Qwen3-0.6B.jinja, Qwen-Qwen2.5-7B-Instruct.jinja). The tests
render the same conversations through those Jinja templates (HF's environment) and through
tml-renderers and require identical token ids; Jinja is never used at request time.

The request becomes template messages through messages.py's `to_chat_messages` (shared by
every family). What the Qwen templates do with them:
- consecutive `tool` messages are grouped into one user turn of <tool_response> blocks;
- tool_use arguments are serialized by the template's tojson; tool_choice cannot be
  expressed in this template and is not rendered;
- thinking {"type": "disabled"} -> enable_thinking=False (the empty think block in the
  generation prompt); enabled/adaptive -> thinking on; absent -> `thinking_when_unspecified`;
- a final assistant message is a prefill: the turn is rendered as the template renders a
  last assistant message, without its closing "<|im_end|>\\n".

Exact re-rendering (sampled ids -> next request -> same ids). `parse` splits the sampled
text exactly where the template joins it (one "\\n" before the first <tool_call>, the
"\\n</think>\\n\\n" after reasoning), so when the model followed its template (the usual
case) the re-rendered turn is byte-identical. When it did not - e.g. it serialized the tool
arguments with other spacing or key order than `json.dumps(ensure_ascii=False)`, or put extra
blank lines - the canonical re-render would differ. For those turns `parse` records the sampled
ids in the sampled-turn memo (render_cache.py); when a later request carries the same blocks
back, `render` splices the sampled ids in place of the re-tokenized text. This also covers
non-canonical BPE splits. Qwen's turn header "<|im_start|>assistant\\n" does not end at an
added token, so the memo holds whole turns: the canonical turn text -> header ids + sampled
ids + "<|im_end|>\\n" ids. A miss (another process, evicted) falls back to the canonical
template rendering, which is what the official template would produce.
Note the template itself is not append-only: Qwen3 drops reasoning from assistant turns
before the last user query, and the empty think block of a thinking-disabled generation
prompt does not reappear in history; both follow the official template.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from typing import Any

from apps.proxy.adapters.base import ParsedOutput
from apps.proxy.adapters.messages import thinking_enabled, to_chat_messages
from apps.proxy.adapters.render_cache import SampledTurnMemo, rendered_by_value
from apps.proxy.adapters.template_base import (
    Chunk,
    Splice,
    TemplateAdapter,
    assistant_message,
    text_block,
    thinking_block,
)

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
ASSISTANT_HEADER = IM_START + "assistant\n"
QWEN25_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call><|im_end|>\n"
)


def tojson(value: Any) -> str:
    """The templates' `tojson` as transformers defines it: no HTML escaping, key order kept."""
    return json.dumps(value, ensure_ascii=False)


@rendered_by_value
def tool_lines(tools: list[dict[str, Any]]) -> str:
    """The tools of the system turn: a line of `tojson` each."""
    return "".join("\n" + tojson(tool) for tool in tools)


class _QwenBase(TemplateAdapter):
    supports_thinking = True
    stop_tokens = (IM_END, ENDOFTEXT)

    def __init__(
        self, *, tokenizer: Any, memo: SampledTurnMemo | None = None, thinking_when_unspecified: bool = True
    ) -> None:
        super().__init__(tokenizer=tokenizer, memo=memo)
        self.thinking_when_unspecified = thinking_when_unspecified
        self.im_end_id = self.token_id(IM_END)
        self.endoftext_id = self.token_id(ENDOFTEXT)
        self._header_ids = self.encode(ASSISTANT_HEADER)
        self._im_end_nl_ids = self.encode(IM_END + "\n")

    # --- rendering ---------------------------------------------------------------------------

    def _chunks(self, request: dict[str, Any]) -> list[Chunk]:
        messages, tools = to_chat_messages(request)
        prefill = bool(messages) and messages[-1]["role"] == "assistant"
        return self._template_chunks(
            messages,
            tools,
            add_generation_prompt=not prefill,
            enable_thinking=thinking_enabled(request, self.thinking_when_unspecified),
        )

    @abstractmethod
    def _template_chunks(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> list[Chunk]:
        """The template, message by message, as a list of chunks (each opens at "<|im_start|>")."""

    @abstractmethod
    def _assistant_turn(self, message: dict[str, Any], *, keep_reasoning: bool, is_last: bool) -> str:
        """The template's text for one assistant message, "<|im_start|>assistant..." to "<|im_end|>\\n"."""

    def _assistant_chunk(self, message: dict[str, Any], *, keep_reasoning: bool, is_last: bool, prefill: bool) -> Chunk:
        turn = self._assistant_turn(message, keep_reasoning=keep_reasoning, is_last=is_last)
        if prefill:
            # Continue the final message: drop the template's closing "<|im_end|>\n".
            return turn.removesuffix(IM_END + "\n")
        return self._turn("", turn)  # the whole turn is the memo's key (see the module docstring)

    # --- parsing ------------------------------------------------------------------------------

    def parse(
        self, *, token_ids: list[int], stopped: bool, id_seed: str = "", tools: list[dict[str, Any]] | None = None
    ) -> ParsedOutput:
        """Sampled ids -> Anthropic blocks. Never raises on model output.

        `id_seed` (e.g. the request id) makes tool_use ids unique across identical outputs;
        ids are "toolu_" + a hash of (seed, the sampled ids, the call's position).
        """
        body_ids, _stop_id = self._split_stop(token_ids, stopped)
        text = self.decode(body_ids)
        errors: list[str] = []
        blocks: list[dict[str, Any]] = []
        reasoning, rest = self._split_thinking(text) if self.supports_thinking else (None, text)
        if reasoning:
            blocks.append(thinking_block(reasoning))
        digest = self._digest(id_seed, body_ids)
        calls = self._parse_tool_calls(rest, stopped=stopped, digest=digest, blocks=blocks, errors=errors)
        parsed = ParsedOutput(blocks=blocks, stop_reason=self._stop_reason(stopped, calls), parse_errors=errors)
        self._remember_turn(parsed.blocks, body_ids)
        return parsed

    @staticmethod
    def _split_thinking(text: str) -> tuple[str | None, str]:
        # Mirrors how the template re-splits reasoning from content.
        if THINK_CLOSE in text:
            before, _, after = text.partition(THINK_CLOSE)
            return before.rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n"), after.lstrip("\n")
        if text.lstrip().startswith(THINK_OPEN):
            # Still thinking when sampling stopped (max_tokens): all of it is reasoning.
            return text.lstrip().removeprefix(THINK_OPEN).lstrip("\n"), ""
        return None, text

    def _parse_tool_calls(
        self, text: str, *, stopped: bool, digest: str, blocks: list[dict[str, Any]], errors: list[str]
    ) -> int:
        """Append text / tool_use blocks for `text`; returns the number of tool calls parsed."""
        first = text.find(TOOL_CALL_OPEN)
        if first == -1:
            if text.strip():
                blocks.append(text_block(text))
            return 0
        # The template writes content + "\n" + "<tool_call>": take that "\n" back off.
        lead = text[:first]
        lead = lead[:-1] if lead.endswith("\n") else lead
        if lead.strip():
            blocks.append(text_block(lead))
        calls = 0
        pos = first
        index = 0
        while pos != -1:
            start = pos + len(TOOL_CALL_OPEN)
            end = text.find(TOOL_CALL_CLOSE, start)
            raw_end = len(text) if end == -1 else end + len(TOOL_CALL_CLOSE)
            raw = text[pos:raw_end]
            call, error = self._parse_one_call(text[start:] if end == -1 else text[start:end])
            if end == -1 and (not stopped or call is None):
                call, error = None, error or "tool call not closed (output truncated)"
            if call is None:
                errors.append(f"tool call {index}: {error}")
                blocks.append(text_block(raw))
            else:
                tool_id = self._tool_use_id(digest, index)
                blocks.append({"type": "tool_use", "id": tool_id, "name": call[0], "input": call[1]})
                calls += 1
            index += 1
            pos = text.find(TOOL_CALL_OPEN, raw_end)
            between = text[raw_end:] if pos == -1 else text[raw_end:pos]
            if between.strip():
                blocks.append(text_block(between))
        return calls

    @staticmethod
    def _parse_one_call(body: str) -> tuple[tuple[str, dict[str, Any]] | None, str | None]:
        try:
            obj = json.loads(body)
        except ValueError as exc:
            return None, f"invalid JSON: {exc}"
        if not isinstance(obj, dict):
            return None, "not a JSON object"
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            return None, "missing function name"
        arguments = obj.get("arguments", {})
        if isinstance(arguments, str):
            # Some fine-tunes emit the arguments as a JSON string.
            try:
                arguments = json.loads(arguments)
            except ValueError as exc:
                return None, f"arguments are not JSON: {exc}"
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return None, "arguments are not a JSON object"
        return (name, arguments), None

    def _remember_turn(self, blocks: list[dict[str, Any]], body_ids: list[int]) -> None:
        """Record sampled ids whose canonical re-render would tokenize differently."""
        turn = self._assistant_turn(assistant_message(blocks), keep_reasoning=True, is_last=False)
        if not (turn.startswith(ASSISTANT_HEADER) and turn.endswith(IM_END + "\n")):
            return
        # What the prompt would hold after a generation-prompt header: header + sampled + end.
        self._remember(turn, self._header_ids + body_ids + self._im_end_nl_ids)

    def render_assistant(self, blocks: list[dict[str, Any]]) -> list[int]:
        """Ids of an assistant turn as the next request re-renders it (after the header
        "<|im_start|>assistant\\n", up to and including <|im_end|>): for a turn the model just
        sampled this equals the sampled ids (plus the stop token) when the round trip is exact."""
        chunk = self._assistant_chunk(assistant_message(blocks), keep_reasoning=True, is_last=False, prefill=False)
        ids = chunk.ids if isinstance(chunk, Splice) else self.encode(chunk)
        header = self._header_ids
        if ids[: len(header)] == header and ids[-len(self._im_end_nl_ids) :] == self._im_end_nl_ids:
            return ids[len(header) : -1]
        return ids  # the turn does not tokenize apart from its header: no exact round trip


def _tool_call_text(call: dict[str, Any]) -> str:
    fn = call.get("function") or call
    args = fn.get("arguments")
    args_text = args if isinstance(args, str) else tojson(args)
    return '<tool_call>\n{"name": "' + str(fn.get("name", "")) + '", "arguments": ' + args_text + "}\n</tool_call>"


def _is_wrapped_tool_response(content: str) -> bool:
    return content.startswith("<tool_response>") and content.endswith("</tool_response>")


class Qwen3Adapter(_QwenBase):
    """Qwen3 (hybrid thinking). Template: Qwen-Qwen3-0.6B.jinja."""

    family = "qwen3"

    def _assistant_turn(self, message: dict[str, Any], *, keep_reasoning: bool, is_last: bool) -> str:
        content = message.get("content") or ""
        reasoning = message.get("reasoning_content")
        if reasoning is None:
            reasoning = ""
            if THINK_CLOSE in content:
                reasoning = content.split(THINK_CLOSE)[0].rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
                content = content.split(THINK_CLOSE)[-1].lstrip("\n")
        if keep_reasoning and (is_last or reasoning):
            out = [
                ASSISTANT_HEADER,
                THINK_OPEN,
                "\n",
                reasoning.strip("\n"),
                "\n",
                THINK_CLOSE,
                "\n\n",
                content.lstrip("\n"),
            ]
        else:
            out = [ASSISTANT_HEADER, content]
        for i, call in enumerate(message.get("tool_calls") or []):
            if (i == 0 and content) or i > 0:
                out.append("\n")
            out.append(_tool_call_text(call))
        out.append(IM_END + "\n")
        return "".join(out)

    def _template_chunks(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> list[Chunk]:
        chunks: list[Chunk] = []
        first_is_system = bool(messages) and messages[0]["role"] == "system"
        if tools:
            head = [IM_START, "system\n"]
            if first_is_system:
                head += [messages[0]["content"], "\n\n"]
            head += [TOOLS_PREAMBLE, tool_lines(tools), TOOLS_POSTAMBLE]
            chunks.append("".join(head))
        elif first_is_system:
            chunks.append(IM_START + "system\n" + messages[0]["content"] + IM_END + "\n")

        # The last "real" user query: user turns that are just wrapped tool responses don't count.
        last_query_index = len(messages) - 1
        for index in range(len(messages) - 1, -1, -1):
            m = messages[index]
            if m["role"] == "user" and not _is_wrapped_tool_response(m["content"]):
                last_query_index = index
                break

        n = len(messages)
        for index, m in enumerate(messages):
            role = m["role"]
            if role == "user" or (role == "system" and index != 0):
                chunks.append(IM_START + role + "\n" + m["content"] + IM_END + "\n")
            elif role == "assistant":
                is_last = index == n - 1
                chunks.append(
                    self._assistant_chunk(
                        m,
                        keep_reasoning=index > last_query_index,
                        is_last=is_last,
                        prefill=is_last and not add_generation_prompt,
                    )
                )
            elif role == "tool":
                _tool_response_append(chunks, messages=messages, index=index)
        if add_generation_prompt:
            chunks.append(ASSISTANT_HEADER if enable_thinking else ASSISTANT_HEADER + "<think>\n\n</think>\n\n")
        return chunks


class Qwen25Adapter(_QwenBase):
    """Qwen2.5 Instruct (no thinking). Template: Qwen-Qwen2.5-7B-Instruct.jinja."""

    family = "qwen2.5"
    supports_thinking = False

    def _assistant_turn(self, message: dict[str, Any], *, keep_reasoning: bool, is_last: bool) -> str:
        content = message.get("content") or ""
        calls = message.get("tool_calls") or []
        if not calls:
            return ASSISTANT_HEADER + content + IM_END + "\n"
        out = [IM_START, "assistant"]
        if content:
            out += ["\n", content]
        for call in calls:
            out += ["\n", _tool_call_text(call)]
        out.append(IM_END + "\n")
        return "".join(out)

    def _template_chunks(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> list[Chunk]:
        chunks: list[Chunk] = []
        first_is_system = bool(messages) and messages[0]["role"] == "system"
        system = messages[0]["content"] if first_is_system else QWEN25_DEFAULT_SYSTEM
        if tools:
            head = [IM_START, "system\n", system, "\n\n", TOOLS_PREAMBLE, tool_lines(tools), TOOLS_POSTAMBLE]
            chunks.append("".join(head))
        else:
            chunks.append(IM_START + "system\n" + system + IM_END + "\n")
        n = len(messages)
        for index, m in enumerate(messages):
            role = m["role"]
            if role == "user" or (role == "system" and index != 0):
                chunks.append(IM_START + role + "\n" + m["content"] + IM_END + "\n")
            elif role == "assistant":
                is_last = index == n - 1
                chunks.append(
                    self._assistant_chunk(
                        m, keep_reasoning=False, is_last=is_last, prefill=is_last and not add_generation_prompt
                    )
                )
            elif role == "tool":
                _tool_response_append(chunks, messages=messages, index=index)
        if add_generation_prompt:
            chunks.append(ASSISTANT_HEADER)
        return chunks


def _tool_response_append(chunks: list[Any], *, messages: list[dict[str, Any]], index: int) -> None:
    """Qwen's templates put consecutive tool messages into one user turn, each wrapped in
    <tool_response>; the turn opens with the first and closes after the last."""
    opens = index == 0 or messages[index - 1]["role"] != "tool"
    closes = index == len(messages) - 1 or messages[index + 1]["role"] != "tool"
    piece = (
        ("<|im_start|>user" if opens else "")
        + "\n<tool_response>\n"
        + messages[index]["content"]
        + "\n</tool_response>"
        + (IM_END + "\n" if closes else "")
    )
    if opens:
        chunks.append(piece)
    else:
        chunks[-1] = str(chunks[-1]) + piece

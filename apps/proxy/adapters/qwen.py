"""Qwen3 and Qwen2.5: Anthropic Messages <-> the official Qwen chat templates.

Rendering is plain Python that mirrors, branch for branch, the official templates vendored in
apps/proxy/chat_templates/ (Qwen-Qwen3-0.6B.jinja, Qwen-Qwen2.5-7B-Instruct.jinja). The tests
render the same conversations through those Jinja templates (HF's environment) and through
tml-renderers and require identical token ids; Jinja is never used at request time.

Mapping Anthropic -> template messages (`to_chat_messages`):
- `system` (string or text blocks, joined with "\\n"; cache_control ignored) -> the first
  system message. A `role: "system"` message inside `messages` (Claude Code's
  mid-conversation system) stays where it is; the template renders it in place.
- user text blocks (joined with "\\n", like vLLM's OpenAI content parts) -> a user message;
  images and other non-text blocks -> a short text note, e.g. "[image: image/png, 5120 bytes
  omitted]"; each tool_result -> a `tool` message (the template groups consecutive ones into
  one user turn of <tool_response> blocks) holding exactly the text the harness sent,
  is_error or not (the official templates have no error flag and add no marker).
- assistant thinking blocks -> reasoning_content; text -> content; tool_use ->
  tool_calls (arguments serialized by the template's tojson); redacted_thinking is dropped
  (its data is opaque).
- tools {name, description, input_schema} -> {"type": "function", "function": {name,
  description, parameters}}; tools without input_schema (Anthropic server tools) are skipped.
  tool_choice cannot be expressed in this template and is not rendered.
- thinking {"type": "disabled"} -> enable_thinking=False (the empty think block in the
  generation prompt); enabled/adaptive -> thinking on; absent -> `thinking_when_unspecified`.
- A final assistant message is a prefill: the turn is rendered as the template renders a
  last assistant message, without its closing "<|im_end|>\\n".

Exact re-rendering (sampled ids -> next request -> same ids). `parse` splits the sampled
text exactly where the template joins it (one "\\n" before the first <tool_call>, the
"\\n</think>\\n\\n" after reasoning), so when the model followed its template (the usual
case) the re-rendered turn is byte-identical. When it did not - e.g. it serialized the tool
arguments with other spacing or key order than `json.dumps(ensure_ascii=False)`, or put extra
blank lines - the canonical re-render would differ. For those turns `parse` records the sampled
ids in a `SampledTurnMemo` keyed by the sha256 of the turn's canonical text; when a later
request carries the same blocks back, `render` splices the sampled ids in place of the
re-tokenized text. This also covers non-canonical BPE splits. The memo is per adapter
(per process) and bounded; a miss (another process, evicted) falls back to the canonical
template rendering, which is what the official template would produce.
Note the template itself is not append-only: Qwen3 drops reasoning from assistant turns
before the last user query, and the empty think block of a thinking-disabled generation
prompt does not reappear in history; both follow the official template.
"""

from __future__ import annotations

import hashlib
import json
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from apps.proxy.adapters.base import ChatAdapter, ParsedOutput, RenderedPrompt, StopReason

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
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


# --- Anthropic request -> template messages ----------------------------------------------------


def _image_note(block: dict[str, Any]) -> str:
    source = block.get("source") or {}
    kind = block.get("type", "image")
    if source.get("type") == "base64":
        data = source.get("data") or ""
        size = len(data) * 3 // 4 - data[-2:].count("=")  # decoded size, without decoding it
        return f"[{kind}: {source.get('media_type', 'unknown')}, {size} bytes omitted]"
    if source.get("type") == "url":
        return f"[{kind}: {source.get('url', '')}]"
    return f"[{kind} omitted]"


def _block_text(block: dict[str, Any] | str) -> str | None:
    """Text for a user-side content block (None for blocks that render nothing)."""
    if isinstance(block, str):
        return block
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "image":
        return _image_note(block)
    if kind == "document":
        source = block.get("source") or {}
        if source.get("type") == "text":
            return str(source.get("data", ""))
        return _image_note(block)
    if kind in ("thinking", "redacted_thinking"):
        return None
    return f"[{kind} block omitted]"


def _system_text(system: Any) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    return "\n".join(t for b in system if (t := _block_text(b)) is not None)


def _tool_result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    # is_error changes nothing: every official template renders an error result like any
    # other, and harnesses already say so in the text (Claude Code's "<tool_use_error>...").
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(t for b in content if (t := _block_text(b)) is not None)


def _tool_spec(tool: dict[str, Any]) -> dict[str, Any] | None:
    if "input_schema" not in tool:
        return None  # an Anthropic server tool (web_search_..., bash_...): not a function the model can call
    function: dict[str, Any] = {"name": tool["name"]}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    function["parameters"] = tool["input_schema"]
    return {"type": "function", "function": function}


def to_chat_messages(request: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Anthropic request -> (HF-style messages, function tools) for the Qwen templates.

    Consecutive user (or assistant) content is merged into one message, as the Anthropic API
    merges consecutive same-role turns; tool_result blocks become `tool` messages in order.
    """
    messages: list[dict[str, Any]] = []
    system = _system_text(request.get("system"))
    if system:
        messages.append({"role": "system", "content": system})

    user_parts: list[str] = []

    def flush_user() -> None:
        if user_parts:
            messages.append({"role": "user", "content": "\n".join(user_parts)})
            user_parts.clear()

    for message in request.get("messages") or []:
        role = message.get("role")
        content = message.get("content")
        blocks: list[Any] = [content] if isinstance(content, str) else list(content or [])
        if role == "assistant":
            flush_user()
            if messages and messages[-1]["role"] == "assistant":
                current = messages[-1]
            else:
                current = {"role": "assistant", "content": "", "reasoning_content": "", "tool_calls": []}
                messages.append(current)
            for block in blocks:
                if isinstance(block, str):
                    current["content"] += block
                    continue
                kind = block.get("type")
                if kind == "text":
                    current["content"] += str(block.get("text", ""))
                elif kind == "thinking":
                    sep = "\n" if current["reasoning_content"] else ""
                    current["reasoning_content"] += sep + str(block.get("thinking", ""))
                elif kind == "tool_use":
                    current["tool_calls"].append(
                        {
                            "type": "function",
                            "id": block.get("id"),
                            "function": {"name": block.get("name", ""), "arguments": block.get("input", {})},
                        }
                    )
                # redacted_thinking and other assistant blocks render nothing.
        elif role == "system":
            flush_user()
            messages.append({"role": "system", "content": _system_text(content)})
        else:
            for block in blocks:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    flush_user()
                    messages.append(
                        {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": _tool_result_text(block)}
                    )
                elif (text := _block_text(block)) is not None:
                    user_parts.append(text)
    flush_user()
    for m in messages:
        if m["role"] == "assistant" and not m["tool_calls"]:
            del m["tool_calls"]  # the template tests `message.tool_calls`; keep messages minimal
    specs = [s for t in request.get("tools") or [] if (s := _tool_spec(t)) is not None]
    return messages, (specs or None)


def thinking_enabled(request: dict[str, Any], default: bool) -> bool:
    thinking = request.get("thinking")
    if not isinstance(thinking, dict) or "type" not in thinking:
        return default
    return thinking["type"] != "disabled"


# --- sampled-turn memo -------------------------------------------------------------------------


class SampledTurnMemo:
    """Bounded, thread-safe map: sha256(canonical turn text) -> the ids the model sampled.

    Only turns whose sampled ids differ from the canonical re-tokenization are stored, so it
    stays small. Replace it (adapter.memo = ...) with a shared store to span processes.
    """

    def __init__(self, max_entries: int = 4096) -> None:
        self._data: OrderedDict[str, array] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries

    @staticmethod
    def key(turn_text: str) -> str:
        return hashlib.sha256(turn_text.encode("utf-8")).hexdigest()

    def put(self, turn_text: str, ids: Sequence[int]) -> None:
        with self._lock:
            self._data[self.key(turn_text)] = array("i", ids)
            self._data.move_to_end(self.key(turn_text))
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def get(self, turn_text: str) -> list[int] | None:
        with self._lock:
            ids = self._data.get(self.key(turn_text))
        return None if ids is None else list(ids)

    def __len__(self) -> int:
        return len(self._data)


# --- rendering ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Splice:
    """An assistant turn whose ids come from the memo instead of re-tokenization."""

    text: str  # the full chunk text ("<|im_start|>assistant\n" ... "<|im_end|>\n")
    body_ids: list[int]


class _ChunkCache:
    """Token ids of prompt chunks, bounded by total ids.

    Every chunk starts at an "<|im_start|>" (an added token, so the tokenizer always splits
    there): tokenizing chunks separately gives exactly the ids of tokenizing the whole prompt.
    Claude Code resends the same ~20K-token system+tools chunk and history every turn, so only
    the new turns are tokenized.
    """

    def __init__(self, max_ids: int = 4_000_000) -> None:
        self._data: OrderedDict[str, array] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.max_ids = max_ids

    def get(self, chunk: str) -> array | None:
        with self._lock:
            ids = self._data.get(chunk)
            if ids is not None:
                self._data.move_to_end(chunk)
            return ids

    def put(self, chunk: str, ids: list[int]) -> None:
        if len(ids) > self.max_ids // 4:
            return
        with self._lock:
            if chunk in self._data:
                return
            self._data[chunk] = array("i", ids)
            self._size += len(ids)
            while self._size > self.max_ids:
                _, old = self._data.popitem(last=False)
                self._size -= len(old)


class _QwenBase(ChatAdapter):
    supports_thinking = True

    def __init__(
        self, *, tokenizer: Any, memo: SampledTurnMemo | None = None, thinking_when_unspecified: bool = True
    ) -> None:
        super().__init__(tokenizer=tokenizer)
        self.memo = memo if memo is not None else SampledTurnMemo()
        self.thinking_when_unspecified = thinking_when_unspecified
        self._chunks = _ChunkCache()
        self.im_end_id = self._single_id(IM_END)
        self.endoftext_id = self._single_id("<|endoftext|>")
        self._header_ids = self.encode(ASSISTANT_HEADER)
        self._im_end_nl_ids = self.encode(IM_END + "\n")

    def _single_id(self, token: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(f"{token!r} is not in this tokenizer: wrong family?")
        return int(token_id)

    def stop_token_ids(self) -> list[int]:
        return [self.im_end_id, self.endoftext_id]

    # Subclasses: the template, message by message, as a list of chunks.
    def _render_chunks(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> list[str | _Splice]:
        raise NotImplementedError

    def _assistant_turn(self, message: dict[str, Any], *, keep_reasoning: bool, is_last: bool) -> str:
        """The template's text for one assistant message, "<|im_start|>assistant..." to "<|im_end|>\\n"."""
        raise NotImplementedError

    def render(self, *, request: dict[str, Any]) -> RenderedPrompt:
        messages, tools = to_chat_messages(request)
        prefill = bool(messages) and messages[-1]["role"] == "assistant"
        chunks = self._render_chunks(
            messages,
            tools,
            add_generation_prompt=not prefill,
            enable_thinking=thinking_enabled(request, self.thinking_when_unspecified),
        )
        return RenderedPrompt(
            text="".join(c.text if isinstance(c, _Splice) else c for c in chunks),
            token_ids=self._tokenize_chunks(chunks),
        )

    def _tokenize_chunks(self, chunks: list[str | _Splice]) -> list[int]:
        found: dict[str, Any] = {}
        missing: list[str] = []
        for chunk in chunks:
            if isinstance(chunk, str) and chunk not in found:
                ids = self._chunks.get(chunk)
                if ids is None:
                    missing.append(chunk)
                    found[chunk] = None
                else:
                    found[chunk] = ids
        if missing:
            # One call into the Rust tokenizer for everything new (it parallelizes the batch).
            encoded = (
                self.tokenizer.encode_batch(missing, add_special_tokens=False)
                if len(missing) > 1
                else [self.tokenizer.encode(missing[0], add_special_tokens=False)]
            )
            for chunk, enc in zip(missing, encoded, strict=True):
                found[chunk] = enc.ids
                self._chunks.put(chunk, enc.ids)
        out: list[int] = []
        for chunk in chunks:
            if isinstance(chunk, _Splice):
                out += self._header_ids
                out += chunk.body_ids
                out += self._im_end_nl_ids
            else:
                out += found[chunk]
        return out

    def _assistant_chunk(
        self, message: dict[str, Any], *, keep_reasoning: bool, is_last: bool, prefill: bool
    ) -> str | _Splice:
        turn = self._assistant_turn(message, keep_reasoning=keep_reasoning, is_last=is_last)
        if prefill:
            # Continue the final message: drop the template's closing "<|im_end|>\n".
            return turn.removesuffix(IM_END + "\n")
        if turn.startswith(ASSISTANT_HEADER) and turn.endswith(IM_END + "\n"):
            sampled = self.memo.get(turn)
            if sampled is not None:
                return _Splice(turn, sampled)
        return turn

    # --- parsing ------------------------------------------------------------------------------

    def parse(
        self, *, token_ids: list[int], stopped: bool, id_seed: str = "", tools: list[dict[str, Any]] | None = None
    ) -> ParsedOutput:
        """Sampled ids -> Anthropic blocks. Never raises on model output.

        `id_seed` (e.g. the request id) makes tool_use ids unique across identical outputs;
        ids are "toolu_" + a hash of (seed, the sampled ids, the call's position).
        """
        ids = list(token_ids)
        body_ids = ids[:-1] if stopped and ids and ids[-1] in self.stop_token_ids() else ids
        text = self.decode(body_ids)
        errors: list[str] = []
        blocks: list[dict[str, Any]] = []
        reasoning, rest = self._split_thinking(text) if self.supports_thinking else (None, text)
        if reasoning:
            blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        digest = hashlib.sha256(id_seed.encode("utf-8") + b"\0" + array("i", body_ids).tobytes()).hexdigest()
        calls = self._parse_tool_calls(rest, stopped=stopped, digest=digest, blocks=blocks, errors=errors)
        stop_reason: StopReason = "max_tokens" if not stopped else ("tool_use" if calls else "end_turn")
        parsed = ParsedOutput(blocks=blocks, stop_reason=stop_reason, parse_errors=errors)
        self._remember(parsed.blocks, body_ids)
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
                blocks.append({"type": "text", "text": text})
            return 0
        # The template writes content + "\n" + "<tool_call>": take that "\n" back off.
        lead = text[:first]
        lead = lead[:-1] if lead.endswith("\n") else lead
        if lead.strip():
            blocks.append({"type": "text", "text": lead})
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
                blocks.append({"type": "text", "text": raw})
            else:
                tool_id = "toolu_" + hashlib.sha256(f"{digest}:{index}".encode()).hexdigest()[:24]
                blocks.append({"type": "tool_use", "id": tool_id, "name": call[0], "input": call[1]})
                calls += 1
            index += 1
            pos = text.find(TOOL_CALL_OPEN, raw_end)
            between = text[raw_end:] if pos == -1 else text[raw_end:pos]
            if between.strip():
                blocks.append({"type": "text", "text": between})
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

    def _blocks_message(self, blocks: list[dict[str, Any]]) -> dict[str, Any]:
        messages, _ = to_chat_messages({"messages": [{"role": "assistant", "content": blocks}]})
        return messages[0] if messages else {"role": "assistant", "content": "", "reasoning_content": ""}

    def _remember(self, blocks: list[dict[str, Any]], body_ids: list[int]) -> None:
        """Record sampled ids whose canonical re-render would tokenize differently."""
        turn = self._assistant_turn(self._blocks_message(blocks), keep_reasoning=True, is_last=False)
        if not (turn.startswith(ASSISTANT_HEADER) and turn.endswith(IM_END + "\n")):
            return
        # What the prompt would hold after a generation-prompt header: header + sampled + end.
        if self.encode(turn) != self._header_ids + body_ids + self._im_end_nl_ids:
            self.memo.put(turn, body_ids)

    def render_assistant(self, blocks: list[dict[str, Any]]) -> list[int]:
        """Ids of an assistant turn as the next request re-renders it (after the header
        "<|im_start|>assistant\\n", up to and including <|im_end|>): for a turn the model just
        sampled this equals the sampled ids (plus the stop token) when the round trip is exact."""
        chunk = self._assistant_chunk(self._blocks_message(blocks), keep_reasoning=True, is_last=False, prefill=False)
        if isinstance(chunk, _Splice):
            return chunk.body_ids + [self.im_end_id]
        ids = self.encode(chunk)
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

    def _render_chunks(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> list[str | _Splice]:
        chunks: list[str | _Splice] = []
        first_is_system = bool(messages) and messages[0]["role"] == "system"
        if tools:
            head = [IM_START, "system\n"]
            if first_is_system:
                head += [messages[0]["content"], "\n\n"]
            head.append(TOOLS_PREAMBLE)
            for tool in tools:
                head += ["\n", tojson(tool)]
            head.append(TOOLS_POSTAMBLE)
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

    def _render_chunks(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> list[str | _Splice]:
        chunks: list[str | _Splice] = []
        first_is_system = bool(messages) and messages[0]["role"] == "system"
        system = messages[0]["content"] if first_is_system else QWEN25_DEFAULT_SYSTEM
        if tools:
            head = [IM_START, "system\n", system, "\n\n", TOOLS_PREAMBLE]
            for tool in tools:
                head += ["\n", tojson(tool)]
            head.append(TOOLS_POSTAMBLE)
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

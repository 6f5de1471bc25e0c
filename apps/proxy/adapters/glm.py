"""GLM-4.5 / GLM-4.6: Anthropic Messages <-> Zhipu's GLM-4.6 chat template.

Template followed: apps/proxy/chat_templates/GLM-4.6.jinja (llama.cpp's copy of the official
GLM-4.6 template). Its only change from the official file is in the tool-call block
(`tc.arguments or {}` plus a raise_exception on non-object arguments), which renders the
same text for the object arguments we always pass; the rest is textually identical to the
GLM-4.5/4.6 template quoted in a public test file. GLM-4.5
and GLM-4.6 share the tokenizer (same published tokenizer.json hash), and we use this one
template for both.

Evidence, honestly: the rendering is tested token for token against that template rendered
with Jinja in transformers' environment. There is no independent renderer for GLM-4.x to
compare with: tml-renderers' GLM renderers and tinker-cookbook's glm5_3 are GLM-5 (another
vocabulary, no newlines after role tokens, a reasoning-effort system block), so they are not
a reference for this format.

Format:
    [gMASK]<sop><|system|>\\n# Tools ... <tools>\\n{tool json}\\n...</tools> ...</tool_call>   (if tools)
    <|system|>\\n{system}<|user|>\\n{text}[/nothink]
    <|assistant|>\\n<think>{reasoning}</think>\\n{text}
    <tool_call>{name}\\n<arg_key>{k}</arg_key>\\n<arg_value>{v}</arg_value>\\n</tool_call>
    <|observation|>\\n<tool_response>\\n{result}\\n</tool_response>...
    <|assistant|>                                      (generation prompt; + "\\n<think></think>"
                                                        when thinking is disabled)
An assistant turn has no end token: the model ends it by sampling <|user|> or
<|observation|> (the stop tokens, with <|endoftext|>), which the next prompt's next turn
starts with, so a sampled turn reappears whole in the next prompt.

Decisions (tested):
- Reasoning is kept for assistant turns after the last user message (the tool loop) and
  replaced by "<think></think>" before it, as the template does. Claude Code sends text
  blocks after tool results in the same user message (system reminders); those become user
  messages and end the "tool loop" for the template's purposes.
- thinking {"type": "disabled"} -> the template's enable_thinking=False: "/nothink" after
  each user message and "\\n<think></think>" in the generation prompt. Absent, enabled or
  adaptive -> thinking on (the template's default).
- Mid-conversation system messages are rendered where they stand ("<|system|>\\n...").
- Tool arguments: strings are written raw, other values as `tojson` (json.dumps,
  ensure_ascii=False). Parsing reverses this: a value is a string when the tool's
  input_schema says so (pass `tools=` to `parse`), otherwise JSON if it parses as a
  non-string JSON value, else the raw text. Without the schema a string argument that looks
  like JSON ("42", "true") comes back as a number/boolean: give `parse` the request's tools.
- A final assistant message (prefill) is rendered as the template renders it (the template
  writes nothing after an assistant turn).
"""

from __future__ import annotations

import json
import re
from typing import Any

from apps.proxy.adapters.base import ParsedOutput
from apps.proxy.adapters.messages import thinking_enabled, to_chat_messages
from apps.proxy.adapters.render_cache import rendered_by_value
from apps.proxy.adapters.template_base import (
    Chunk,
    TemplateAdapter,
    assistant_message,
    text_block,
    thinking_block,
)

PREFIX = "[gMASK]<sop>"
SYSTEM = "<|system|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
OBSERVATION = "<|observation|>"
ENDOFTEXT = "<|endoftext|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
NOTHINK = "/nothink"
EMPTY_THINK = "\n" + THINK_OPEN + THINK_CLOSE

TOOLS_PREAMBLE = (
    "\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_POSTAMBLE = (
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML "
    "format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n"
    "<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>"
)

_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


@rendered_by_value
def tool_lines(tools: list[dict[str, Any]]) -> str:
    """The tools of the system turn: a line of `tojson` each."""
    return "".join(tojson(tool) + "\n" for tool in tools)


def tool_calls_text(calls: list[dict[str, Any]]) -> str:
    out: list[str] = []
    for call in calls:
        fn = call.get("function") or call
        arguments = fn.get("arguments") or {}
        if isinstance(arguments, str):
            arguments = json.loads(arguments)  # the template requires a mapping
        out.append("\n" + TOOL_CALL_OPEN + fn["name"] + "\n")
        for key, value in arguments.items():
            out.append(
                f"<arg_key>{key}</arg_key>\n<arg_value>{value if isinstance(value, str) else tojson(value)}"
                "</arg_value>\n"
            )
        out.append(TOOL_CALL_CLOSE)
    return "".join(out)


def _schema_types(tools: list[dict[str, Any]] | None, name: str) -> dict[str, set[str]]:
    """Property name -> JSON types declared for it by the tool's input_schema."""
    for tool in tools or []:
        if tool.get("name") == name or (tool.get("function") or {}).get("name") == name:
            schema = tool.get("input_schema") or (tool.get("function") or {}).get("parameters") or {}
            props = schema.get("properties") or {}
            types: dict[str, set[str]] = {}
            for key, prop in props.items():
                declared = prop.get("type") if isinstance(prop, dict) else None
                if isinstance(declared, str):
                    types[key] = {declared}
                elif isinstance(declared, list):
                    types[key] = {t for t in declared if isinstance(t, str)}
            return types
    return {}


def argument_value(raw: str, declared: set[str] | None) -> Any:
    """Inverse of the template's `v if v is string else v | tojson`."""
    if declared is not None and "string" in declared:
        return raw
    try:
        value = json.loads(raw.strip())
    except ValueError:
        return raw
    return raw if isinstance(value, str) else value


class GlmAdapter(TemplateAdapter):
    """GLM-4.5 / GLM-4.6 (hybrid thinking). See the module docstring."""

    family = "glm-4.5"
    stop_tokens = (ENDOFTEXT, USER, OBSERVATION)

    def __init__(self, *, tokenizer: Any, thinking_when_unspecified: bool = True, **kwargs: Any) -> None:
        super().__init__(tokenizer=tokenizer, **kwargs)
        self.thinking_when_unspecified = thinking_when_unspecified
        self.observation_id = self.token_id(OBSERVATION)
        self._empty_think_ids = self.encode(EMPTY_THINK)

    # --- rendering ---------------------------------------------------------------------------

    @staticmethod
    def _body(message: dict[str, Any], *, keep_reasoning: bool) -> str:
        """An assistant turn after "<|assistant|>" (the turn has no end token)."""
        reasoning = message.get("reasoning_content") or ""
        content = (message.get("content") or "").strip()
        out = "\n" + THINK_OPEN + (reasoning.strip() if keep_reasoning and reasoning else "") + THINK_CLOSE
        if content:
            out += "\n" + content
        return out + tool_calls_text(message.get("tool_calls") or [])

    def _chunks(self, request: dict[str, Any]) -> list[Chunk]:
        messages, tools = to_chat_messages(request)
        prefill = bool(messages) and messages[-1]["role"] == "assistant"
        nothink = not thinking_enabled(request, self.thinking_when_unspecified)
        head = PREFIX
        if tools:
            head += SYSTEM + TOOLS_PREAMBLE + tool_lines(tools) + TOOLS_POSTAMBLE
        chunks: list[Chunk] = [head]
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
        for index, m in enumerate(messages):
            role = m["role"]
            if role == "user":
                content = m["content"]
                if nothink and not content.endswith(NOTHINK):
                    content += NOTHINK
                chunks.append(USER + "\n" + content)
            elif role == "assistant":
                chunks.append(self._turn(ASSISTANT, self._body(m, keep_reasoning=index > last_user)))
            elif role == "tool":
                piece = "\n<tool_response>\n" + m["content"] + "\n</tool_response>"
                if index > 0 and messages[index - 1]["role"] == "tool":
                    # Continues the previous observation chunk (this piece starts with "\n",
                    # not with an added token, so it may not start a chunk of its own).
                    chunks[-1] = str(chunks[-1]) + piece  # a tool chunk: always text, never a splice
                else:
                    chunks.append(OBSERVATION + piece)
            else:
                chunks.append(SYSTEM + "\n" + m["content"])
        if not prefill:
            chunks.append(ASSISTANT + (EMPTY_THINK if nothink else ""))
        return chunks

    # --- parsing -----------------------------------------------------------------------------

    def parse(
        self, *, token_ids: list[int], stopped: bool, id_seed: str = "", tools: list[dict[str, Any]] | None = None
    ) -> ParsedOutput:
        """`tools`: the request's tools (Anthropic or OpenAI shape), to type arguments by schema."""
        body_ids, stop_id = self._split_stop(token_ids, stopped)
        text = self.decode(body_ids)
        blocks: list[dict[str, Any]] = []
        errors: list[str] = []
        rest = text
        thought = False
        if THINK_CLOSE in text:
            before, _, rest = text.partition(THINK_CLOSE)
            reasoning = before.split(THINK_OPEN)[-1].strip()
            thought = True
        elif THINK_OPEN in text:  # still reasoning when sampling stopped
            reasoning, rest = text.split(THINK_OPEN, 1)[1].strip(), ""
            thought = True
        if thought and reasoning:
            blocks.append(thinking_block(reasoning))
        calls = self._parse_calls(
            rest, stopped=stopped, digest=self._digest(id_seed, body_ids), tools=tools, blocks=blocks, errors=errors
        )
        if stop_id == self.observation_id and not errors:
            # Tool results follow, so the next request renders this turn with its reasoning.
            # Without a think block the prompt ended with "\n<think></think>" (thinking off).
            message = assistant_message(blocks)
            sampled = body_ids if thought else self._empty_think_ids + body_ids
            self._remember(self._body(message, keep_reasoning=True), sampled)
        return ParsedOutput(blocks=blocks, stop_reason=self._stop_reason(stopped, calls), parse_errors=errors)

    def _parse_calls(
        self,
        text: str,
        *,
        stopped: bool,
        digest: str,
        tools: list[dict[str, Any]] | None,
        blocks: list[dict[str, Any]],
        errors: list[str],
    ) -> int:
        start = text.find(TOOL_CALL_OPEN)
        if start == -1:
            if text.strip():
                blocks.append(text_block(text.strip()))
            return 0
        if text[:start].strip():
            blocks.append(text_block(text[:start].strip()))
        calls = 0
        index = 0
        pos = start
        while pos != -1:
            close = text.find(TOOL_CALL_CLOSE, pos)
            raw_end = len(text) if close == -1 else close + len(TOOL_CALL_CLOSE)
            raw = text[pos:raw_end]
            if close == -1 and not stopped:
                call, error = None, "tool call not closed (output truncated)"
            else:
                call, error = self._parse_one(
                    text[pos + len(TOOL_CALL_OPEN) : len(text) if close == -1 else close], tools
                )
            if call is None:
                errors.append(f"tool call {index}: {error}")
                blocks.append(text_block(raw))
            else:
                blocks.append(
                    {"type": "tool_use", "id": self._tool_use_id(digest, index), "name": call[0], "input": call[1]}
                )
                calls += 1
            index += 1
            pos = text.find(TOOL_CALL_OPEN, raw_end)
            between = text[raw_end:] if pos == -1 else text[raw_end:pos]
            if between.strip():
                blocks.append(text_block(between.strip()))
        return calls

    @staticmethod
    def _parse_one(
        body: str, tools: list[dict[str, Any]] | None
    ) -> tuple[tuple[str, dict[str, Any]] | None, str | None]:
        first_arg = body.find("<arg_key>")
        name = (body if first_arg == -1 else body[:first_arg]).strip()
        if not name or any(c.isspace() for c in name) or "<" in name or "{" in name:
            return None, f"bad function name {name[:80]!r}"
        args_text = "" if first_arg == -1 else body[first_arg:]
        leftover = _ARG.sub("", args_text)
        if leftover.strip():
            return None, f"unexpected text among the arguments: {leftover.strip()[:80]!r}"
        types = _schema_types(tools, name)
        arguments = {
            key.strip(): argument_value(value, types.get(key.strip()) if types else None)
            for key, value in _ARG.findall(args_text)
        }
        return (name, arguments), None

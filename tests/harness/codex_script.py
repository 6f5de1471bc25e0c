"""The scripted model behind the Codex end-to-end test: a chooser for ScriptedSampler.

Like tests/harness/script.py for Claude Code, it decides from the rendered prompt alone and
answers in Qwen3's native markup (a think block, then ``<tool_call>`` JSON or text, then
``<|im_end|>``):

* the task's instruction and no tool result yet: an ``exec_command`` call (Codex's shell
  tool) that writes /app/out.txt;
* after the tool's result: a final text;
* any other call: a short text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

TASK_MARKER = "HARNESS-CODEX-TASK-7d41"
OUT_PATH = "/app/out.txt"
SHELL_TOOL = "exec_command"
SHELL_ARGUMENTS = {"cmd": f"echo ok > {OUT_PATH}"}
FINAL_TEXT = "Done: /app/out.txt holds ok."
OTHER_TEXT = "ok"
END = "<|im_end|>"


def reply(prompt: str) -> str:
    """The completion text for a rendered prompt."""
    if TASK_MARKER not in prompt:
        return OTHER_TEXT + END
    if "<tool_response>" in prompt:
        return "<think>\nThe file is written.\n</think>\n\n" + FINAL_TEXT + END
    # The template's own serialization (tojson = json.dumps, keys in order), so the turn
    # re-renders byte for byte on the next call.
    call = json.dumps({"name": SHELL_TOOL, "arguments": SHELL_ARGUMENTS}, ensure_ascii=False)
    return "<think>\nWrite the file with the shell.\n</think>\n\n<tool_call>\n" + call + "\n</tool_call>" + END


def choose(prompt_ids: Sequence[int]) -> list[int]:
    """ScriptedSampler's ``choose``: prompt ids -> the token ids of :func:`reply`."""
    from apps.proxy.tokenizers import tokenizer_load

    tokenizer = tokenizer_load("qwen3")
    prompt = tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
    return tokenizer.encode(reply(prompt), add_special_tokens=False).ids

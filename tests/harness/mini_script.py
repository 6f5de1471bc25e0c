"""The scripted model behind the mini-swe-agent end-to-end test: a chooser for ScriptedSampler.

mini-swe-agent 2.x, as the platform runs it (its default ``mini.yaml`` and tool-call model
class), acts through one function tool, ``bash``, and finishes when a command's output
starts with ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``. So the script answers in Qwen3's native
tool-call markup (a think block, then ``<tool_call>`` JSON, then ``<|im_end|>``):

* the first call (the task's instruction, no tool result yet): bash writes /app/out.txt;
* after that result: bash runs the submission command;
* any other call: a short text (mini-swe-agent would answer it with a format error).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

TASK_MARKER = "HARNESS-TASK-MSA-5d1e"
OUT_PATH = "/app/out.txt"
WRITE_COMMAND = f"echo ok > {OUT_PATH}"
SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
END = "<|im_end|>"


def _tool_call(command: str) -> str:
    # The template's own serialization (tojson = json.dumps, keys in order), so the turn
    # re-renders byte for byte on the next call.
    return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "\n</tool_call>"


def _think(text: str) -> str:
    return f"<think>\n{text}\n</think>\n\n"


def reply(prompt: str) -> str:
    """The completion text for a rendered prompt."""
    if TASK_MARKER not in prompt:
        return "ok" + END
    if "<tool_response>" in prompt:
        return _think("The file is written; submit.") + _tool_call(SUBMIT_COMMAND) + END
    return _think("Write the file with bash.") + _tool_call(WRITE_COMMAND) + END


def choose(prompt_ids: Sequence[int]) -> list[int]:
    """ScriptedSampler's ``choose``: prompt ids -> the token ids of :func:`reply`."""
    from apps.proxy.tokenizers import tokenizer_load

    tokenizer = tokenizer_load("qwen3")
    prompt = tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
    return tokenizer.encode(reply(prompt), add_special_tokens=False).ids

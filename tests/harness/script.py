"""The scripted model behind the Claude Code end-to-end test: a chooser for ScriptedSampler.

The proxy runs in its own process, so the script is named by a module path in the route's
sampler config (``{"choose": "tests.harness.script:choose"}``, resolved by
tests/harness/proxy_server.py) and decides from the prompt alone. It answers in Qwen3's
native markup (a think block, then ``<tool_call>`` JSON or text, then ``<|im_end|>``):

* the main agent's first call (the task's instruction, no tool result yet): a Bash tool call
  that writes /app/out.txt;
* the main agent after the Bash result: an Agent tool call (a delegated, foreground
  sub-agent) whose prompt carries :data:`SUBAGENT_MARKER`;
* the sub-agent (its prompt carries the marker; its conversation has no Agent call): a final
  text report;
* the main agent after the Agent result: a final text;
* any other call Claude Code makes (none are expected with nonessential traffic off): a
  short text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

TASK_MARKER = "HARNESS-TASK-3b1f"
SUBAGENT_MARKER = "HARNESS-SUBAGENT-9c2e"
OUT_PATH = "/app/out.txt"
BASH_INPUT = {"command": f"echo ok > {OUT_PATH}", "description": "Write ok to the output file"}
AGENT_INPUT = {
    "description": "Check the output file",
    "prompt": f"{SUBAGENT_MARKER}: confirm that {OUT_PATH} exists, then report back in one sentence.",
    "subagent_type": "general-purpose",
    "run_in_background": False,
}
SUBAGENT_REPORT = "The output file is in place."
FINAL_TEXT = "Done: /app/out.txt holds ok, and the sub-agent confirmed it."
OTHER_TEXT = "ok"
AGENT_CALL_PREFIX = '<tool_call>\n{"name": "Agent"'
END = "<|im_end|>"


def _tool_call(name: str, arguments: dict) -> str:
    # The template's own serialization (tojson = json.dumps, keys in order), so the turn
    # re-renders byte for byte on the next call.
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def _think(text: str) -> str:
    return f"<think>\n{text}\n</think>\n\n"


def reply(prompt: str) -> str:
    """The completion text for a rendered prompt."""
    if SUBAGENT_MARKER in prompt and AGENT_CALL_PREFIX not in prompt:
        return _think("The file was written by the main agent.") + SUBAGENT_REPORT + END
    if TASK_MARKER in prompt:
        if AGENT_CALL_PREFIX in prompt:
            return _think("The sub-agent confirmed it.") + FINAL_TEXT + END
        if "<tool_response>" in prompt:
            return _think("Now delegate the check.") + _tool_call("Agent", AGENT_INPUT) + END
        return _think("Write the file with Bash.") + _tool_call("Bash", BASH_INPUT) + END
    return OTHER_TEXT + END


def _tokenizer():
    from apps.proxy.tokenizers import tokenizer_load

    return tokenizer_load("qwen3")


def choose(prompt_ids: Sequence[int]) -> list[int]:
    """ScriptedSampler's ``choose``: prompt ids -> the token ids of :func:`reply`."""
    tokenizer = _tokenizer()
    prompt = tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
    return tokenizer.encode(reply(prompt), add_special_tokens=False).ids

"""Claude-Code-shaped Messages requests for benches: what the proxy really receives.

The shape follows what Claude Code was seen to send to a local endpoint: `system` as 3 text blocks of about 6 KB, 24
tool definitions of about 64 KB of JSON, `thinking: {"type": "adaptive"}`,
`output_config`, `context_management`, `metadata.user_id` as a JSON string,
`cache_control` on blocks, and a conversation that grows by tool cycles: an assistant
turn (thinking, a line of text, one or two tool_use blocks) answered by a user turn of
tool_result blocks (file reads in `cat -n` form, command output, search hits).

The text is written for this project (tool descriptions, guidance, code) and generated
deterministically from a seed, so two runs with one seed send byte-identical requests.
Nothing here talks to a network or needs Django. The pieces live in bench/claude_code/: the
hand-written prose (prose.py) and tool definitions (tools.py), the seeded text built from
them (text.py) and the conversation (conversation.py); this module is their entry point.

    conv = Conversation(seed=0)
    body = conv.request()                # the body of the next call
    blocks = conv.assistant_blocks()      # what the "model" answers on this call
    conv.advance(blocks)                  # append that answer and the tool results

    small = Conversation(seed=1, size="small")   # a short system, 4 small tools (load tests)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if not __package__:  # run as a script (bench/ is sys.path[0]): make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.claude_code.conversation import BETAS, MODEL, Conversation, body_bytes  # noqa: E402
from bench.claude_code.prose import PROJECT  # noqa: E402
from bench.claude_code.text import code_lines, memory_reminder, system_blocks, tool_definitions  # noqa: E402
from bench.claude_code.tools import SMALL_TOOL_NAMES, TOOLS  # noqa: E402

__all__ = [
    "BETAS",
    "MODEL",
    "PROJECT",
    "SMALL_TOOL_NAMES",
    "TOOLS",
    "Conversation",
    "body_bytes",
    "code_lines",
    "memory_reminder",
    "system_blocks",
    "tool_definitions",
]


if __name__ == "__main__":  # a quick look at the sizes
    conv = Conversation(seed=0)
    req = conv.request()
    print(
        f"system {len(json.dumps(req['system']))} B in {len(req['system'])} blocks; "
        f"tools {len(json.dumps(req['tools']))} B in {len(req['tools'])} definitions; body {body_bytes(req)} B"
    )
    for _ in range(20):
        conv.advance()
    print(f"after 20 turns: {len(conv.messages)} messages, body {body_bytes(conv.request())} B")

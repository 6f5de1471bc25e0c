"""The conversation: a Claude Code session whose call k+1 is call k plus the model's answer
and the tool results, generated from one seed."""

from __future__ import annotations

import json
import random
import string
from typing import Any

from bench.claude_code.prose import GUIDELINES, PACKAGES, PROJECT, REASONING, TEXT_LINES
from bench.claude_code.text import (
    camel,
    cat_n,
    code_lines,
    ident,
    memory_reminder,
    sentence,
    source_file,
    system_blocks,
    tool_definitions,
)
from bench.claude_code.tools import SMALL_TOOL_NAMES

MODEL = "claude-sonnet-4-5-20250929"
BETAS = (
    "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
    "fine-grained-tool-streaming-2025-05-14"
)

TOOL_WEIGHTS = [
    ("Read", 30),
    ("Bash", 24),
    ("Grep", 12),
    ("Glob", 5),
    ("Edit", 15),
    ("TodoWrite", 5),
    ("Write", 3),
    ("Agent", 2),
    ("WebFetch", 2),
    ("MultiEdit", 2),
]


def _tool_id(rng: random.Random) -> str:
    return "toolu_01" + "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(22))


class Conversation:
    """A Claude Code session: call k+1 is call k plus the answer and the tool results.

    size "claude-code": the full system (~6 KB), 24 tools (~64 KB) and a memory reminder
    (`memory_bytes`) in the first user turn; "small": a short system and 4 small tools.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        size: str = "claude-code",
        tools_bytes: int = 62_500,
        system_bytes: int = 6_000,
        memory_bytes: int = 8_000,
        result_scale: float = 1.0,
    ) -> None:
        if size not in ("claude-code", "small"):
            raise ValueError("size must be claude-code or small")
        self.rng = random.Random(seed)
        self.size = size
        self.result_scale = result_scale if size == "claude-code" else 0.05
        r = self.rng.getrandbits
        self.session_id = f"{r(32):08x}-{r(16):04x}-4{r(12):03x}-a{r(12):03x}-{r(48):012x}"
        if size == "claude-code":
            self.system = system_blocks(total_bytes=system_bytes)
            self.tools = tool_definitions(total_bytes=tools_bytes)
            first = [
                {"type": "text", "text": memory_reminder(self.rng, total_bytes=memory_bytes)},
                {
                    "type": "text",
                    "text": "The session cache returns stale entries after a user logs out. "
                    "Find the cause, fix it, and add a regression test.",
                },
            ]
        else:
            self.system = [{"type": "text", "text": "You are a coding agent. Be brief."}]
            self.tools = tool_definitions(total_bytes=2_000, names=SMALL_TOOL_NAMES)
            first = [{"type": "text", "text": "List the files, then fix the failing test."}]
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
        self.turn = 0

    # -- what is sent ------------------------------------------------------------------------

    def request(self, *, stream: bool = True, max_tokens: int = 32_000, model: str = MODEL) -> dict[str, Any]:
        """The next call's body. The last block of the last message carries cache_control,
        as Claude Code marks it (a copy: the stored history is left unmarked)."""
        messages = list(self.messages)
        last = dict(messages[-1])
        content = [dict(b) for b in last["content"]]
        content[-1]["cache_control"] = {"type": "ephemeral"}
        last["content"] = content
        messages[-1] = last
        return {
            "model": model,
            "messages": messages,
            "system": self.system,
            "tools": self.tools,
            "metadata": {"user_id": json.dumps({"device_id": "bench", "session_id": self.session_id})},
            "max_tokens": max_tokens,
            "thinking": {"type": "adaptive"},
            "output_config": {"effort": "high"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "stream": stream,
        }

    def headers(self, agent_id: str = "") -> dict[str, str]:
        out = {
            "anthropic-version": "2023-06-01",
            "anthropic-beta": BETAS,
            "x-app": "cli",
            "x-claude-code-session-id": self.session_id,
        }
        if agent_id:
            out["x-claude-code-agent-id"] = agent_id
        return out

    # -- what the model answers --------------------------------------------------------------

    def _tool_input(self, name: str) -> dict[str, Any]:
        rng = self.rng
        if name == "Read":
            return {"file_path": source_file(rng)}
        if name == "Bash":
            cmd = rng.choice(
                [
                    f"cd {PROJECT} && python -m pytest -q tests/test_{ident(rng, 1)}.py",
                    "git status && git diff --stat",
                    f"ls -la {PROJECT}/src/{rng.choice(PACKAGES)}",
                    f"python -m ruff check src/{rng.choice(PACKAGES)}",
                ]
            )
            return {
                "command": cmd,
                "description": rng.choice(["Run the tests", "Show changes", "List the package", "Lint"]),
            }
        if name == "Grep":
            return {
                "pattern": f"def {ident(rng)}|{camel(rng)}",
                "path": f"{PROJECT}/src",
                "output_mode": "content",
                "-n": True,
            }
        if name == "Glob":
            return {"pattern": f"src/{rng.choice(PACKAGES)}/**/*.py"}
        if name == "Edit":
            return {
                "file_path": source_file(rng),
                "old_string": "\n".join(code_lines(rng, 3)[-3:]),
                "new_string": "\n".join(code_lines(rng, 4)[-4:]),
            }
        if name == "MultiEdit":
            return {
                "file_path": source_file(rng),
                "edits": [
                    {"old_string": f"{ident(rng)} = None", "new_string": f"{ident(rng)} = {{}}"} for _ in range(3)
                ],
            }
        if name == "Write":
            return {"file_path": f"{PROJECT}/tests/test_{ident(rng)}.py", "content": "\n".join(code_lines(rng, 30))}
        if name == "TodoWrite":
            states = ["completed"] * rng.randint(0, 2) + ["in_progress"] + ["pending"] * rng.randint(1, 3)
            return {
                "todos": [
                    {
                        "content": f"Fix the {ident(rng)} handling",
                        "status": s,
                        "activeForm": f"Fixing the {ident(rng)} handling",
                    }
                    for s in states
                ]
            }
        if name == "Agent":
            return {
                "description": "Find cache invalidation",
                "subagent_type": "explorer",
                "prompt": " ".join(
                    rng.choice(REASONING).format(fn="logout()", file="session_cache.py", n=40) for _ in range(3)
                ),
            }
        if name == "WebFetch":
            return {"url": "https://docs.example.org/cache/invalidation", "prompt": "How are entries invalidated?"}
        return {}

    def assistant_blocks(self) -> list[dict[str, Any]]:
        """The model's answer to the current call: thinking, text, one or two tool calls."""
        rng = self.rng
        if self.size == "small":
            return [{"type": "tool_use", "id": _tool_id(rng), "name": "Bash", "input": {"command": "ls"}}]
        blocks: list[dict[str, Any]] = []
        if rng.random() < 0.6:
            thinking = " ".join(sentence(rng, REASONING) for _ in range(rng.randint(2, 8)))
            blocks.append(
                {
                    "type": "thinking",
                    "thinking": thinking,
                    "signature": "sig" + "".join(rng.choice(string.ascii_letters) for _ in range(60)),
                }
            )
        if rng.random() < 0.5:
            blocks.append({"type": "text", "text": rng.choice(TEXT_LINES)})
        names, weights = zip(*TOOL_WEIGHTS, strict=True)
        name = rng.choices(names, weights)[0]
        blocks.append({"type": "tool_use", "id": _tool_id(rng), "name": name, "input": self._tool_input(name)})
        if name in ("Read", "Grep", "Glob") and rng.random() < 0.25:  # parallel calls
            blocks.append({"type": "tool_use", "id": _tool_id(rng), "name": name, "input": self._tool_input(name)})
        return blocks

    def _result_text(self, name: str, tool_input: dict[str, Any]) -> str:
        rng = self.rng
        scale = self.result_scale

        def n(lo: int, hi: int) -> int:
            return max(1, int(rng.randint(lo, hi) * scale))

        if name == "Read":
            return cat_n(code_lines(rng, n(40, 320)))
        if name == "Bash":
            cmd = str(tool_input.get("command", ""))
            if "pytest" in cmd:
                tests = [
                    f"tests/test_{ident(rng, 1)}.py::test_{ident(rng)} {rng.choice(['PASSED', 'PASSED', 'PASSED', 'FAILED'])}"
                    for _ in range(n(10, 60))
                ]
                return (
                    "\n".join(tests)
                    + f"\n\n{rng.randint(1, 4)} failed, {len(tests)} passed in {rng.uniform(0.5, 9):.2f}s"
                )
            if cmd.startswith("ls"):
                return "\n".join(
                    f"-rw-r--r-- 1 dev dev {rng.randint(100, 90000):>6} Oct 21 10:{rng.randint(10, 59)} {ident(rng)}.py"
                    for _ in range(n(5, 40))
                )
            return "\n".join(
                f" {source_file(rng)[len(PROJECT) + 1 :]} | {rng.randint(1, 80)} {'+' * rng.randint(1, 20)}{'-' * rng.randint(0, 9)}"
                for _ in range(n(3, 20))
            )
        if name == "Grep":
            return "\n".join(
                f"{source_file(rng)}:{rng.randint(1, 900)}:{line.strip()}"
                for line in code_lines(rng, n(8, 60))
                if line.strip()
            )
        if name == "Glob":
            return "\n".join(source_file(rng) for _ in range(n(5, 40)))
        if name in ("Edit", "MultiEdit"):
            start = rng.randint(1, 400)
            return (
                f"The file {tool_input.get('file_path')} has been updated. Here's the result of running `cat -n` on a "
                f"snippet of the edited file:\n" + cat_n(code_lines(rng, n(8, 16)), start)
            )
        if name == "Write":
            return f"File created successfully at: {tool_input.get('file_path')}"
        if name == "TodoWrite":
            return (
                "Todos have been modified successfully. Ensure that you continue to use the todo list to track your "
                "progress. Please proceed with the current tasks if applicable"
            )
        if name == "Agent":
            return " ".join(sentence(rng, REASONING) for _ in range(n(10, 30)))
        if name == "WebFetch":
            return "# Cache invalidation\n\n" + "\n\n".join(
                " ".join(rng.sample(GUIDELINES, 3)) for _ in range(n(4, 12))
            )
        return "ok"

    def advance(self, blocks: list[dict[str, Any]] | None = None) -> None:
        """Append the assistant turn (`blocks`, or a generated one) and the user turn that
        answers it: tool results for its tool calls, else a new instruction."""
        blocks = self.assistant_blocks() if blocks is None else blocks
        self.messages.append({"role": "assistant", "content": blocks})
        calls = [b for b in blocks if b.get("type") == "tool_use"]
        if calls:
            results = []
            for call in calls:
                text = self._result_text(call.get("name", ""), call.get("input") or {})
                content: Any = text if self.rng.random() < 0.7 else [{"type": "text", "text": text}]
                results.append(
                    {"type": "tool_result", "tool_use_id": call.get("id"), "content": content, "is_error": False}
                )
            self.messages.append({"role": "user", "content": results})
        else:
            self.messages.append({"role": "user", "content": [{"type": "text", "text": "Continue."}]})
        self.turn += 1


def body_bytes(body: dict[str, Any]) -> int:
    return len(json.dumps(body, ensure_ascii=False).encode())

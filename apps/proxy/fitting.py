"""Fitting a prompt into the model's budget by omitting the middle of bulky content.

Claude Code assumes a 200K window for models it does not know, so an attempt on a 32K
model can send a conversation that does not fit, mostly because of tool results (a file
read, a test log) and expanded skill content. Rather than fail the call, the proxy cuts
the middle out of those blocks, oldest first, keeping a head and a tail and an explicit
marker so the model knows text is missing:

    [... N characters omitted by the proxy to fit the context window ...]

Budget = context_window - max_tokens (max_tokens already clamped to the route's
max_output). Each round re-renders and re-counts with the real tokenizer, so the result
is exact, not an estimate. If the prompt still does not fit once every candidate is cut
to its minimum, the call fails with Anthropic's "prompt is too long: N tokens > M
maximum" (400), which Claude Code answers by compacting. The record of what was cut is
captured with the interaction; the effective (fitted) request is what was sampled.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from apps.proxy.errors import PromptTooLong

MARKER = "[... {n} characters omitted by the proxy to fit the context window ...]"
# Expanded skill content arrives as a user text block that starts like this (Claude Code's
# Skill tool injects SKILL.md after "Base directory for this skill: <dir>").
SKILL_PREFIX = "Base directory for this skill:"
MIN_KEEP = 600  # characters kept of each cut block (two thirds head, one third tail)
MAX_ROUNDS = 6
SAFETY = 1.15  # characters cut per estimated character of excess, against estimate drift


@dataclass
class _Candidate:
    message: int
    block: int
    sub: int | None  # index inside a tool_result's content list, if any
    kind: str  # "tool_result" | "skill"
    original: str
    tool_use_id: str | None = None
    kept: int = field(init=False)

    def __post_init__(self) -> None:
        self.kept = len(self.original)


def _candidates(request: dict[str, Any]) -> list[_Candidate]:
    """Bulky blocks that may be cut, oldest first."""
    out: list[_Candidate] = []
    for mi, message in enumerate(request["messages"]):
        if message.get("role") != "user" or not isinstance(message.get("content"), list):
            continue  # (requests are normalized by schema.py: content is a list of blocks)
        for bi, block in enumerate(message["content"]):
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            if btype == "tool_result":
                content = block.get("content")
                if isinstance(content, str):
                    out.append(_Candidate(mi, bi, None, "tool_result", content, block.get("tool_use_id")))
                elif isinstance(content, list):
                    for si, sub in enumerate(content):
                        if isinstance(sub, dict) and sub.get("type") == "text" and isinstance(sub.get("text"), str):
                            out.append(_Candidate(mi, bi, si, "tool_result", sub["text"], block.get("tool_use_id")))
            elif btype == "text" and block.get("text", "").startswith(SKILL_PREFIX):
                out.append(_Candidate(mi, bi, None, "skill", block["text"]))
    return out


def _cut_text(original: str, keep: int) -> str:
    omitted = len(original) - keep
    if omitted <= 0:
        return original
    head = keep * 2 // 3
    tail = keep - head
    return f"{original[:head]}\n{MARKER.format(n=omitted)}\n{original[len(original) - tail :] if tail else ''}"


def _apply(request: dict[str, Any], cand: _Candidate) -> None:
    text = _cut_text(cand.original, cand.kept)
    block = request["messages"][cand.message]["content"][cand.block]
    if cand.sub is None and cand.kind == "tool_result":
        block["content"] = text
    elif cand.sub is None:
        block["text"] = text
    else:
        block["content"][cand.sub]["text"] = text


@dataclass(frozen=True)
class Fitted:
    request: dict[str, Any]  # the effective request (the original object when nothing was cut)
    rendered: Any  # the adapter's RenderedPrompt (text, token_ids) of the effective request
    original_tokens: int
    record: list[dict[str, Any]]


def prompt_fit(*, request: dict[str, Any], budget: int, render: Callable[[dict[str, Any]], Any]) -> Fitted:
    """Render `request`; if it exceeds `budget` tokens, cut candidates until it fits."""
    rendered = render(request)
    original_tokens = len(rendered.token_ids)
    if original_tokens <= budget:
        return Fitted(request=request, rendered=rendered, original_tokens=original_tokens, record=[])
    effective = copy.deepcopy(request)
    candidates = [c for c in _candidates(effective) if len(c.original) > MIN_KEEP]
    tokens = original_tokens
    for _ in range(MAX_ROUNDS):
        excess = tokens - budget
        if excess <= 0:
            break
        chars_per_token = max(1.0, len(rendered.text) / max(1, tokens))
        to_cut = int(excess * chars_per_token * SAFETY) + 64
        changed = False
        for cand in candidates:  # oldest first
            if to_cut <= 0:
                break
            room = cand.kept - MIN_KEEP
            if room <= 0:
                continue
            # The marker itself costs characters; cut enough to pay for it too.
            cut = min(room, to_cut + len(MARKER) + 8)
            cand.kept -= cut
            to_cut -= cut
            _apply(effective, cand)
            changed = True
        if not changed:
            break
        rendered = render(effective)
        tokens = len(rendered.token_ids)
    if tokens > budget:
        raise PromptTooLong(tokens=original_tokens, maximum=budget)
    record = [
        {
            "kind": c.kind,
            "message": c.message,
            "block": c.block,
            "sub": c.sub,
            "tool_use_id": c.tool_use_id,
            "original_chars": len(c.original),
            "kept_chars": c.kept,
            "omitted_chars": len(c.original) - c.kept,
        }
        for c in candidates
        if c.kept < len(c.original)
    ]
    return Fitted(request=effective, rendered=rendered, original_tokens=original_tokens, record=record)

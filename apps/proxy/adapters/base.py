"""The adapter interface: Anthropic Messages <-> a model family's native chat format.

An adapter renders an Anthropic-shaped request (system, messages, tools, thinking) into
the family's official chat template and token ids, and parses sampled token ids back
into Anthropic content blocks. One module per family (qwen.py, deepseek.py, deepseek_v31.py,
kimi.py, glm.py) implements it on template_base.TemplateAdapter. Adapters are pure: no
Django, no I/O beyond the tokenizer files they are given, so they can run in a worker pool
off the event loop.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

StopReason = Literal["end_turn", "tool_use", "max_tokens", "stop_sequence"]


@dataclass(frozen=True)
class RenderedPrompt:
    """What the model sees: the rendered text and its token ids (the ids are the truth)."""

    text: str
    token_ids: list[int]
    # Fitting applied to make the prompt fit (omitted tool-result bytes, ...); empty if none.
    fitting: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ParsedOutput:
    """Sampled tokens as Anthropic content blocks.

    blocks: [{"type": "thinking", "thinking": str, "signature": ""},
             {"type": "text", "text": str},
             {"type": "tool_use", "id": str, "name": str, "input": dict}]
    A malformed tool call becomes a text block holding the raw text, and a parse error.
    """

    blocks: list[dict[str, Any]]
    stop_reason: StopReason
    parse_errors: list[str] = field(default_factory=list)


class ChatAdapter(ABC):
    """One model family's chat format. Subclasses set `family` and implement the abstract methods."""

    family: str = ""

    def __init__(self, *, tokenizer: Any) -> None:
        # A `tokenizers.Tokenizer` loaded from the provisioned directory (see apps.proxy.tokenizers).
        self.tokenizer = tokenizer

    @abstractmethod
    def render(self, *, request: dict[str, Any]) -> RenderedPrompt:
        """Render an Anthropic Messages request (dict with system, messages, tools,
        thinking, tool_choice ...) as the prompt for the next assistant turn."""

    @abstractmethod
    def render_text(self, *, request: dict[str, Any]) -> str:
        """The text `render` gives for `request`, without tokenizing it (the prefix cache
        compares texts before it decides what to tokenize)."""

    @abstractmethod
    def stop_token_ids(self) -> list[int]:
        """Token ids that end an assistant turn (end-of-turn / end-of-text)."""

    @abstractmethod
    def parse(
        self, *, token_ids: list[int], stopped: bool, id_seed: str = "", tools: list[dict[str, Any]] | None = None
    ) -> ParsedOutput:
        """Parse an assistant turn's sampled ids. `stopped` is True when sampling ended on
        a stop token (so the turn is complete) and False when it hit max_tokens. `id_seed`
        (the request id) keeps derived tool_use ids unique; `tools` (the request's) lets a
        family whose calls carry untyped argument text type them by schema."""

    def count_tokens(self, *, request: dict[str, Any]) -> int:
        return len(self.render(request=request).token_ids)

    def encode(self, text: str) -> list[int]:
        # Not encode_batch_fast, although it skips the offsets (about a fifth of the work):
        # it lets go of the GIL, and a render on the worker pool then waited for it again after
        # every chunk (Claude Code's prompts: later calls' TTFB p99 76 -> 109 ms).
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

"""The one adapter framework: every family is a `TemplateAdapter` that supplies its chunks.

A family renders its official chat template in plain Python as a list of *chunks*
(`_chunks(request)`): strings that each begin at an added (special) token of the tokenizer,
or `Splice`s whose ids are given. This base turns them into the prompt: the text is the
chunks joined (`render_text`), the ids are each chunk's ids concatenated (`render`), with
the chunk-ids cache and the sampled-turn memo of render_cache.py making that cheap and exact.

Splicing: when `parse` sees a sampled assistant turn whose canonical re-rendering would
tokenize differently, it records the sampled ids (`_remember(body, ids)`), keyed by the
canonical text of the turn's body. When a later request carries the same blocks back,
`_turn(header, body)` gives the header's ids followed by the sampled ones instead of
re-tokenizing, so the next prompt contains exactly the ids that were sampled. A family
whose turn header does not end at an added token (Qwen's "<|im_start|>assistant\\n")
passes the whole turn as the body and an empty header.

The Anthropic -> template-message mapping is messages.py's `to_chat_messages`, shared by
every family; the parsing helpers below (tool-call scan, block shapes, deterministic
tool_use ids) are shared too.
"""

from __future__ import annotations

import hashlib
from abc import abstractmethod
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from apps.proxy.adapters.base import ChatAdapter, ParsedOutput, RenderedPrompt, StopReason
from apps.proxy.adapters.messages import to_chat_messages
from apps.proxy.adapters.render_cache import ChunkIdsCache, SampledTurnMemo

# Chunks shorter than this are tokenized every time: caching them costs more than it saves.
CACHE_MIN_CHARS = 512


@dataclass(frozen=True)
class Splice:
    """A chunk whose ids are given (header ids + sampled body ids) rather than tokenized."""

    text: str
    ids: list[int]


Chunk = str | Splice


class TemplateAdapter(ChatAdapter):
    """Base of the adapters that render chunked templates (see the module docstring).

    Subclasses implement `_chunks(request)` and `parse`, and set `stop_tokens`.
    """

    stop_tokens: tuple[str, ...] = ()

    def __init__(self, *, tokenizer: Any, memo: SampledTurnMemo | None = None) -> None:
        super().__init__(tokenizer=tokenizer)
        self.memo = memo if memo is not None else SampledTurnMemo()
        self._cache = ChunkIdsCache()
        self._stop_ids = [self.token_id(t) for t in self.stop_tokens]

    # --- tokens ------------------------------------------------------------------------------

    def token_id(self, token: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(f"{token!r} is not in this tokenizer: wrong family?")
        return int(token_id)

    def stop_token_ids(self) -> list[int]:
        return list(self._stop_ids)

    # --- rendering ---------------------------------------------------------------------------

    @abstractmethod
    def _chunks(self, request: dict[str, Any]) -> list[Chunk]:
        """The prompt as chunks, each starting at an added token (the first may start at the
        very beginning of the prompt)."""

    def render_text(self, *, request: dict[str, Any]) -> str:
        return _chunks_text(self._chunks(request))

    def render(self, *, request: dict[str, Any]) -> RenderedPrompt:
        chunks = self._chunks(request)
        return RenderedPrompt(text=_chunks_text(chunks), token_ids=self._tokenize(chunks))

    def _tokenize(self, chunks: list[Chunk]) -> list[int]:
        known: dict[str, Sequence[int]] = {}
        missing: list[str] = []
        for chunk in chunks:
            if isinstance(chunk, Splice) or chunk in known:
                continue
            cached = self._cached_ids(chunk)
            if cached is None:
                missing.append(chunk)
                known[chunk] = ()
            else:
                known[chunk] = cached
        if missing:
            # One call into the Rust tokenizer for everything new (it parallelizes a batch),
            # without the character offsets nothing reads (the same ids, a fifth less work).
            encoded = self.tokenizer.encode_batch_fast(missing, add_special_tokens=False)
            for chunk, enc in zip(missing, encoded, strict=True):
                known[chunk] = enc.ids
                if len(chunk) >= CACHE_MIN_CHARS:
                    self._cache.put(chunk, enc.ids)
        out: list[int] = []
        for chunk in chunks:
            out += chunk.ids if isinstance(chunk, Splice) else known[chunk]
        return out

    def _turn(self, header: str, body: str) -> Chunk:
        """An assistant turn: `header` (ending in an added token) + `body`, spliced with the
        sampled ids when `parse` recorded a non-canonical sample of this exact body."""
        sampled = self.memo.get(body)
        if sampled is None:
            return header + body
        return Splice(header + body, (self.encode(header) if header else []) + sampled)

    def _remember(self, body: str, sampled_ids: list[int]) -> None:
        """Record `sampled_ids` for `body` when re-tokenizing `body` would give other ids;
        otherwise keep the ids just computed in the chunk cache, where the next call's
        tokenization of the same turn finds them (`encode_chunk`)."""
        ids = self.encode(body)
        if ids != sampled_ids:
            self.memo.put(body, sampled_ids)
        elif len(body) >= CACHE_MIN_CHARS:
            self._cache.put(body, ids)

    def encode_chunk(self, text: str) -> list[int]:
        """`encode(text)` of a chunk (text starting at an added token), from the chunk cache
        when it holds it; nothing is added to the cache (a prompt's new text is not seen again)."""
        cached = self._cached_ids(text)
        return list(cached) if cached is not None else self.encode(text)

    def _cached_ids(self, chunk: str) -> Sequence[int] | None:
        """The chunk cache's ids of `chunk` (only chunks of CACHE_MIN_CHARS or more are kept)."""
        return self._cache.get(chunk) if len(chunk) >= CACHE_MIN_CHARS else None

    # --- parsing helpers ---------------------------------------------------------------------

    def _split_stop(self, token_ids: Sequence[int], stopped: bool) -> tuple[list[int], int | None]:
        """(the turn's ids without a final stop token, that stop token or None)."""
        ids = list(token_ids)
        if stopped and ids and ids[-1] in self._stop_ids:
            return ids[:-1], ids[-1]
        return ids, None

    @staticmethod
    def _digest(id_seed: str, ids: Sequence[int]) -> str:
        return hashlib.sha256(id_seed.encode("utf-8") + b"\0" + array("i", ids).tobytes()).hexdigest()

    @staticmethod
    def _tool_use_id(digest: str, index: int) -> str:
        """A deterministic Anthropic-style id: same sample and seed -> same id."""
        return "toolu_" + hashlib.sha256(f"{digest}:{index}".encode()).hexdigest()[:24]

    @staticmethod
    def _stop_reason(stopped: bool, calls: int) -> StopReason:
        if not stopped:
            return "max_tokens"
        return "tool_use" if calls else "end_turn"

    @abstractmethod
    def parse(
        self, *, token_ids: list[int], stopped: bool, id_seed: str = "", tools: list[dict[str, Any]] | None = None
    ) -> ParsedOutput:
        """Sampled ids -> Anthropic blocks; never raises on model output."""


def _chunks_text(chunks: list[Chunk]) -> str:
    return "".join(c.text if isinstance(c, Splice) else c for c in chunks)


def assistant_message(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """Parsed blocks as the template message the next request will carry for them."""
    messages, _tools = to_chat_messages({"messages": [{"role": "assistant", "content": blocks}]})
    return messages[0] if messages else {"role": "assistant", "content": "", "reasoning_content": ""}


def tool_calls_scan(
    *,
    section: str,
    call_begin: str,
    call_end: str,
    stopped: bool,
    parse_one: Callable[[str], tuple[Any, str | None]],
    to_block: Callable[[int, Any], dict[str, Any]],
    blocks: list[dict[str, Any]],
    errors: list[str],
) -> int:
    """Walk a tool-call section (the text between the family's section markers) and append
    its blocks: each well-formed call through `to_block(index, parsed)`; stray text, an
    unparsable call or one cut off by max_tokens as a text block plus an error, never an
    exception. Returns the number of calls parsed."""
    calls = pos = index = 0
    while True:
        begin = section.find(call_begin, pos)
        if begin == -1:
            if section[pos:].strip():
                errors.append(f"unexpected text in the tool-call section: {section[pos:][:80]!r}")
                blocks.append(text_block(section[pos:]))
            return calls
        if section[pos:begin].strip():
            errors.append(f"unexpected text in the tool-call section: {section[pos:begin][:80]!r}")
            blocks.append(text_block(section[pos:begin]))
        close = section.find(call_end, begin)
        raw = section[begin : len(section) if close == -1 else close + len(call_end)]
        if close == -1 and not stopped:
            call, error = None, "tool call not closed (output truncated)"
        else:
            call, error = parse_one(section[begin + len(call_begin) : len(section) if close == -1 else close])
        if call is None:
            errors.append(f"tool call {index}: {error}")
            blocks.append(text_block(raw))
        else:
            blocks.append(to_block(index, call))
            calls += 1
        index += 1
        if close == -1:
            return calls
        pos = close + len(call_end)


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def thinking_block(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": ""}

"""Exact-token prefix reuse: tokenize only what is new since the previous call.

An agent's calls grow append-only most of the time: call k+1 renders everything call k
rendered, plus the assistant turn it sampled and the tool results that came back. The
cache keeps, per conversation, the rendered text of the previous call's prompt up to the
end of its last complete turn (the turn before the generation prompt: most often the tool
results), and the token ids of exactly that text; so each tool result is tokenized once,
not again as part of the next call's suffix. Should the next call render that last turn
otherwise (a template that merges consecutive tool results into one turn, a harness that
rewrites its latest message), the entry's shorter cut is tried: the end of the last
completed assistant turn. A new call reuses a cut only when

1. its rendered text starts with exactly the cached text (so nothing before it changed:
   a template that drops past reasoning, a compaction, a context edit all fail this), and
2. the boundary is a special-token boundary: the cached text ends with Qwen's turn end
   ``<|im_end|>`` and its "\n", and every turn after it opens with the special
   ``<|im_start|>``.

Why (2) makes the result exact: a `tokenizers` tokenizer first splits the input on added
special tokens and normalizes and pre-tokenizes each piece on its own, so no token can
span a special token. The ids of ``prefix + suffix`` are therefore the ids of ``prefix``
followed by the ids of ``suffix`` when special tokens stand on both sides of the cut
("\n" between two of them is a piece of its own), and the prompt ids sent
to the sampler are identical to a full tokenization (tests/proxy/test_prefix_cache.py
checks it on multi-turn conversations).

With the Qwen adapter the ids of a prompt are not always a plain tokenization of its
text: an assistant turn the model sampled with ids that re-tokenization would not give
back is spliced in as the sampled ids (the adapter's sampled-turn memo). So a miss asks
the adapter for its complete rendering, and a hit tokenizes the suffix the way the
adapter does (`chatml_tokenize`): the ids are identical to the adapter's in both cases.
The boundary is taken after the separator that follows the turn end ("<|im_end|>\n"),
which is where the adapter's chunks begin (at the special "<|im_start|>").

Keyed by (organization, credential or token id, route, tokenizer, session id, agent id):
conversations of different owners, attempts or delegated agents never share entries (no
cross-tenant leak, and a subagent does not evict its parent's entry). Bounded LRU by
entry count and by approximate bytes; ids are kept as 4-byte arrays. Thread-safe: it is
used from the worker pool.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings

if TYPE_CHECKING:
    from apps.proxy.adapters.template_base import TemplateAdapter

# Per family: the text that opens an assistant turn, the special token that ends a turn,
# and the separator the template writes after it (the next turn then starts with a
# special token, so the boundary after the separator is a special-token boundary too).
# Families absent here are tokenized in full (no reuse), which is always correct.
TURN_MARKERS: dict[str, tuple[str, str, str]] = {
    "qwen3": ("<|im_start|>assistant", "<|im_end|>", "\n"),
    "qwen2.5": ("<|im_start|>assistant", "<|im_end|>", "\n"),
}

CacheKey = tuple[str, ...]


@dataclass(frozen=True)
class _Entry:
    text: str
    ids: array  # never changed once made: a hit's Tokenized hands it on as its base
    turn_ends: int  # the turn-end ids among ids
    # The shorter cut, at the end of the last completed assistant turn: (characters of
    # text, ids, turn-end ids), or None when it is the whole entry or absent.
    fallback: tuple[int, int, int] | None = None

    @property
    def size(self) -> int:
        return len(self.text) + self.ids.itemsize * len(self.ids)


@dataclass(frozen=True)
class Tokenized:
    ids: list[int]
    reused: int  # how many leading ids came from the cache
    # What they came from (ids[:reused] == base[:reused]) and the turn-end ids among them:
    # remember() then extends the entry and looks for turn ends in the new ids only.
    base: array | None = None
    base_turn_ends: int = 0


def assistant_boundary(text: str, *, assistant_open: str, turn_end: str, separator: str) -> int | None:
    """Index just after the turn end (and its separator) that closes the last completed
    assistant turn, or None."""
    search_to = len(text)
    while True:
        start = text.rfind(assistant_open, 0, search_to)
        if start < 0:
            return None
        end = text.find(turn_end, start)
        if end >= 0:
            end += len(turn_end)
            return end + len(separator) if text.startswith(separator, end) else end
        search_to = start  # the generation prompt (an open assistant turn): look earlier


class PrefixCache:
    def __init__(self, *, max_entries: int | None = None, max_bytes: int | None = None) -> None:
        # Unset bounds come from SYNTH_PROXY_PREFIX_CACHE_ENTRIES / _BYTES.
        self.max_entries = settings.SYNTH_PROXY_PREFIX_CACHE_ENTRIES if max_entries is None else max_entries
        self.max_bytes = settings.SYNTH_PROXY_PREFIX_CACHE_BYTES if max_bytes is None else max_bytes
        self._entries: OrderedDict[CacheKey, _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def tokenize(
        self,
        *,
        key: CacheKey,
        text: str,
        encode_suffix: Callable[[str], list[int]],
        full: Callable[[], list[int]],
    ) -> Tokenized:
        """The ids of `text`: the cached prefix + `encode_suffix(rest)` when the cached text
        is a prefix of `text`, else `full()` (the adapter's own complete tokenization)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is not None:
            cut = None
            if text.startswith(entry.text):
                cut = (len(entry.text), len(entry.ids), entry.turn_ends)
            elif entry.fallback is not None and text.startswith(entry.text[: entry.fallback[0]]):
                cut = entry.fallback
            if cut is not None:
                self.hits += 1
                chars, count, turn_ends = cut
                reused = entry.ids.tolist() if count == len(entry.ids) else entry.ids[:count].tolist()
                return Tokenized(
                    ids=reused + encode_suffix(text[chars:]), reused=count, base=entry.ids, base_turn_ends=turn_ends
                )
        self.misses += 1
        return Tokenized(ids=full(), reused=0)

    def remember(
        self,
        *,
        key: CacheKey,
        family: str,
        text: str,
        ids: list[int],
        turn_end_id: int | None,
        separator_ids: list[int],
        tokenized: Tokenized | None = None,
    ) -> None:
        """Keep `text` up to its last complete turn, with the ids of exactly that, and where
        the last completed assistant turn ends in both (the fallback cut).

        The ids of a cut are found without tokenizing again: the text before it ends with its
        n-th turn-end token (+ separator), so its ids end at the n-th turn-end id (+ the
        separator's ids). Added tokens are matched wherever their text appears, in templates
        and content alike, so text occurrences and id occurrences correspond one to one; a
        cut that does not line up is simply not cached.

        ``tokenized``: how `ids` were made, when by `tokenize` (a hit's reused ids are its
        base's). Only the ids after them are then searched and copied: at 100K ids, counting
        and copying them all took longer than tokenizing the call's new text.
        """
        markers = TURN_MARKERS.get(family)
        if markers is None or turn_end_id is None:
            return
        assistant_open, turn_end, separator = markers
        last_turn = text.rfind(turn_end)
        if last_turn < 0:
            return
        last_turn += len(turn_end)
        if text.startswith(separator, last_turn):
            last_turn += len(separator)
        assistant = assistant_boundary(text, assistant_open=assistant_open, turn_end=turn_end, separator=separator)

        base, start, known = None, 0, 0
        if tokenized is not None and tokenized.base is not None:
            base, start, known = tokenized.base, tokenized.reused, tokenized.base_turn_ends
        # The turn-end ids after the reused ones (list.index runs in C; a Python loop over
        # 100K ids cost about 5 ms per call).
        found: list[int] = []
        position = start - 1
        try:
            while True:
                position = ids.index(turn_end_id, position + 1)
                found.append(position)
        except ValueError:
            pass

        def nth_turn_end(n: int) -> int | None:
            """Where the n-th turn-end id (from 1) is, or None if there are fewer."""
            if n > known:
                return found[n - known - 1] if n - known <= len(found) else None
            where = -1
            for _ in range(n):  # among the reused ids (a cut before the new text: rare)
                where = ids.index(turn_end_id, where + 1)
            return where

        def ids_cut(boundary: int) -> tuple[int, int] | None:
            """(ids before the cut at text[:boundary], the turn-end ids among them)."""
            wanted = text.count(turn_end, 0, boundary)
            position = nth_turn_end(wanted) if wanted else None
            if position is None:
                return None
            cut = position + 1
            if separator and text.endswith(turn_end + separator, 0, boundary):
                if ids[cut : cut + len(separator_ids)] != separator_ids:
                    return None  # the separator merged with what follows: not a clean boundary
                cut += len(separator_ids)
            return cut, wanted

        def stored(cut: int) -> array:
            if base is not None and 0 < start <= cut:
                kept = base[:start]
                kept.extend(ids[start:cut])
                return kept
            return array("I", ids[:cut])

        main = ids_cut(last_turn)
        fallback = ids_cut(assistant) if assistant is not None and assistant < last_turn else None
        if main is None:
            if fallback is None:
                return
            assert assistant is not None
            entry = _Entry(text=text[:assistant], ids=stored(fallback[0]), turn_ends=fallback[1])
        else:
            entry = _Entry(
                text=text[:last_turn],
                ids=stored(main[0]),
                turn_ends=main[1],
                fallback=(assistant, *fallback) if assistant is not None and fallback is not None else None,
            )
        if entry.size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            self._entries[key] = entry
            self._bytes += entry.size
            while self._entries and (len(self._entries) > self.max_entries or self._bytes > self.max_bytes):
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.size


def chatml_tokenize(*, adapter: TemplateAdapter, text: str) -> list[int]:
    """Tokenize a ChatML (Qwen) suffix exactly as the Qwen adapter tokenizes its chunks.

    The adapter splits its prompt into chunks that each start at "<|im_start|>" and
    tokenizes them separately (exact, since that is a special token), except that an
    assistant turn found in its sampled-turn memo (a turn the model sampled with ids that
    a re-tokenization would not reproduce) is spliced in as the ids the memo holds for the
    whole turn. This does the same on the suffix, through the adapter's `memo` and
    `encode_chunk` (a turn it sampled a call ago is in its chunk cache), so a cache hit
    yields the adapter's own ids.
    """
    opener = "<|im_start|>"
    header = "<|im_start|>assistant\n"
    closer = "<|im_end|>\n"
    pieces: list[str] = []
    start = 0
    while True:
        nxt = text.find(opener, start + 1)
        if nxt < 0:
            pieces.append(text[start:])
            break
        pieces.append(text[start:nxt])
        start = nxt
    ids: list[int] = []
    for piece in pieces:
        if not piece:
            continue
        if piece.startswith(header) and piece.endswith(closer):
            turn_ids = adapter.memo.get(piece)
            if turn_ids is not None:
                ids += turn_ids
                continue
        ids += adapter.encode_chunk(piece)
    return ids


cache = PrefixCache()

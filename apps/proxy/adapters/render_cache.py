"""The caches of the template adapters: chunk ids, sampled turns, rendered tool lists.

An adapter renders its family's chat template as a list of *chunks*: strings that each begin
at an added (special) token of the tokenizer. A `tokenizers` tokenizer splits its input on
added tokens before normalizing or pre-tokenizing, so no token spans a chunk boundary and the
ids of the whole prompt are the concatenation of each chunk's ids. That makes two things
cheap and exact:

- `ChunkIdsCache`: Claude Code resends the same ~18K-token system + tools chunk and the whole
  history on every call, so only the new chunks are tokenized;
- `SampledTurnMemo`: when the model sampled an assistant turn whose canonical re-rendering
  tokenizes differently (non-canonical JSON spacing in tool arguments, an unusual BPE split,
  ...), the adapter records the sampled ids keyed by the canonical text of the turn. When a
  later request carries the same blocks back, those ids are spliced in instead of
  re-tokenizing, so the next prompt contains exactly the ids that were sampled. A miss
  (another process, evicted) falls back to the canonical rendering, which is what the
  official template gives.

Both are per adapter instance (one per family and process, see registry.py), bounded and
thread-safe: adapters run in the proxy's worker pool.

- `rendered_by_value`: an agent harness sends the same tools on every call of a session
  (Claude Code: about 24, 64 KB of JSON), and each family's template writes them into the
  system turn with Python's json on every call, before the chunk ids can be reused. orjson
  writes the same value about ten times faster: its bytes key the text the template wrote,
  so only a tool list not seen lately is written json's way. The key is exact: orjson writes
  distinct values distinctly (1, 1.0 and true; key order; -0.0; each float by its shortest
  round trip), and a value it cannot write (an integer beyond 64 bits, a non-string key) is
  rendered without the memo. Per renderer and process, bounded, thread-safe.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from cachetools import LRUCache


class ChunkIdsCache:
    """Bounded (by total ids), thread-safe LRU: chunk text -> its token ids."""

    def __init__(self, max_ids: int = 4_000_000) -> None:
        self._data: OrderedDict[str, array] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.max_ids = max_ids

    def get(self, text: str) -> array | None:
        with self._lock:
            ids = self._data.get(text)
            if ids is not None:
                self._data.move_to_end(text)
            return ids

    def put(self, text: str, ids: Sequence[int]) -> None:
        if len(ids) > self.max_ids // 4:
            return
        with self._lock:
            if text in self._data:
                return
            self._data[text] = array("i", ids)
            self._size += len(ids)
            while self._size > self.max_ids:
                _, old = self._data.popitem(last=False)
                self._size -= len(old)


class SampledTurnMemo:
    """Bounded, thread-safe map: sha256(canonical turn text) -> the ids the model sampled.

    Only turns whose sampled ids differ from the canonical re-tokenization are stored, so it
    stays small. Replace it (adapter.memo = ...) with a shared store to span processes.
    """

    def __init__(self, max_entries: int = 4096) -> None:
        self._data: OrderedDict[str, array] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries

    @staticmethod
    def key(turn_text: str) -> str:
        return hashlib.sha256(turn_text.encode("utf-8")).hexdigest()

    def put(self, turn_text: str, ids: Sequence[int]) -> None:
        with self._lock:
            self._data[self.key(turn_text)] = array("i", ids)
            self._data.move_to_end(self.key(turn_text))
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def get(self, turn_text: str) -> list[int] | None:
        with self._lock:
            ids = self._data.get(self.key(turn_text))
        return None if ids is None else list(ids)

    def __len__(self) -> int:
        return len(self._data)


# Characters of rendered text kept per renderer (each entry's key, in bytes, is about as large again).
MEMO_TEXT_BYTES = 8 * 2**20


def rendered_by_value(render: Callable[..., str]) -> Callable[..., str]:
    """``render(value, **options)`` memoized on the exact JSON value of its arguments.
    Thread-safe: the proxy renders on its worker pool."""
    cache: LRUCache[bytes, str] = LRUCache(maxsize=MEMO_TEXT_BYTES, getsizeof=len)
    lock = threading.Lock()

    @functools.wraps(render)
    def memoized(value: Any, **options: Any) -> str:
        try:
            key = orjson.dumps([value, options])
        except orjson.JSONEncodeError:
            return render(value, **options)
        with lock:
            text = cache.get(key)
        if text is None:
            text = render(value, **options)
            if len(text) <= MEMO_TEXT_BYTES:
                with lock:
                    cache[key] = text
        return text

    return memoized

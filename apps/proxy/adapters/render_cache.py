"""The two caches every template adapter keeps: chunk ids and sampled turns.

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
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence


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

"""A process's cache of database reads that are served only while fresh.

Freshness, not a lifetime, decides: each value carries the moment the read that produced
it began, and is served only while that is at most ``check_seconds()`` ago. A change
written anywhere (a service, the admin, a bulk update, another process) is therefore seen
within that interval, with no broker or notification channel; ``check_seconds() <= 0``
turns the cache off. Only values are kept: a read that found nothing is not cached, so
a refusal always comes from the database.

Values are shared by the threads of the process: callers must treat them as read-only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

from cachetools import LRUCache


class FreshCache[K: Hashable, V]:
    def __init__(self, *, maxsize: int, check_seconds: Callable[[], float]) -> None:
        self._check_seconds = check_seconds
        self._lock = threading.Lock()  # held for a dictionary operation only, never across a read
        self._entries: LRUCache[K, tuple[V, float]] = LRUCache(maxsize=maxsize)

    @staticmethod
    def read_started() -> float:
        """The time to pass to ``put`` for a read that begins now."""
        return time.monotonic()

    def get(self, key: K) -> V | None:
        """The value for ``key`` if one is cached and fresh; else None."""
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:
            return None
        value, valid_as_of = entry
        if time.monotonic() - valid_as_of > self._check_seconds():
            return None
        return value

    def read_through(
        self,
        key: K,
        *,
        read: Callable[[], V | None],
        cached: bool = True,
        usable: Callable[[V], bool] | None = None,
    ) -> V | None:
        """The fresh cached value for ``key`` (when ``cached``, and ``usable`` accepts it),
        else ``read()``, kept unless it found nothing."""
        found = self.get(key) if cached else None
        if found is not None and (usable is None or usable(found)):
            return found
        started = self.read_started()
        found = read()
        if found is not None:
            self.put(key, found, read_started=started)
        return found

    def age(self, key: K) -> float | None:
        """Seconds since the read of the cached value for ``key`` began (fresh or not); None
        if none is cached."""
        with self._lock:
            entry = self._entries.get(key)
        return None if entry is None else time.monotonic() - entry[1]

    def put(self, key: K, value: V, *, read_started: float) -> None:
        """Keep ``value``, read by a read that began at ``read_started`` (see read_started)."""
        if self._check_seconds() <= 0:
            return
        with self._lock:
            current = self._entries.get(key)
            # Two threads may read at once: keep the later read.
            if current is None or current[1] <= read_started:
                self._entries[key] = (value, read_started)

    def drop(self, key: K) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

"""Bounded logs under a flood: repeated records are folded into a count.

A hostile client (a sandbox hammering its model bridge with bad connections) can make a server
log the same warning or traceback thousands of times a second. `RepeatFolder`, a logging
filter, lets the first `burst` records of each kind through per `window` seconds (the first
with its traceback, the others with the exception's one line), drops the rest, and adds to the
next record of that kind it lets through how many it dropped. A kind is the logger, the level,
the message template (not its arguments) and the exception's type. At most `max_kinds` kinds
are remembered (the least recently seen are forgotten), so memory is bounded too.

No Django here: the server and the sandbox's model bridge both use it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

Kind = tuple[object, ...]


@dataclass
class _Window:
    start: float
    passed: int = 0
    folded: int = 0
    folded_before: int = 0  # dropped in the previous window, not yet reported


class RepeatFolder(logging.Filter):
    def __init__(
        self,
        *,
        burst: int = 5,
        window: float = 60.0,
        max_kinds: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.burst = burst
        self.window = window
        self.max_kinds = max_kinds
        self.clock = clock
        self._windows: OrderedDict[Kind, _Window] = OrderedDict()
        self._lock = threading.Lock()

    def kind(self, record: logging.LogRecord) -> Kind | None:
        """What makes another record a repeat of `record`; None: never fold it."""
        exc_type = record.exc_info[0] if record.exc_info else None
        return (record.name, record.levelno, str(record.msg), exc_type.__name__ if exc_type else None)

    def filter(self, record: logging.LogRecord) -> bool:
        kind = self.kind(record)
        if kind is None:
            return True
        with self._lock:
            window = self._window(kind)
            if window.passed >= self.burst:
                window.folded += 1
                return False
            window.passed += 1
            first, folded = window.passed == 1, window.folded_before
            window.folded_before = 0
        if not first:
            _drop_traceback(record)
        if folded:
            _append(record, f" [{folded} more like this in {self.window:g} s were not logged]")
        return True

    def _window(self, kind: Kind) -> _Window:
        now = self.clock()
        window = self._windows.get(kind)
        if window is None or now - window.start >= self.window:
            folded = (window.folded + window.folded_before) if window is not None else 0
            window = _Window(start=now, folded_before=folded)
            self._windows[kind] = window
        self._windows.move_to_end(kind)
        while len(self._windows) > self.max_kinds:
            self._windows.popitem(last=False)
        return window


class ErrorResponseFolder(RepeatFolder):
    """For uvicorn's access log: folds error responses (status >= 400) by status; the others
    always pass (normal traffic is not a flood to hide)."""

    def kind(self, record: logging.LogRecord) -> Kind | None:
        args = record.args if isinstance(record.args, tuple) else ()
        status = args[-1] if args else None
        if not isinstance(status, int) or status < 400:
            return None
        return (record.name, status)


def _append(record: logging.LogRecord, text: str) -> None:
    record.msg = record.getMessage() + text
    record.args = None


def _drop_traceback(record: logging.LogRecord) -> None:
    exc = record.exc_info[1] if record.exc_info else None
    if exc is None:
        return
    _append(record, f" ({type(exc).__name__}: {exc}; traceback logged once)")
    record.exc_info = None
    record.exc_text = None

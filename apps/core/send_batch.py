"""Ids a process hands to the broker in batches, from a thread of its own.

A Celery message costs its sender's interpreter more than many a request's own work (the
message, its headers, the broker round trip, under the GIL the request threads share). Where
a process hands the broker one id per request (the proxy's settled calls, the gateway's
admitted runs), ``add`` only appends the id; a thread of the process sends what gathered as
one message once the first id has waited ``seconds`` (or ``most`` ids are waiting), so a
burst of requests costs one message.

Nothing is lost that a sweeper would not find: every user of this keeps its ids' state in
the database, where a sweeper re-drives a row whose message never came (a process killed
meanwhile, a broker down). So a failed send is logged, not retried, and the process' exit
sends what is waiting.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class SendBatcher:
    """Ids gathered by ``add`` and sent by ``send`` from a thread of this process, in
    batches of at most ``most``, the first id of each waiting at most about ``seconds``.
    ``what`` names the message in the log."""

    def __init__(self, *, send: Callable[[list[str]], None], seconds: float, what: str, most: int = 200) -> None:
        self.send, self.seconds, self.what, self.most = send, seconds, what, most
        self._waiting: list[str] = []
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, item_id: str) -> None:
        with self._wake:
            self._waiting.append(item_id)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=f"batch {self.what}", daemon=True)
                self._thread.start()
            if len(self._waiting) == 1 or len(self._waiting) >= self.most:
                self._wake.notify()

    def flush(self) -> None:
        """Send everything waiting now (the process' exit, tests)."""
        while batch := self._take():
            self._send(batch)

    def _take(self) -> list[str]:
        with self._wake:
            batch, self._waiting = self._waiting[: self.most], self._waiting[self.most :]
            return batch

    def _send(self, batch: list[str]) -> None:
        try:
            self.send(batch)
        except Exception:  # noqa: BLE001 - the rows keep their state: the sweeper drives them again
            logger.warning("could not enqueue %s for %d ids; the sweeper will retry", self.what, len(batch))

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._waiting:
                    self._wake.wait()
                # The first id is here: let others join it for a moment, unless a batch is full.
                if len(self._waiting) < self.most:
                    self._wake.wait(timeout=self.seconds)
            self.flush()


class ProcessBatcher:
    """The process' one SendBatcher for ``send``, made on first use and flushed at exit; a
    forked child makes its own (the parent's thread does not exist there)."""

    def __init__(self, *, send: Callable[[list[str]], None], what: str) -> None:
        self.send, self.what = send, what
        self._batcher: SendBatcher | None = None
        self._lock = threading.Lock()
        _PER_PROCESS.append(self)

    def get(self, *, seconds: float) -> SendBatcher:
        with self._lock:
            if self._batcher is None:
                self._batcher = SendBatcher(send=self.send, seconds=seconds, what=self.what)
                atexit.register(self._batcher.flush)
            return self._batcher

    def forget(self) -> None:
        """Drop the process' batcher (after a fork; tests), unsent ids with it."""
        self._batcher, self._lock = None, threading.Lock()


_PER_PROCESS: list[ProcessBatcher] = []


def _forget_all() -> None:
    for per_process in _PER_PROCESS:
        per_process.forget()


os.register_at_fork(after_in_child=_forget_all)

"""The proxy process' evidence publications, sent to the broker in batches.

Every settled call is handed to the evidence worker (queue "evidence"). One Celery message
per call cost the proxy's interpreter more than the call's settle statement (building the
message, its headers and the broker round trip, under the GIL the streams share), and the
worker a task per call. Here a settle only appends the row's id; a thread of the process
sends what gathered as one "evidence.publish_many" message once the first id has waited
``seconds`` (or ``most`` ids are waiting), so a burst of calls costs one message.

Nothing is lost that the sweeper would not find: an id waits here at most ``seconds`` and
then in the broker, and a row whose message never arrived (a process killed meanwhile, a
broker down) stays staged until ``staged_sweep`` enqueues it again. A failed send is
logged, not retried (the sweeper is the retry). The process' exit sends what is waiting.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class PublishBatcher:
    """Ids gathered by ``add`` and sent by ``send`` from a thread of this process, in
    batches of at most ``most``, the first id of each waiting at most about ``seconds``."""

    def __init__(self, *, send: Callable[[list[str]], None], seconds: float, most: int = 200) -> None:
        self.send, self.seconds, self.most = send, seconds, most
        self._waiting: list[str] = []
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, interaction_id: str) -> None:
        with self._wake:
            self._waiting.append(interaction_id)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="evidence-batch", daemon=True)
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
        except Exception:  # noqa: BLE001 - the rows stay staged: the sweeper enqueues them again
            logger.warning("could not enqueue evidence.publish_many for %d calls; the sweeper will retry", len(batch))

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._waiting:
                    self._wake.wait()
                # The first id is here: let others join it for a moment, unless a batch is full.
                if len(self._waiting) < self.most:
                    self._wake.wait(timeout=self.seconds)
            self.flush()


def _send_batch(batch: list[str]) -> None:
    from apps.proxy.tasks import evidence_publish_many_task

    evidence_publish_many_task.apply_async(args=[batch], retry=False)


_batcher: PublishBatcher | None = None
_batcher_lock = threading.Lock()


def batcher(*, seconds: float) -> PublishBatcher:
    """The process' batcher, made on first use (a forked child makes its own)."""
    global _batcher
    with _batcher_lock:
        if _batcher is None:
            _batcher = PublishBatcher(send=_send_batch, seconds=seconds)
            atexit.register(_batcher.flush)
        return _batcher


def _forget() -> None:
    global _batcher, _batcher_lock
    _batcher, _batcher_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget)

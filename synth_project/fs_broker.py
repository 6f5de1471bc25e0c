"""Celery's filesystem broker (the embedded default), with messages that appear whole.

kombu's filesystem transport creates a message's file in the queue folder, then locks it
and writes it. A worker polling that folder (every SYNTH_BROKER_POLL_SECONDS) can take the
file between the two: it moves the file away and reads it empty, and the JSONDecodeError is
an "unrecoverable error" that stops the worker's consumer, leaving every run it served
waiting (kombu issue #1551; the embedded job's test met it once the poll was 0.1 s). Here a
message is written under a name no queue matches, in the same folder, and renamed into
place once complete: a rename is atomic, so a poll finds a whole message or none.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from os import replace
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

PARTIAL_PREFIX = ".partial-"  # a name's text before its first "." is not a queue's: never read


class Channel(filesystem.Channel):
    # kombu's own classes name the second parameter differently (AbstractChannel: message,
    # filesystem.Channel: payload); this keeps the filesystem channel's signature.
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # kombu's name: the time first, so that a poll takes the oldest message first.
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        partial = os.path.join(self.data_folder_out, PARTIAL_PREFIX + name)
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            replace(partial, os.path.join(self.data_folder_out, name))
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.remove(partial)
            raise ChannelError(f"Cannot add file {name!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel

"""The embedded default's filesystem broker (synth_project.fs_broker): a worker's poll finds
a whole message or none, never one half-written (kombu's own transport created the file
first and wrote it after, and a poll between the two stopped the worker)."""

from __future__ import annotations

import os
from queue import Empty

import pytest
from kombu import Connection

from synth_project import fs_broker


@pytest.fixture
def channel(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder), "store_processed": False}
    with Connection("filesystem://", transport="synth_project.fs_broker:Transport", transport_options=options) as conn:
        channel = conn.default_channel
        assert isinstance(channel, fs_broker.Channel)
        yield channel


def test_a_message_being_written_is_not_seen_by_a_poll(channel, monkeypatch):
    seen_while_writing = []
    replace = fs_broker.replace

    def poll_then_replace(src, dst):
        # The message's bytes are all written, under the partial name: a poll now must find
        # nothing, not an empty file.
        with pytest.raises(Empty):
            channel._get("control")
        seen_while_writing.append(os.path.basename(src))
        replace(src, dst)

    # The module's own name for the rename, so that nothing else in the process is touched.
    monkeypatch.setattr(fs_broker, "replace", poll_then_replace)
    channel._put("control", {"body": "hello", "n": 1})
    assert [name.startswith(fs_broker.PARTIAL_PREFIX) for name in seen_while_writing] == [True]
    assert channel._get("control") == {"body": "hello", "n": 1}
    assert os.listdir(channel.data_folder_out) == []  # taken, and nothing partial left behind


def test_each_queue_gets_its_own_messages(channel):
    for i in range(3):
        channel._put("trials", {"n": i})
    channel._put("control", {"n": "c"})
    assert sorted(channel._get("trials")["n"] for _ in range(3)) == [0, 1, 2]
    with pytest.raises(Empty):
        channel._get("trials")
    assert channel._get("control") == {"n": "c"}

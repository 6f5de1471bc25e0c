"""The proxy process' evidence batches (apps.proxy.publish_batch): every settled call's id
reaches the broker once, in batches; a failed send loses nothing the sweeper cannot find."""

from __future__ import annotations

import base64
import json
import threading

import pytest
import redis

from apps.proxy import capture, publish_batch
from tests.proxy.test_evidence_worker import REAL_PUBLISH_ENQUEUE


@pytest.fixture(autouse=True)
def _no_process_batcher(monkeypatch):
    monkeypatch.setattr(publish_batch, "_batcher", None)


def test_ids_added_from_many_threads_are_each_sent_once_in_bounded_batches():
    sent: list[list[str]] = []
    lock = threading.Lock()

    def send(batch: list[str]) -> None:
        with lock:
            sent.append(list(batch))

    batcher = publish_batch.PublishBatcher(send=send, seconds=0.01, most=50)
    ids = [f"int_{n}" for n in range(2000)]

    def add(part: list[str]) -> None:
        for interaction_id in part:
            batcher.add(interaction_id)

    threads = [threading.Thread(target=add, args=(ids[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    batcher.flush()
    flat = [i for batch in sent for i in batch]
    assert sorted(flat) == sorted(ids)  # each once
    assert all(1 <= len(batch) <= 50 for batch in sent)
    assert len(sent) < len(ids) / 5  # gathered, not one message per id


def test_a_failed_send_is_logged_and_the_next_batch_still_goes(caplog):
    sent: list[list[str]] = []
    ready = threading.Event()

    def send(batch: list[str]) -> None:
        if batch == ["broken"]:
            raise ConnectionError("broker down")
        sent.append(batch)
        ready.set()

    batcher = publish_batch.PublishBatcher(send=send, seconds=0.0, most=1)
    batcher.add("broken")
    batcher.add("fine")
    assert ready.wait(timeout=30)
    assert sent == [["fine"]]
    assert "could not enqueue evidence.publish_many for 1 calls" in caplog.text


def test_the_proxy_process_sends_a_batch_message_to_the_evidence_queue(monkeypatch, settings):
    # Through the real broker: the proxy's publish_enqueue (not the tests' recorder) puts one
    # evidence.publish_many message with every id on the evidence queue.
    monkeypatch.setattr(capture, "publish_enqueue", REAL_PUBLISH_ENQUEUE)
    settings.SYNTH_PROXY_PROCESS = True
    settings.SYNTH_PROXY_PUBLISH_BATCH_SECONDS = 30  # nothing leaves before the flush below
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete("evidence")
    for n in range(5):
        capture.publish_enqueue(interaction_id=f"int_{n}")
    assert broker.llen("evidence") == 0
    publish_batch.batcher(seconds=30).flush()
    messages = broker.lrange("evidence", 0, -1)
    assert len(messages) == 1
    message = json.loads(messages[0])
    assert message["headers"]["task"] == "evidence.publish_many"
    args = json.loads(base64.b64decode(message["body"]))[0]
    assert args == [[f"int_{n}" for n in range(5)]]
    broker.delete("evidence")

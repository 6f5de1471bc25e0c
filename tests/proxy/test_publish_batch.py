"""The proxy process' evidence batches (apps.proxy.publish_batch): the settled calls' ids
reach the evidence queue as one message (the batcher itself: tests/core/test_send_batch.py)."""

from __future__ import annotations

import base64
import json

import pytest
import redis

from apps.proxy import capture, publish_batch
from tests.proxy.test_evidence_worker import REAL_PUBLISH_ENQUEUE


@pytest.fixture(autouse=True)
def _no_process_batcher():
    publish_batch.EVIDENCE.forget()
    yield
    publish_batch.EVIDENCE.forget()


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

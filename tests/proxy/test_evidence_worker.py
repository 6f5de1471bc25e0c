"""End to end with a real Celery worker on Redis: a model call through the live server is
staged, delivered, published by "evidence.publish" on the evidence queue, verified, and
readable by its organization through /api/interactions."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import anthropic
import pytest
import redis
from django.conf import settings
from django.db import connection

from apps.objects.selectors import object_get
from apps.objects.services import object_read
from apps.proxy import capture
from apps.proxy.models import Delivery, Eligibility, Integrity, Interaction
from tests.conftest import make_member
from tests.proxy.conftest import issue, make_route, scripted

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
REAL_PUBLISH_ENQUEUE = capture.publish_enqueue


@pytest.fixture
def evidence_worker(tmp_path):
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "SYNTH_VAR_DIR": str(settings.VAR_DIR),
        "SYNTH_OBJECT_STORE": settings.SYNTH_OBJECT_STORE,
        "SYNTH_TOKENIZER_DIR": str(settings.SYNTH_TOKENIZER_DIR),
    }
    log = open(tmp_path / "worker.log", "wb")
    proc = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/celery"),
            "-A",
            "synth_project",
            "worker",
            "-Q",
            "evidence",
            "-c",
            "2",
            "-n",
            "evidence-test@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "INFO",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield tmp_path / "worker.log"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_published_by_a_real_worker(live_server_asgi, evidence_worker, qwen3_tokenizer, monkeypatch):
    monkeypatch.setattr(capture, "publish_enqueue", REAL_PUBLISH_ENQUEUE)
    alice = make_member("team", "alice")
    bob = make_member("rival", "bob")
    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "Published.<|im_end|>", "Streamed.<|im_end|>"))
    sdk = anthropic.Anthropic(
        base_url=live_server_asgi.url, api_key=issue(alice.org, "qwen3-test", trial="trl_w", run="run_w"), max_retries=0
    )
    message = sdk.messages.create(model="sonnet", max_tokens=50, messages=[{"role": "user", "content": "go"}])
    assert message.content[0].text == "Published."
    with sdk.messages.stream(model="sonnet", max_tokens=50, messages=[{"role": "user", "content": "go"}]) as stream:
        assert stream.get_final_text() == "Streamed."

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = list(Interaction.objects.values_list("integrity", flat=True))
        if len(states) == 2 and all(s == Integrity.VERIFIED for s in states):
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"not published: {states}\n{evidence_worker.read_text(errors='replace')[-3000:]}")

    # The second call repeats the first's prompt: staged as a delta on it, published whole.
    first, second = Interaction.objects.order_by("created_at", "id")
    assert second.prompt_base_id == first.id and second.prompt_shared == first.prompt_tokens
    objects = [json.loads(object_read(obj=object_get(org=alice.org, sha256=i.payload_sha256))) for i in (first, second)]
    assert objects[1]["prompt_ids"] == objects[0]["prompt_ids"] and len(objects[0]["prompt_ids"]) == first.prompt_tokens

    for interaction in Interaction.objects.all():
        assert interaction.payload is None and interaction.prompt_ids_packed is None
        assert interaction.delivery == Delivery.DELIVERED
        assert interaction.eligibility == Eligibility.ELIGIBLE
        detail = alice.client.get(f"/api/interactions/{interaction.id}").json()
        url = urlparse(detail["payload"]["download"]["url"])
        fetched = alice.client.get(f"{url.path}?{url.query}")
        content = b"".join(fetched.streaming_content) if fetched.streaming else fetched.content
        assert hashlib.sha256(content).hexdigest() == interaction.payload_sha256
        assert bob.client.get(f"/api/interactions/{interaction.id}").status_code == 404


def test_a_batch_is_published_by_a_real_worker_past_a_row_that_fails(evidence_worker):
    # The proxy's batch message: every row of it published and verified, a row that cannot
    # be published (staged without its payload) in the middle notwithstanding: that one is
    # handed on to evidence.publish, which retries it on its own.
    from apps.core.send_batch import SendBatcher
    from apps.proxy.publish_batch import _send_batch
    from tests.proxy.test_capture import ids_of, record

    alice = make_member("team", "alice")
    route = make_route()
    rows = []
    for n in range(5):
        row = capture.interaction_stage(rec=record(alice.org, route, ids_of(40, n), session=f"s-{n}"))
        capture.interaction_settle(interaction_id=row.id, delivery=Delivery.DELIVERED, staged=row)
        rows.append(row)
    broken = rows[2]
    Interaction.objects.filter(pk=broken.pk).update(payload=None)
    batcher = SendBatcher(send=_send_batch, seconds=60, what="evidence.publish_many")
    for row in rows:
        batcher.add(row.id)
    batcher.flush()

    fine = [row.id for row in rows if row is not broken]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if Interaction.objects.filter(pk__in=fine, integrity=Integrity.VERIFIED).count() == len(fine):
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"not published\n{evidence_worker.read_text(errors='replace')[-3000:]}")
    while time.monotonic() < deadline and "retrying it alone" not in evidence_worker.read_text(errors="replace"):
        time.sleep(0.2)
    log = evidence_worker.read_text(errors="replace")
    assert f"evidence.publish of {broken.id} failed in a batch; retrying it alone" in log
    assert Interaction.objects.get(pk=broken.pk).integrity == Integrity.STAGED

"""The proxy process' evidence publications, sent to the broker in batches.

Every settled call is handed to the evidence worker (queue "evidence"). One Celery message
per call cost the proxy's interpreter more than the call's settle statement, and the worker a
task per call. Here a settle only appends the row's id to the process' batcher
(apps.core.send_batch), which sends what gathered as one "evidence.publish_many" message
within SYNTH_PROXY_PUBLISH_BATCH_SECONDS. A row whose message never arrived stays staged
until ``staged_sweep`` enqueues it again.
"""

from __future__ import annotations

from apps.core.send_batch import ProcessBatcher, SendBatcher


def _send_batch(batch: list[str]) -> None:
    from apps.proxy.tasks import evidence_publish_many_task

    evidence_publish_many_task.apply_async(args=[batch], retry=False)


EVIDENCE = ProcessBatcher(send=_send_batch, what="evidence.publish_many")


def batcher(*, seconds: float) -> SendBatcher:
    """The process' evidence batcher, made on first use (a forked child makes its own)."""
    return EVIDENCE.get(seconds=seconds)

"""The configured object store (``settings.SYNTH_OBJECT_STORE``) and grant lifetimes.

``file:///abs/path`` is the filesystem backend (apps.objects.filesystem); ``s3://bucket[/prefix]``
the S3 one (apps.objects.s3), with ``SYNTH_S3_ENDPOINT_URL``, ``SYNTH_S3_REGION``,
``SYNTH_S3_VERIFY``, ``SYNTH_S3_CREATE_BUCKET`` and the usual AWS credential variables,
which boto3 reads itself.
"""

from __future__ import annotations

import os
import threading
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from apps.objects.contract import ObjectStore
from apps.objects.filesystem import FileSystemStore
from apps.objects.s3 import S3Store

_stores: dict[tuple[str | bool | None, ...], ObjectStore] = {}
_stores_lock = threading.Lock()


def store_get() -> ObjectStore:
    """The configured store. Cached per configuration, so a settings change (tests) switches it."""
    url = settings.SYNTH_OBJECT_STORE
    config = (
        url,
        settings.SYNTH_S3_ENDPOINT_URL,
        settings.SYNTH_S3_REGION,
        settings.SYNTH_S3_VERIFY,
        settings.SYNTH_S3_CREATE_BUCKET,
        # boto3 reads the credentials itself; a change of them (tests) needs a new client.
        os.environ.get("AWS_ACCESS_KEY_ID"),
    )
    store = _stores.get(config)
    if store is not None:
        return store
    with _stores_lock:
        store = _stores.get(config)
        if store is None:
            store = _stores[config] = _store_build(url)
    return store


def _store_build(url: str) -> ObjectStore:
    parts = urlsplit(url)
    if parts.scheme == "file":
        return FileSystemStore(Path(parts.path))
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ImproperlyConfigured(f"SYNTH_OBJECT_STORE needs a bucket: s3://bucket[/prefix], got {url!r}")
        return S3Store(
            bucket=parts.netloc,
            prefix=parts.path,
            endpoint_url=settings.SYNTH_S3_ENDPOINT_URL,
            region=settings.SYNTH_S3_REGION,
            verify_by=settings.SYNTH_S3_VERIFY,
            create_bucket=settings.SYNTH_S3_CREATE_BUCKET,
        )
    raise ImproperlyConfigured(f"SYNTH_OBJECT_STORE must be file:///abs/path or s3://bucket[/prefix], got {url!r}")


def grant_expiry() -> datetime:
    return timezone.now() + timedelta(seconds=settings.SYNTH_GRANT_TTL_SECONDS)

"""Writes to the object store (placeholder: filesystem only; being completed)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from django.conf import settings

from apps.accounts.models import Organization
from apps.objects.models import StoredObject


def _root() -> Path:
    return Path(settings.SYNTH_OBJECT_STORE.removeprefix("file://"))


def object_put(*, org: Organization, data: bytes, content_type: str = "application/octet-stream") -> StoredObject:
    """Store bytes create-only under sha256/<hex>, verify, and commit the org's reference."""
    digest = hashlib.sha256(data).hexdigest()
    path = _root() / "sha256" / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    obj, _ = StoredObject.objects.get_or_create(
        org=org, sha256=digest, defaults={"size": len(data), "content_type": content_type}
    )
    return obj


def object_read(*, obj: StoredObject) -> bytes:
    return (_root() / "sha256" / obj.sha256).read_bytes()

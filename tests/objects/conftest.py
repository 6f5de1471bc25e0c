from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import urlsplit

import pytest

from apps.objects.filesystem import FileSystemStore
from apps.objects.store import store_get
from tests.s3server import s3_server, s3_store  # noqa: F401  (fixtures)


@pytest.fixture
def fs_store(settings: Any, tmp_path: Any) -> FileSystemStore:
    settings.SYNTH_OBJECT_STORE = f"file://{tmp_path / 'objects'}"
    store = store_get()
    assert isinstance(store, FileSystemStore)
    return store


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def local(url: str) -> str:
    """Path and query of one of our own URLs, for the Django test client."""
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}" if parts.query else parts.path

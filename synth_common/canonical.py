"""Canonical JSON: the one byte form that digests are taken over.

Definition: UTF-8; object keys sorted by code point; no insignificant whitespace
(separators "," and ":"); non-ASCII characters written as themselves, not escaped;
floats must be finite; integers written in decimal. Two documents that are equal as
JSON values have identical canonical bytes, so sha256(canonical) identifies a value.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_bytes(value: Any) -> bytes:
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    ).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_digest(value: Any) -> str:
    return sha256_hex(canonical_bytes(value))

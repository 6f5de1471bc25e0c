"""Canonical JSON for the server's modules: the definition lives in the Django-free
synth_common.canonical, which the launcher and the sandbox use as well."""

from __future__ import annotations

from synth_common.canonical import canonical_bytes, canonical_digest, sha256_hex

__all__ = ["canonical_bytes", "canonical_digest", "sha256_hex"]

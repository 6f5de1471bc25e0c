"""Prefixed, time-ordered identifiers such as ``run_01jd...``.

Time-ordered so that sorting by id follows creation order (cursor paging, admin);
80 random bits so that ids are unguessable enough not to leak tenants' volume.
"""

from __future__ import annotations

import secrets
import time

from django.db import models

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case


def new_id(prefix: str) -> str:
    return _encoded(prefix, (int(time.time() * 1000) << 80) | secrets.randbits(80))


def id_floor(prefix: str, *, at: float) -> str:
    """The least id of ``prefix`` that ``new_id`` can make at ``at`` (seconds since the epoch)
    or later: the rows made since a moment are a range of their primary key."""
    return _encoded(prefix, max(0, int(at * 1000)) << 80)


def _encoded(prefix: str, value: int) -> str:
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return f"{prefix}_{''.join(reversed(chars))}"


class PrefixedIdField(models.CharField):
    """A primary key filled with ``new_id(prefix)`` when the row is built."""

    def __init__(self, *args: object, prefix: str = "", **kwargs: object) -> None:
        self.prefix = prefix
        kwargs.setdefault("max_length", 40)
        kwargs["primary_key"] = True
        kwargs["editable"] = False
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def deconstruct(self):  # type: ignore[no-untyped-def]
        name, path, args, kwargs = super().deconstruct()
        kwargs["prefix"] = self.prefix
        kwargs.pop("primary_key", None)
        kwargs.pop("editable", None)
        return name, path, args, kwargs

    def has_default(self) -> bool:
        return True

    def get_default(self) -> str:
        return new_id(self.prefix)

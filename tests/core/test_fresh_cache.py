"""synth_common.fresh_cache: a value is served while the read that produced it is fresh.

Freshness is driven by the read's start time passed in, so these tests place reads in the
past instead of sleeping.
"""

from __future__ import annotations

import time

from synth_common.fresh_cache import FreshCache


def cache(check: float = 10.0) -> FreshCache[str, str]:
    return FreshCache(maxsize=4, check_seconds=lambda: check)


def test_a_value_is_served_while_its_read_is_fresh():
    c = cache()
    c.put("k", "v", read_started=time.monotonic())
    assert c.get("k") == "v"
    c.put("old", "v", read_started=time.monotonic() - 11)  # began longer ago than the interval
    assert c.get("old") is None


def test_the_later_of_two_reads_is_kept():
    c = cache()
    now = time.monotonic()
    c.put("k", "later", read_started=now)
    c.put("k", "earlier", read_started=now - 1)  # finished after, but began before
    assert c.get("k") == "later"


def test_off_keeps_nothing():
    c = cache(check=0)
    c.put("k", "v", read_started=time.monotonic())
    assert c.get("k") is None


def test_read_through_reads_once_and_never_keeps_nothing():
    c = cache()
    reads: list[str] = []

    def read(value: str | None):
        def go() -> str | None:
            reads.append("read")
            return value

        return go

    assert c.read_through("k", read=read("v")) == "v"
    assert c.read_through("k", read=read("other")) == "v"
    assert c.read_through("k", read=read("fresh"), cached=False) == "fresh"  # the caller asked for the database
    assert c.read_through("k", read=read("v2"), usable=lambda v: v != "fresh") == "v2"
    assert c.read_through("missing", read=read(None)) is None
    assert c.read_through("missing", read=read(None)) is None
    assert len(reads) == 5


def test_entries_are_bounded():
    c = cache()
    for i in range(10):
        c.put(str(i), "v", read_started=time.monotonic())
    assert sum(c.get(str(i)) is not None for i in range(10)) == 4
    c.drop("9")
    assert c.get("9") is None
    c.clear()
    assert c.get("8") is None

"""Time-ordered ids: the rows made since a moment are a range of their primary key."""

from __future__ import annotations

import pytest

from apps.core import ids


class FrozenTime:
    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


@pytest.mark.parametrize("at", [1_765_000_000.0, 1_765_000_000.0004, 1_765_000_000.9996])
def test_ids_made_at_a_moment_or_later_sort_at_or_after_its_floor(monkeypatch, at):
    clock = FrozenTime(at - 0.001)
    monkeypatch.setattr(ids, "time", clock)
    before = [ids.new_id("mcr") for _ in range(50)]
    clock.now = at
    same = [ids.new_id("mcr") for _ in range(50)]
    clock.now = at + 0.001
    after = [ids.new_id("mcr") for _ in range(50)]
    floor = ids.id_floor("mcr", at=at)
    assert floor.startswith("mcr_") and len(floor) == len(same[0])
    assert all(i < floor for i in before)
    assert all(i >= floor for i in same + after)
    # The floor is an id itself: made at that instant with no random bits.
    assert floor[:14] == same[0][:14] and floor.endswith("0" * 16)

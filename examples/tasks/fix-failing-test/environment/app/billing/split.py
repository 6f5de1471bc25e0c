"""Split a bill in whole cents."""


def split_bill(total_cents: int, people: int) -> list[int]:
    """Return `people` amounts that add up to `total_cents`, larger amounts first."""
    if people <= 0:
        raise ValueError("people must be positive")
    if total_cents < 0:
        raise ValueError("total_cents must not be negative")
    share = total_cents // people
    remainder = total_cents % people
    amounts = [share] * people
    for i in range(remainder - 1):
        amounts[i] += 1
    return amounts

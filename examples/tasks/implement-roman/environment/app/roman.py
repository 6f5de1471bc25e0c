"""Roman numerals (see the task instruction for the exact specification)."""


def to_roman(n: int) -> str:
    raise NotImplementedError


def from_roman(s: str) -> int:
    raise NotImplementedError

"""Counts in words, as a person writes them: "1 rank", "2 ranks" ("1 ranks finished" was printed
after every one-rank launch)."""
from __future__ import annotations


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """``number`` and ``noun``, the noun plural (``plural``, or ``noun`` + "s") unless it is one."""
    return f"{number} {noun if number == 1 else (plural or noun + 's')}"

"""Rank output bytes -> whole lines, for the supervisor's watcher and the between-calls reader.

Lines are only ever handed on whole, so lines of different ranks never mix mid-line.
Memory stays bounded: a partial line longer than MAX_LINE is cut (at a UTF-8 character
boundary), and nothing here keeps more than that partial line.
"""
from __future__ import annotations

__all__ = ["MAX_LINE", "LineSplitter", "utf8_boundary"]

MAX_LINE = 64 * 1024


class LineSplitter:
    """Feeds bytes, returns complete lines (decoded, without the newline).
    A carriage return keeps only what follows it, as a terminal would show."""

    def __init__(self) -> None:
        self._partial = bytearray()

    def feed(self, data: bytes) -> list[str]:
        self._partial += data
        lines = []
        while True:
            cut = self._partial.find(b"\n")
            if cut < 0:
                break
            lines.append(_decode(self._partial[:cut]))
            del self._partial[:cut + 1]
        while len(self._partial) > MAX_LINE:
            cut = utf8_boundary(self._partial, MAX_LINE)
            lines.append(_decode(self._partial[:cut]))
            del self._partial[:cut]
        return lines

    def flush(self) -> list[str]:
        """The last, unterminated line (at end of file), if any."""
        if not self._partial:
            return []
        line = _decode(self._partial)
        self._partial.clear()
        return [line]


def utf8_boundary(data: bytes | bytearray, limit: int) -> int:
    """Where to cut ``data`` at most ``limit`` bytes in without splitting a UTF-8 character
    (a split one would show as U+FFFD on both sides): back up over continuation bytes
    (0b10xxxxxx), at most three, to the start of the character that straddles the cut."""
    cut = limit
    while cut > limit - 3 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut if (data[cut] & 0xC0) != 0x80 else limit   # not UTF-8 at all: cut where asked


def _decode(raw: bytes | bytearray) -> str:
    text = bytes(raw).decode("utf-8", errors="replace")
    if "\r" in text:
        text = text.rstrip("\r")
        text = text[text.rfind("\r") + 1:]
    return text

"""The notebook's own standard streams, as everything on the notebook's side writes to them.

A notebook's ``sys.stdout``/``sys.stderr`` are not always files that work: ``pythonw`` and
some services start Python with them None, a library or a test harness replaces them with
an object that has no ``fileno`` (or whose ``fileno`` raises), a service closes them, and a
terminal that went away turns every write into an OSError. None of that may stop a launch:
the ranks' output goes to their logs whatever the notebook's streams are (the ranks have
pipes of their own), and what the notebook side would show in the cell (the launch line,
the ranks' lines, the summary) is dropped when there is nowhere to show it, as ``print`` does
with a None ``sys.stdout``.

``OUT`` and ``ERR`` look ``sys.stdout``/``sys.stderr`` up at each call (a kernel or a
``contextlib.redirect_stdout`` may swap them at any time) and drop what cannot be written.
"""
from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("notebook_launch")

# What an unusable stream raises: OSError (EBADF, EIO, EPIPE, io.UnsupportedOperation),
# ValueError (a closed file), AttributeError/TypeError (an object that is no stream).
_UNUSABLE = (OSError, ValueError, AttributeError, TypeError)


class NotebookStream(io.TextIOBase):
    """``sys.<name>`` of this moment, or nothing when it cannot be written."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.stream_name = name

    def _current(self) -> Any:
        return getattr(sys, self.stream_name, None)

    def write(self, text: str) -> int:
        stream = self._current()
        if stream is not None:
            try:
                stream.write(text)
            except _UNUSABLE:
                log.debug("the notebook's sys.%s cannot be written; dropped what notebook_launch "
                          "would show there (the ranks' logs have it)", self.stream_name, exc_info=True)
        return len(text)

    def flush(self) -> None:
        stream = self._current()
        if stream is not None:
            try:
                stream.flush()
            except _UNUSABLE:
                log.debug("the notebook's sys.%s cannot be flushed", self.stream_name, exc_info=True)

    def isatty(self) -> bool:
        try:
            return bool(self._current().isatty())
        except _UNUSABLE:
            return False

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        """Never closes the notebook's stream (nor itself: it is shared)."""


OUT = NotebookStream("stdout")
ERR = NotebookStream("stderr")


def notebook_stream(name: str) -> NotebookStream:
    """``OUT`` for "stdout", ``ERR`` for "stderr" (a rank's stream names)."""
    return ERR if name == "stderr" else OUT



class _Dropped(io.TextIOBase):
    """Takes writes and keeps nothing."""

    def write(self, text: str) -> int:
        return len(text)

    def writable(self) -> bool:
        return True


_DROPPED = _Dropped()


@contextlib.contextmanager
def flushable_streams() -> Iterator[None]:
    """Around IPython's display(), update_display() and publish_display_data(): ipykernel
    flushes ``sys.stdout`` and ``sys.stderr`` first and raises when one is None or closed, so
    the panel would never show. For that moment such a stream is one that drops; the
    notebook's own comes back after (unless something replaced it meanwhile)."""
    swapped = {}
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        if not _flushable(stream):
            swapped[name] = stream
            setattr(sys, name, _DROPPED)
    try:
        yield
    finally:
        for name, stream in swapped.items():
            if getattr(sys, name, None) is _DROPPED:
                setattr(sys, name, stream)


def _flushable(stream: Any) -> bool:
    if stream is None:
        return False
    try:
        stream.flush()
    except _UNUSABLE:
        return False
    return True

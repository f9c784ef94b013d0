"""Writes to the notebook's stream objects, inherited by a forked rank, go to the rank's output.

A forked rank inherits every Python object of the notebook, among them the
kernel's ``sys.stdout``/``sys.stderr`` (ipykernel ``OutStream`` objects) that
logging handlers or libraries saved before the launch (``logging.basicConfig()``
keeps the ``sys.stderr`` of that moment). Replacing ``sys.stdout``/``sys.stderr``
in the rank does not reach those saved references, so their writes would
bypass the rank's capture: untagged in the cell, missing from the rank's log,
and past the output rate limit. Here every such object forwards its writes to
the rank's captured streams instead.
"""
from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("notebook_launch")

_FORWARDED_METHODS = ("write", "writelines", "flush")
_forwarded: list[Any] = []   # the objects redirected in this process (a handful)


def redirect_inherited_streams(previous_out: Iterable[Any], previous_err: Iterable[Any],
                               stdout: io.TextIOBase, stderr: io.TextIOBase) -> None:
    """Make the objects that were this process's stdout (``previous_out``) and stderr
    (``previous_err``) before the rank captured its output write to ``stdout``/``stderr``,
    and so every ipykernel ``OutStream`` of the process, whoever holds it."""
    for objects, target in ((previous_out, stdout), (previous_err, stderr)):
        for stream in objects:
            if stream is not None and stream is not stdout and stream is not stderr:
                _forward(stream, target)
    _forward_kernel_streams(stdout, stderr)


def writes_to_rank_output(stream: Any) -> bool:
    """True for None (a library's default stream), the rank's stdout/stderr, the
    notebook's streams redirected to them, and any stream on fd 1 or 2."""
    if stream is None or any(stream is s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)):
        return True
    if any(stream is s for s in _forwarded):
        return True
    iostream = sys.modules.get("ipykernel.iostream")
    if iostream is not None and isinstance(stream, iostream.OutStream):
        return True
    try:
        return stream.fileno() in (1, 2)
    except (AttributeError, OSError, ValueError):   # io.UnsupportedOperation is an OSError
        return False


def _forward(stream: Any, target: io.TextIOBase) -> None:
    _forwarded.append(stream)
    try:
        for name in _FORWARDED_METHODS:
            setattr(stream, name, getattr(target, name))
    except (AttributeError, TypeError):   # a stream type without an instance dict
        log.debug("cannot forward writes of %r to the rank's output", stream, exc_info=True)


def _forward_kernel_streams(stdout: io.TextIOBase, stderr: io.TextIOBase) -> None:
    """Patch ipykernel's OutStream class itself, so instances we were never shown (a
    library's saved copy) forward too, by their stream name."""
    iostream = sys.modules.get("ipykernel.iostream")
    out_stream = getattr(iostream, "OutStream", None)
    if out_stream is None:
        return

    def target(stream: Any) -> io.TextIOBase:
        return stderr if getattr(stream, "name", "stdout") == "stderr" else stdout

    def write(self: Any, text: str) -> int:
        return target(self).write(text)

    def writelines(self: Any, lines: Iterable[str]) -> None:
        target(self).writelines(lines)

    def flush(self: Any) -> None:
        target(self).flush()

    out_stream.write = write
    out_stream.writelines = writelines
    out_stream.flush = flush

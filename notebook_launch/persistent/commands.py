"""Notebook -> rank commands over one pipe per rank: length-prefixed cloudpickled frames.

The rank -> notebook direction is ``protocol`` (events, output pipes); this is
the other direction, which only persistent ranks need: each call is one CALL
frame carrying a ``rank.runner.Job``, and STOP ends the rank's loop.
"""
from __future__ import annotations

import enum
import logging
import os
import struct
from dataclasses import dataclass
from typing import Any

_HEADER = struct.Struct("!I")
log = logging.getLogger("notebook_launch")


class Command(str, enum.Enum):
    CALL = "call"    # payload: a rank.runner.Job (function, args, kwargs), cloudpickled
    STOP = "stop"    # payload: None; the rank's loop returns and the process exits


@dataclass
class CommandPipe:
    """One rank's command pipe: the notebook writes, the rank reads. Each end is closed
    once, here, so a number the kernel has since reused is never closed again."""
    read_fd: int
    write_fd: int

    @classmethod
    def open(cls) -> CommandPipe:
        read_fd, write_fd = os.pipe()
        os.set_inheritable(write_fd, False)
        return cls(read_fd, write_fd)

    def close_read_end(self) -> None:
        if self.read_fd >= 0:
            _close(self.read_fd)
            self.read_fd = -1

    def close_write_end(self) -> None:
        if self.write_fd >= 0:
            _close(self.write_fd)
            self.write_fd = -1


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        log.debug("closing command fd %d failed", fd, exc_info=True)


def encode(command: Command, payload: Any) -> bytes:
    """One frame; encode once and write the same bytes to every rank."""
    import cloudpickle
    data = cloudpickle.dumps((Command(command).value, payload))
    return _HEADER.pack(len(data)) + data


def send(fd: int, frame: bytes) -> None:
    """Write a whole frame (the rank reads it whole; a pipe write may be partial)."""
    view = memoryview(frame)
    while view:
        view = view[os.write(fd, view):]


def receive(fd: int) -> tuple[Command, Any]:
    """Block until the next frame; end of file (the notebook is gone) reads as STOP.
    A payload that cannot be unpickled here raises (the caller reports it for that call)."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return Command.STOP, None
    (size,) = _HEADER.unpack(header)
    data = _read_exactly(fd, size)
    if data is None:
        return Command.STOP, None
    import cloudpickle
    kind, payload = cloudpickle.loads(data)
    return Command(kind), payload


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class InterruptSlot:
    """What the notebook and its ranks must know of each other between a signal and its
    answer, in memory shared with the ranks (made before the fork):

    - which call the notebook interrupted. A SIGINT alone cannot say which call it is for:
      it may land before the rank has started the call (the rank then raises as the call
      starts) or after the rank finished it (the rank then ignores it);
    - per rank, whether it takes interrupts yet (``serving``): a rank still starting
      (bootstrap, imports) has no handler of ours, so a SIGINT would kill it. The notebook
      signals only serving ranks; the others see the request as the call starts;
    - per rank, which call it is reporting (``reporting``): its code has returned or raised
      and it is sending the outcome (a big result takes seconds). That is not stuck code,
      so the interrupt's grace does not run out on it."""

    def __init__(self, num_ranks: int = 1) -> None:
        import mmap
        self.num_ranks = num_ranks
        # anonymous: shared with forked children; one word for the request, two per rank
        self._memory = mmap.mmap(-1, _SLOT.size * (1 + 2 * num_ranks))
        self.request(0)

    def request(self, call_number: int) -> None:
        _SLOT.pack_into(self._memory, 0, call_number)

    def requested(self, call_number: int) -> bool:
        return bool(_SLOT.unpack_from(self._memory, 0)[0] == call_number)

    def set_serving(self, local_rank: int) -> None:
        _SLOT.pack_into(self._memory, self._offset(local_rank, 0), 1)

    def serving(self, local_rank: int) -> bool:
        return bool(_SLOT.unpack_from(self._memory, self._offset(local_rank, 0))[0])

    def set_reporting(self, local_rank: int, call_number: int) -> None:
        _SLOT.pack_into(self._memory, self._offset(local_rank, 1), call_number)

    def reporting(self, local_rank: int, call_number: int) -> bool:
        return bool(_SLOT.unpack_from(self._memory, self._offset(local_rank, 1))[0] == call_number)

    def _offset(self, local_rank: int, field: int) -> int:
        if not 0 <= local_rank < self.num_ranks:
            raise IndexError(f"local rank {local_rank} of {self.num_ranks}")
        return _SLOT.size * (1 + 2 * local_rank + field)

    def close(self) -> None:
        self._memory.close()


_SLOT = struct.Struct("q")

"""The interrupt slot of persistent ranks, a format both sides use: a small memfd shared by the
notebook and its local ranks (made before the fork; a spawned rank maps the same file), in which
the notebook says which call it interrupts and each rank says how far it is (``InterruptSlot``).
Here so that neither side reads the other's module for it: the notebook's pool writes requests and
reads the ranks' words (``persistent.call``), a rank's serving loop the other way round
(``rank.serve``). Its layout: one signed 64-bit word for the request, then three per rank
(serving, reporting, started).
"""
from __future__ import annotations

import os
import struct
from typing import Any

from .commands import close_fd


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
      so the interrupt's grace does not run out on it;
    - per rank, which call's code it began (``started``): before that it is starting (a
      spawned rank imports for seconds) or unpickling the call (which may import modules),
      not stuck in a collective, so the grace waits for it too (``CallSupervisor.still_starting``)."""

    def __init__(self, num_ranks: int = 1, fd: int | None = None) -> None:
        import mmap
        self.num_ranks = num_ranks
        size = _SLOT.size * (1 + 3 * num_ranks)   # one word for the request, three per rank
        # A memfd, not anonymous memory: forked children share the mapping, and a spawned
        # rank maps the same file from the fd it was passed (``__reduce__``).
        self.fd = fd
        if self.fd is None:
            self.fd = _anonymous_file()
            os.ftruncate(self.fd, size)
            self._memory = mmap.mmap(self.fd, size)
            self.request(0)
        else:
            self._memory = mmap.mmap(self.fd, size)

    def __reduce__(self) -> tuple[Any, ...]:
        """(For a spawned rank, which was passed ``fd`` under the same number.)"""
        return (InterruptSlot, (self.num_ranks, self.fd))

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

    def set_started(self, local_rank: int, call_number: int) -> None:
        _SLOT.pack_into(self._memory, self._offset(local_rank, 2), call_number)

    def started(self, local_rank: int, call_number: int) -> bool:
        """Whether the rank began running this call's code (it took the call's frame whole)."""
        return bool(_SLOT.unpack_from(self._memory, self._offset(local_rank, 2))[0] == call_number)

    def _offset(self, local_rank: int, field: int) -> int:
        if not 0 <= local_rank < self.num_ranks:
            raise IndexError(f"local rank {local_rank} of {self.num_ranks}")
        return _SLOT.size * (1 + 3 * local_rank + field)

    def close(self) -> None:
        self._memory.close()
        if self.fd is not None:
            close_fd(self.fd)
            self.fd = None


_SLOT = struct.Struct("q")


def _anonymous_file() -> int:
    """A file with no name (nothing to clean up), not inherited by what the notebook starts."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("notebook_launch-interrupt-slot", os.MFD_CLOEXEC)
    import tempfile
    fd, path = tempfile.mkstemp(prefix="notebook_launch-slot-")   # no memfd (macOS): unlinked at once
    os.unlink(path)
    return fd

"""The format of the messages a notebook sends a persistent rank on another machine (a Ray actor or a
SLURM task alike), which both sides use: the notebook writes them (``engines.remote.persistent``, under
``engines.ray.persistent`` and ``engines.slurm.persistent``), the rank reads them (``engines.remote.serve``).
Here so that neither side reads the other's module for it.

No memfd, Unix socket or shared memory reaches such a rank, so everything the notebook says to it
travels on the rank's events connection (the notebook -> rank direction, which a launch uses only
for signals): ``MESSAGE`` (its ``Kind``, then two numbers), and after a CALL's header its frame's
pickle (``channels.commands``, without the length header: the first number is its size) and the
bytes of its tensor file (the second number). INTERRUPT names the call (the first number); STOP
has none. A where request (``channels.remote_where``) shares the connection: a 4-byte
``sockets.SIGNAL_FRAME`` whose first byte is 0, which no ``Kind`` is (``WHERE_REQUEST_BYTE``), so
a reader tells the two apart by the first byte.
"""
from __future__ import annotations

import enum
import struct

MESSAGE = struct.Struct("!BQQ")   # kind, then two numbers (CALL: sizes of the frame and its tensors)
WHERE_REQUEST_BYTE = b"\0"        # a where request's first byte; no message kind is 0


class Kind(enum.IntEnum):
    CALL = 1        # the numbers: the size of the frame's pickle, of its tensors' bytes (both follow)
    INTERRUPT = 2   # the number of the call to interrupt
    STOP = 3        # the rank's serving loop returns


def encode_message(kind: Kind, first: int = 0, second: int = 0) -> bytes:
    """A message's header (a CALL's pickle and tensor bytes follow it)."""
    return MESSAGE.pack(int(kind), first, second)

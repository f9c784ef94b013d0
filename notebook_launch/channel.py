"""Rank -> parent events over a pipe: length-prefixed pickled frames.

One pipe per rank keeps the parent's reader simple (no interleaving between
ranks) and lets the parent notice a dead rank as end-of-file. Inside a rank,
``current()`` returns the writer, or None when the code runs outside a launch;
the in-rank APIs (``progress``, results, errors) go through it.
"""
from __future__ import annotations

import os
import pickle
import struct
import threading

_HEADER = struct.Struct("!I")

# Event kinds sent by a rank.
READY = "ready"          # {"pid": int, "device": str}
PROGRESS = "progress"    # payload defined by notebook_launch.progress
RESULT = "result"        # pickled value (bytes, already serialized by the worker)
ERROR = "error"          # {"type", "message", "traceback", "kind"}

_writer: "EventWriter | None" = None
# XLA runs several ranks as threads of one process (one per device); each such
# thread installs its own writer here, so its events carry its own rank.
_thread_writer = threading.local()


class EventWriter:
    """Writes events to the parent. Thread-safe, so tqdm threads and user threads may share it."""

    def __init__(self, fd: int):
        self.fd = fd
        self._lock = threading.Lock()

    def send(self, kind: str, payload) -> None:
        data = pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
        frame = _HEADER.pack(len(data)) + data
        with self._lock:
            view = memoryview(frame)
            while view:
                written = os.write(self.fd, view)
                view = view[written:]

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


class EventReader:
    """Decodes frames from the bytes the parent reads off one rank's pipe."""

    def __init__(self):
        self._buffer = bytearray()

    def feed(self, data: bytes):
        """Add bytes; return the list of complete (kind, payload) events."""
        self._buffer += data
        events = []
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            end = _HEADER.size + size
            if len(self._buffer) < end:
                break
            events.append(pickle.loads(bytes(self._buffer[_HEADER.size:end])))
            del self._buffer[:end]
        return events


def install(writer: "EventWriter | None") -> None:
    """Make ``writer`` this process's channel to the parent (None: outside a launch)."""
    global _writer
    _writer = writer


def install_for_thread(writer: "EventWriter | None") -> None:
    """Make ``writer`` the channel of the calling thread only (a rank that is a thread)."""
    _thread_writer.writer = writer


def current() -> "EventWriter | None":
    """The channel to the parent, or None when this process is not a launched rank.
    A thread that is a rank of its own (XLA) gets its own; other threads the process's."""
    return getattr(_thread_writer, "writer", None) or _writer

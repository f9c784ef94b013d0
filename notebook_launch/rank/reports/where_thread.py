"""A rank's where-thread (issue 31): the notebook asks a rank where it is without a signal.

Each rank (and each process a rank forks, such as a DataLoader worker: ``whereabouts`` starts
one in the child after the fork) runs one daemon thread, named ``THREAD_NAME``, that blocks in
``read`` on a wake pipe. The notebook opens the pipe's write end through ``/proc/<pid>/fd`` (as
it opens the rank's memfds: the rank is its child) and writes an 8-byte request id. The thread
wakes, takes every thread's Python stack with ``sys._current_frames()`` under the interpreter
lock, and publishes them, in faulthandler's text format (the notebook's parser reads both), in
its answers memfd, with the ids it answers.

Why not a signal any more: faulthandler's all-thread dump ran in a signal handler, without the
interpreter lock, walking the list of thread states while other threads created and destroyed
theirs: ranks asked during a thread storm died of SIGSEGV. And a handled signal ends the system
call the receiving thread is in when that call does not restart (``sleep(3)`` in C returned
early). A thread blocked in ``read`` is woken by data, not by a signal, and reads the frames
while it holds the lock, when no thread state can change. It answers whenever any thread can
take the interpreter lock: while the others wait in gloo or NCCL, sleep, or block on a lock or a
socket. Only a rank whose lock is held by C code cannot answer; the notebook then falls back to
the signal, sent to this thread (``tgkill``), never to the thread running the user's code.

The request and the answers memfd are ``channels.where_request``'s format, which the notebook's
half (``diagnose.where_thread``) reads too.
"""
from __future__ import annotations

import os
import struct
import sys
import threading
from typing import Any

from ...channels.where_request import ANSWER_HEAD, ANSWER_LINE, ANSWER_TEXT, ANSWERS_NAME, RECENT, REQUEST

THREAD_NAME = "notebook_launch-where"   # our thread: not the user's (displayed stacks leave it out)
MAX_FRAMES = 100                         # frames kept per thread, innermost first (as faulthandler)
MAX_THREADS = 500


def dump_text(main_ident: int, skip: int) -> str:
    """Every thread's Python stack but ``skip``'s, in faulthandler's format, the main thread first
    (as a dump's "Current thread" would be), each thread's name in brackets after its id."""
    frames = sys._current_frames()
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    order = sorted((ident for ident in frames if ident != skip), key=lambda ident: ident != main_ident)
    parts = []
    for ident in order[:MAX_THREADS]:
        lines = [f"Thread 0x{ident:016x} [{names.get(ident, '')}] (most recent call first):"]
        frame: Any = frames[ident]
        while frame is not None and len(lines) <= MAX_FRAMES:
            code = frame.f_code
            lines.append(f'  File "{code.co_filename}", line {frame.f_lineno or 0} in {code.co_name}')
            frame = frame.f_back
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


class WhereThread:
    """The wake pipe, the answers memfd and the thread that answers (see the module). Made in
    the process that answers: a forked child makes its own (``close`` drops the inherited one)."""

    def __init__(self) -> None:
        self.wake_r, self.wake_w = os.pipe()   # close-on-exec: an exec'd child keeps neither
        self.answers_fd = os.memfd_create(ANSWERS_NAME)
        self.generation = 0
        self.recent: list[int] = []
        self.main_ident = threading.main_thread().ident or 0
        self._publish_head(0)
        self.thread = threading.Thread(target=self._serve, daemon=True, name=THREAD_NAME)
        self.thread.start()

    def _publish_head(self, length: int) -> None:
        tid = self.thread.native_id if hasattr(self, "thread") and self.thread.native_id else 0
        os.pwrite(self.answers_fd, ANSWER_HEAD.pack(self.generation, length, self.wake_w, tid or 0), 0)

    def _serve(self) -> None:
        self._publish_head(0)   # now with this thread's id: the notebook's fallback signals this thread only
        me = threading.get_ident()
        while True:
            try:
                data = os.read(self.wake_r, 4096)   # whole requests: each is written at once, 8 bytes
            except OSError:   # closed: this process dropped it (a fork's child made its own)
                return
            if not data:
                return
            ids = [REQUEST.unpack_from(data, offset)[0] for offset in range(0, len(data) - 7, REQUEST.size)]
            self.recent = (self.recent + ids)[-RECENT:]
            try:
                text = dump_text(self.main_ident, me)
            except Exception as exc:   # why: say so rather than leave the notebook waiting
                text = f"(the stacks could not be read: {type(exc).__name__}: {exc})\n"
            self.publish(f"{ANSWER_LINE} {' '.join(map(str, self.recent))}\n{text}".encode("utf-8", "replace"))

    def publish(self, body: bytes) -> None:
        """Write one answer: generation odd, the text, its length, generation even (each its own
        write, so that a reader that saw the same even generation before and after read them whole)."""
        self.generation += 1
        os.pwrite(self.answers_fd, struct.pack("<Q", self.generation), 0)
        os.pwrite(self.answers_fd, body, ANSWER_TEXT)
        os.pwrite(self.answers_fd, struct.pack("<Q", len(body)), 8)
        self.generation += 1
        os.pwrite(self.answers_fd, struct.pack("<Q", self.generation), 0)

    def close(self) -> None:
        """Drop what a fork inherited (the thread itself did not survive the fork)."""
        for fd in (self.wake_r, self.wake_w, self.answers_fd):
            try:
                os.close(fd)
            except OSError:
                pass

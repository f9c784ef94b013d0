"""Where a rank on another machine (a Ray actor, a SLURM task) is, asked over the network
(issue 20), the rank side; the notebook's is ``diagnose.remote_where``.

A local rank is read through ``/proc/<pid>`` (its whereabouts memfd) and dumps its stacks on a
signal (``rank.reports.whereabouts``). Such a rank runs on another machine: the notebook asks it on its
events connection (a request frame beside the notebook's signal frames, or its messages for a
persistent rank) and the rank answers on its answers connection, whose rank -> notebook
direction nothing else uses. The answer is built in the rank's own process by a thread of its
own (``Answerer``), not the main thread, which may be blocked in gloo, a lock or ``time.sleep``:
its collective record read in-process, and every thread's Python stack from
``sys._current_frames()`` (a blocked main thread has released the interpreter lock, so another
thread runs), with the source lines this node can read (the notebook may not have its files).

The request's and the reply's format is ``channels.remote_where`` (the body: ``snapshot``).
"""
from __future__ import annotations

import linecache
import os
import logging
import queue
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable

from ...channels.remote_where import encode_reply, request_number
from ...channels.sockets import SIGNAL_FRAME
from . import where_thread, whereabouts

log = logging.getLogger("notebook_launch")
MAX_FRAMES = 100            # frames kept per thread, innermost first (faulthandler keeps as many)




def read_record() -> dict[str, Any] | None:
    """This rank's collective record (``whereabouts.Record``), read in-process as the notebook
    reads a local rank's: the raw text (``FIELD_SEP`` fields), its number, and whether the rank
    is inside it. None when the bookkeeping is not installed (yet, or switched off)."""
    record = whereabouts._record
    if record is None:
        return None
    header = whereabouts.HEADER.unpack_from(record.map, 0)
    if header[0] != whereabouts.MAGIC:
        return None
    for _ in range(1000):
        gen, inside, size, seq = whereabouts.STATE.unpack_from(record.map, whereabouts.GEN_OFFSET)
        text = bytes(record.map[whereabouts.TEXT_OFFSET:whereabouts.TEXT_OFFSET + size])
        again = whereabouts.STATE.unpack_from(record.map, whereabouts.GEN_OFFSET)
        if gen == again[0] and gen % 2 == 0:
            return {"text": text.decode("utf-8", "replace"), "seq": seq, "inside": bool(again[1]),
                    "main_thread": header[2]}
        time.sleep(0.001)   # the main thread is between two writes: let it finish
    return None


def snapshot(between_calls: bool = False) -> dict[str, Any]:
    """Where this process is now: its record, every thread's stack but the asking one (innermost
    frame first, as faulthandler writes them), and the source lines of those frames this node
    can read (file -> line number -> text), for a notebook that cannot read them."""
    me = threading.get_ident()
    ours = {thread.ident for thread in threading.enumerate() if thread.name == where_thread.THREAD_NAME}
    sources: dict[str, dict[str, str]] = {}

    def source(filename: str, lineno: int) -> None:
        text = linecache.getline(filename, lineno).rstrip("\n") if filename else ""
        if text:
            sources.setdefault(filename, {})[str(lineno)] = text

    threads = []
    for ident, top in sys._current_frames().items():
        if ident == me or ident in ours:   # this thread, and the rank's where-thread (not the user's)
            continue
        frames: list[list[Any]] = []
        frame: Any = top
        while frame is not None and len(frames) < MAX_FRAMES:
            code, lineno = frame.f_code, frame.f_lineno or 0
            frames.append([code.co_filename, lineno, code.co_name])
            source(code.co_filename, lineno)
            frame = frame.f_back
        threads.append([ident, frames])
    record = read_record()
    if record is not None:
        fields = record["text"].split(whereabouts.FIELD_SEP)
        if len(fields) == 6 and fields[3] and fields[4].isdigit():
            source(fields[3], int(fields[4]))
    main = record["main_thread"] if record is not None else threading.main_thread().ident
    return {"record": record, "main_thread": main or 0, "threads": threads, "sources": sources,
            "between_calls": between_calls, "switched_off": whereabouts.switched_off()}




class Answerer:
    """Answers the notebook's where requests on the rank's answers connection, from a thread of
    its own (started here, so no answer catches the reading thread starting it). Requests that
    queued while one was answered get one answer, the newest's: the notebook waits for its
    latest request only."""

    def __init__(self, sock: socket.socket, between_calls: Callable[[], bool] = lambda: False) -> None:
        self.sock = sock
        self.between_calls = between_calls
        self.requests: queue.Queue[int] = queue.Queue()
        self.thread = threading.Thread(target=self._serve, daemon=True, name="notebook_launch-where")
        self.thread.start()

    def ask(self, number: int) -> None:
        self.requests.put(number)

    def _serve(self) -> None:
        while True:
            number = self.requests.get()
            while not self.requests.empty():
                number = self.requests.get_nowait()
            try:
                data = encode_reply(number, snapshot(self.between_calls()))
            except Exception as exc:   # why: the failure is sent as the answer; the notebook must not wait
                log.debug("could not say where this rank is", exc_info=True)
                data = encode_reply(number, {"error": f"{type(exc).__name__}: {exc}"})
            try:
                self.sock.sendall(data)
            except OSError:   # the run is over: the connection is closed
                log.debug("the where reply was not sent", exc_info=True)
                return


def obey_notebook(sock: socket.socket, answerer: Answerer, finished: threading.Event | None = None) -> None:
    """A rank on another machine (a Ray actor, a SLURM task): deliver the signals the notebook sends
    on ``sock`` (Stop, timeout, another rank failed), hand its where requests to ``answerer``, and if
    the notebook goes away while the rank runs, end the rank (as a local rank dies with its parent).
    ``finished``: set once the rank's function returned (an actor lives on): no signal after it."""
    from ..bootstrap import EXIT_FAILED
    buffer = b""
    while True:
        try:
            data = sock.recv(64)
        except OSError:
            data = b""
        if not data:
            if finished is None or not finished.is_set():
                os._exit(EXIT_FAILED)
            return
        buffer += data
        while len(buffer) >= SIGNAL_FRAME.size:
            (signum,) = SIGNAL_FRAME.unpack_from(buffer)
            buffer = buffer[SIGNAL_FRAME.size:]
            number = request_number(signum)
            if number is not None:
                answerer.ask(number)
            elif 0 < signum < signal.NSIG and (finished is None or not finished.is_set()):
                os.kill(os.getpid(), signum)   # never into an actor's next call

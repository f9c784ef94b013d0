"""Ask processes for their Python stacks (issue 31): the one way the notebook does it, for ranks
(``stacks.collect``) and for the processes they forked (``native_stacks.child_stacks``).

Each process is asked through its where-thread (``rank.reports.where_thread``): a request written to
its wake pipe, the answer read back from its answers memfd. No signal: the process goes on
exactly as before. Only a process that gives no answer and whose interpreter lock is held
(``lock_held``: its where-thread keeps waking to ask for the lock, and no more than one other
thread runs) is read the old way, by faulthandler's dump on ``DUMP_SIGNAL``, sent to its
where-thread alone (``tgkill``): that thread is blocked taking the lock, in no system call of
the user's. A process that does not answer for another reason (stopped, its where-thread gone,
a machine too loaded to run it within the wait) is never signalled: it is said not to have
answered.

``Asked.how`` says which way each process was read; the verdict says so of a rank read by the
signal (``hang_verdict``).
"""
from __future__ import annotations

import ctypes
import logging
import os
import platform
import random
import time
from dataclasses import dataclass

from ..channels.where_request import ANSWER_HEAD, ANSWER_LINE, ANSWER_TEXT, REQUEST
from .faulthandler_dump import parse_dump
from .hang_verdict import ThreadStack
from .proc_tasks import task_times

log = logging.getLogger("notebook_launch")
BY_THREAD = "thread"
BY_SIGNAL = "signal"
HELD_WINDOW = 0.2       # seconds over which a silent process's threads are watched (lock_held)
BUSY_NS = 2_000_000     # CPU time in a window above which a thread counts as running (2 ms)
SETTLE = 0.05           # a signal's dump is whole once its file stopped growing for this long
SIGNAL_WAIT = 1.0       # seconds at least for a signal's dump
_TGKILL = {"x86_64": 234, "aarch64": 131, "ppc64le": 250, "s390x": 241}   # where libc has no tgkill()


@dataclass
class Asked:
    """One process to ask: its pid and the /proc paths of its answers memfd and stacks file
    (None: it has none); filled in with ``text`` (faulthandler's format), ``how`` it was read
    (``BY_THREAD`` or ``BY_SIGNAL``), or ``note`` (a past-tense phrase: why there is none)."""
    pid: int
    answers: str | None
    stacks: str | None
    signum: int
    text: str = ""
    how: str = ""
    note: str = ""
    request: int = 0
    fd: int = -1           # the answers memfd, open while waiting
    thread: int = 0        # its where-thread's OS thread id
    offset: int = 0        # the stacks file's size before the signal


def ask_all(processes: list[Asked], wait: float) -> None:
    """Ask every process at once and wait, ``wait`` seconds in all (more for a signal's dump),
    for their answers (see the module)."""
    start = time.monotonic()
    pending = [asked for asked in processes if _send(asked)]
    try:
        _wait_for_answers(pending, start + wait / 2)
        pending = [asked for asked in pending if not asked.text]
        if pending:
            held = _held(pending)
            for asked in pending:
                if not asked.text and held.get(asked.pid):
                    _signal(asked)
            _wait_for_answers([a for a in pending if not a.how], start + wait)
            _wait_for_dumps([a for a in pending if a.how == BY_SIGNAL], max(start + wait,
                                                                         time.monotonic() + SIGNAL_WAIT))
        for asked in pending:
            if not asked.text and not asked.note:
                asked.note = (f"did not answer within {wait:g} s (its process may be stopped, or the machine too "
                              f"busy to run it), and its interpreter lock was not held: it was not signalled")
    finally:
        for asked in processes:
            if asked.fd >= 0:
                os.close(asked.fd)
                asked.fd = -1


def threads(asked: Asked) -> list[ThreadStack]:
    """The process's threads from its answer; from a signal's dump without the where-thread, which
    ran the handler (faulthandler's "Current thread"): it is ours, not the user's."""
    found = parse_dump(asked.text) if asked.text else []
    return [thread for thread in found if not thread.current] if asked.how == BY_SIGNAL else found


def _send(asked: Asked) -> bool:
    """Write a request to the process's wake pipe; False (with a note) when it cannot be asked."""
    if asked.answers is None:
        asked.note = "has no where-thread to ask"
        return False
    try:
        asked.fd = os.open(asked.answers, os.O_RDONLY | os.O_CLOEXEC)
        _gen, _length, wake, asked.thread = ANSWER_HEAD.unpack(os.pread(asked.fd, ANSWER_HEAD.size, 0))
        pipe = f"/proc/{asked.pid}/fd/{wake}"
        if not os.readlink(pipe).startswith("pipe:"):
            raise OSError(f"fd {wake} is not its wake pipe")
        asked.request = random.getrandbits(63)
        wake_fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.write(wake_fd, REQUEST.pack(asked.request))
        finally:
            os.close(wake_fd)
    except (OSError, ValueError) as exc:   # ended, or its pipe is full: a where-thread long stuck
        asked.note = f"could not be asked where it is ({exc})"
        return False
    return True


def read_answer(asked: Asked) -> str | None:
    """The process's latest answer if it answers this request (its first line lists the ids)."""
    for _ in range(100):
        generation, length = ANSWER_HEAD.unpack(os.pread(asked.fd, ANSWER_HEAD.size, 0))[:2]
        if generation % 2 or not length:
            if not generation % 2:
                return None   # it never answered yet
            time.sleep(0.0005)
            continue
        body = os.pread(asked.fd, length, ANSWER_TEXT)
        if ANSWER_HEAD.unpack(os.pread(asked.fd, ANSWER_HEAD.size, 0))[0] != generation:
            continue
        head, _, text = body.decode("utf-8", "replace").partition("\n")
        if not head.startswith(ANSWER_LINE) or str(asked.request) not in head[len(ANSWER_LINE):].split():
            return None
        return text
    return None


def _wait_for_answers(pending: list[Asked], deadline: float) -> None:
    pause = 0.0005
    waiting = list(pending)
    while waiting:
        for asked in list(waiting):
            try:
                text = read_answer(asked)
            except OSError as exc:
                asked.note = f"ended while it was asked ({exc})"
                text = None
            if text is not None or asked.note:
                waiting.remove(asked)
                if text is not None:
                    asked.text, asked.how = text, BY_THREAD
        if not waiting or time.monotonic() >= deadline:
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


def lock_held(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]], thread: int) -> bool:
    """Whether a process's interpreter lock is held (by C code that keeps it): over the window
    between the two samples, its where-thread, woken by the request, kept waking (a thread
    waiting for the lock wakes every switch interval to ask for it; in a stopped process it
    does not) without running, at most one other thread ran (with the lock changing hands,
    the threads that take it run: two or more of them), and no thread started or ended (a
    Python thread takes the lock to start and to end: in a storm of short threads each runs
    under ``BUSY_NS`` and is gone by the second sample, and a storm on a loaded machine was
    once taken for a held lock and signalled)."""
    if thread not in before or thread not in after or set(before) != set(after):
        return False
    woke = after[thread][1] - before[thread][1] >= 2
    ran = after[thread][0] - before[thread][0] >= BUSY_NS
    busy = [tid for tid, (ns, _) in after.items()
            if tid != thread and ns - before.get(tid, (ns, 0))[0] >= BUSY_NS]
    return woke and not ran and len(busy) <= 1


def _held(pending: list[Asked]) -> dict[int, bool]:
    """Pid -> whether its interpreter lock is held (``lock_held``), watched over HELD_WINDOW
    (answers that come meanwhile are taken)."""
    before = {asked.pid: task_times(asked.pid) for asked in pending}
    _wait_for_answers(pending, time.monotonic() + HELD_WINDOW)
    return {asked.pid: not asked.text and lock_held(before[asked.pid], task_times(asked.pid), asked.thread)
            for asked in pending}


def _signal(asked: Asked) -> None:
    """The fallback: faulthandler's dump, by ``DUMP_SIGNAL`` to the where-thread alone."""
    if asked.stacks is None:
        asked.note = "did not answer (its interpreter lock is held) and has no stacks file to dump to"
        return
    try:
        asked.offset = os.stat(asked.stacks).st_size
        tgkill(asked.pid, asked.thread, asked.signum)
    except OSError as exc:
        asked.note = f"did not answer (its interpreter lock is held) and could not be signalled ({exc})"
        return
    asked.how = BY_SIGNAL


def tgkill(pid: int, tid: int, signum: int) -> None:
    """Send ``signum`` to thread ``tid`` of process ``pid`` only (the signal's handler runs on it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    send = getattr(libc, "tgkill", None)
    if send is not None:
        result = send(pid, tid, signum)
    elif platform.machine() in _TGKILL:
        result = libc.syscall(_TGKILL[platform.machine()], pid, tid, signum)
    else:
        raise OSError(f"this machine ({platform.machine()}) has no tgkill")
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _wait_for_dumps(signalled: list[Asked], deadline: float) -> None:
    sizes = {id(asked): -1 for asked in signalled}
    waiting = list(signalled)
    while waiting and time.monotonic() < deadline:
        time.sleep(SETTLE)
        for asked in list(waiting):
            assert asked.stacks is not None
            try:
                size = os.stat(asked.stacks).st_size
            except OSError as exc:
                asked.note, asked.how = f"ended while it was asked ({exc})", ""
                waiting.remove(asked)
                continue
            if size > asked.offset and size == sizes[id(asked)]:   # grew, then stopped growing: whole
                waiting.remove(asked)
                with open(asked.stacks, "rb") as f:
                    f.seek(asked.offset)
                    asked.text = f.read(size - asked.offset).decode("utf-8", "replace")
            sizes[id(asked)] = size
    for asked in waiting:
        asked.note, asked.how = "did not answer (its interpreter lock is held) nor dump its stack on the signal", ""

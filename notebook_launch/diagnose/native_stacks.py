"""What a hung rank's own Python stack cannot show (issue 20): the native (C/C++) frames under
it, from ``py-spy`` when it is installed, and the stacks of the processes the rank forked (a
DataLoader worker) that are stuck themselves. ``beyond_python`` gives both, as lines for the
rank's detail. Optional: without py-spy, only the children's stacks.

faulthandler (``rank.reports.whereabouts``) shows where a rank's Python code is, but a rank blocked in
a gloo or NCCL wait, a lock or a C extension shows only the Python line that called into C.
``py-spy dump --native --pid N`` reads the process from outside (ptrace: the notebook is the
rank's parent, so Yama's default scope 1 allows it) and unwinds the C++ frames too:
``gloo::transport::tcp::UnboundBuffer::waitRecv`` under ``all_reduce`` says a rank waits for a
peer, ``pthread_cond_wait`` under a DataLoader's ``_get_data`` says it waits for a worker.

It costs about 0.1-0.5 s of CPU and 1-3 s of wall time per process (py-spy loads the
symbols of libtorch), so it runs only when a hang is diagnosed, for every rank at once, with a
time limit; a py-spy that is missing, not permitted (ptrace refused) or too slow gives nothing.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..errors.best_effort import best_effort
from ..wire.fork_locks import no_fork_during_exec
from ..channels.where_request import ANSWERS_NAME
from ..rank.reports.whereabouts import DUMP_SIGNAL, STACKS_NAME
from . import hang_verdict, where_thread
from .memfds import rank_files
from .proc_tasks import children

NATIVE_WAIT = 8.0         # seconds for every rank's py-spy together
FRAME_WIDTH = 120         # a C++ frame's name is cut to this many characters (templates run to pages)
FRAMES_SHOWN = 12         # the innermost native frames kept per thread
log = logging.getLogger("notebook_launch")

_THREAD = re.compile(r'^Thread (0x[0-9a-fA-F]+|\d+) \(([^)]*)\)(?:: "(.*)")?')
_PYTHON_FRAME = re.compile(r"\((?:[^()]*):(\d+)\)\s*$")   # "name (file.py:12)": a Python frame
_TEMPLATE = re.compile(r"<[^<>]*>")
NOISE = ("pybind11::", "0x")   # the binding glue and unnamed addresses: nothing a reader can act on


@dataclass
class NativeThread:
    """One thread as py-spy saw it: its OS thread id, name and frames (innermost first);
    ``python`` marks the frames that are Python's."""
    tid: int
    name: str
    frames: list[str]
    python: list[bool]

    def native_above_python(self) -> list[str]:
        """The native frames inside the innermost Python frame: what the Python stack cannot show."""
        kept = []
        for frame, is_python in zip(self.frames, self.python):
            if is_python:
                break
            if not frame.startswith(NOISE):
                kept.append(frame)
        return kept


def py_spy() -> str | None:
    """The py-spy executable: next to this Python (a venv a kernel runs from is often not on
    PATH), else on PATH; None when it is not installed."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def short_frame(text: str) -> str:
    """A C++ frame without its template arguments (``<>``), cut to ``FRAME_WIDTH`` characters."""
    text = text.strip()
    for _ in range(20):   # nested templates, innermost first: marked without brackets, so the next round sees the outer
        shorter = _TEMPLATE.sub("\x00", text)
        if shorter == text:
            break
        text = shorter
    text = text.replace("\x00", "<>")
    return text if len(text) <= FRAME_WIDTH else text[:FRAME_WIDTH - 3] + "..."


def parse(dump: str) -> list[NativeThread]:
    """``py-spy dump --native`` text -> one NativeThread per thread."""
    threads: list[NativeThread] = []
    for line in dump.splitlines():
        head = _THREAD.match(line)
        if head:
            ident = head.group(1)
            threads.append(NativeThread(int(ident, 16) if ident.startswith("0x") else int(ident),
                                        head.group(3) or "", [], []))
            continue
        if threads and line.startswith("    ") and line.strip():
            threads[-1].frames.append(short_frame(line))
            threads[-1].python.append(bool(_PYTHON_FRAME.search(line)))
    return threads


def main_thread_text(dump: str, pid: int) -> str:
    """The rank's main thread's native frames inside its innermost Python frame, one per line
    (innermost last, as the Python stacks read), or "" when there are none."""
    for thread in parse(dump):
        if thread.tid == pid or thread.name == "MainThread":
            frames = thread.native_above_python()[:FRAMES_SHOWN]
            return "\n".join(reversed(frames))
    return ""


def dump_all(pids: Mapping[int, int], wait: float = NATIVE_WAIT) -> dict[int, str]:
    """``py-spy dump --native`` of every process in ``pids`` (rank -> pid) at once; rank -> its
    text. Ranks py-spy could not read (not installed, ptrace refused, too slow) are left out."""
    executable = py_spy()
    if executable is None or not pids:
        return {}
    running: dict[int, subprocess.Popen[str]] = {}
    for rank, pid in pids.items():
        try:
            with no_fork_during_exec:   # a rank forked meanwhile would hold Popen's error pipe (fork_locks)
                running[rank] = subprocess.Popen([executable, "dump", "--native", "--pid", str(pid)],
                                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                                 start_new_session=True)   # a notebook's Ctrl-C is not py-spy's
        except OSError:
            log.debug("py-spy could not be started", exc_info=True)
            return {}
    found: dict[int, str] = {}
    deadline = time.monotonic() + wait
    for rank, proc in running.items():
        try:
            out, _ = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            _resume(pids[rank])
            log.debug("py-spy did not read rank %d's process within %g s", rank, wait)
            continue
        if proc.returncode == 0 and out:
            found[rank] = out
        else:
            log.debug("py-spy could not read rank %d's process (exit %s)", rank, proc.returncode)
    return found


def _resume(pid: int) -> None:
    """A py-spy killed while it held the process paused leaves it detached but maybe stopped:
    SIGCONT is harmless to a running process and wakes a stopped one."""
    try:
        os.kill(pid, signal.SIGCONT)
    except OSError:
        pass


def native_frames(pids: Mapping[int, int], wait: float = NATIVE_WAIT) -> dict[int, str]:
    """Rank -> its main thread's native frames inside its innermost Python frame (see
    ``main_thread_text``); only ranks py-spy could read and that have such frames."""
    texts = {}
    for rank, dump in dump_all(pids, wait).items():
        text = main_thread_text(dump, pids[rank])
        if text:
            texts[rank] = text
    return texts


# --- the rank's own children (a DataLoader worker) -------------------------------------------
CHILD_WAIT = 1.0          # seconds for the children's answers
CHILDREN_SHOWN = 4        # a rank with many workers: the first few are enough to see the pattern
DATALOADER_WORKER = ("torch/utils/data/_utils/worker.py", "_worker_loop")


def child_stacks(pid: int, wait: float = CHILD_WAIT) -> list[tuple[int, list[hang_verdict.ThreadStack]]]:
    """(child pid, its threads) for each forked child of ``pid`` that answers where it is the way
    the rank does: a process a rank forks without exec (a DataLoader worker) gets its own
    where-thread and record (``rank.reports.whereabouts``), asked through ``where_thread`` like a rank, all
    at once. A child that cannot answer (an exec'd one has no record) is left out."""
    asking = []
    for child in children(pid)[:CHILDREN_SHOWN]:
        files = rank_files(child)   # its stacks and answers only where the record is its own
        if STACKS_NAME in files:
            asking.append(where_thread.Asked(child, files.get(ANSWERS_NAME), files[STACKS_NAME], DUMP_SIGNAL))
    where_thread.ask_all(asking, wait)
    found: list[tuple[int, list[hang_verdict.ThreadStack]]] = []
    for asked in asking:
        threads = where_thread.threads(asked)
        if threads:
            found.append((asked.pid, threads))
    return found


def is_dataloader_worker(threads: Sequence[hang_verdict.ThreadStack]) -> bool:
    return any(frame.filename.endswith(DATALOADER_WORKER[0]) and frame.function == DATALOADER_WORKER[1]
               for thread in threads for frame in thread.frames)


FORK_ENTRY = ("multiprocessing/process.py", "_bootstrap")   # where a forked child's own stack begins


def own_frames(frames: Sequence[hang_verdict.Frame]) -> list[hang_verdict.Frame]:
    """A forked child's frames without those it inherited from the rank (the rank's stack at the
    moment it forked, under multiprocessing's ``_bootstrap``): innermost first."""
    for index, frame in enumerate(frames):
        if frame.filename.endswith(FORK_ENTRY[0]) and frame.function == FORK_ENTRY[1]:
            return list(frames[:index + 1])
    return list(frames)


def child_lines(child: int, threads: Sequence[hang_verdict.ThreadStack], label: hang_verdict.Labeller,
                frames_shown: int = 6) -> list[str]:
    """'its DataLoader worker, process 123, is in __getitem__() at x.py:40 (with lock:)' (the
    innermost line of the user's code it runs), or '... waits for work in get() at queues.py:113'
    (it runs none), then its innermost frames (most recent call last)."""
    what = "its DataLoader worker" if is_dataloader_worker(threads) else "its child"
    main = next((t for t in threads if t.current), threads[0])
    frames = [frame for frame in own_frames(main.frames) if not hang_verdict.is_ours(frame.filename)]
    users = [frame for frame in frames if not hang_verdict._is_library(frame.filename)]
    if users:
        place = f"is in {users[0].function}() at {hang_verdict.place(users[0], label, with_source=True)}"
    elif frames:
        place = f"runs none of your code: it is in {frames[0].function}() at {hang_verdict.place(frames[0], label)}"
    else:
        place = "is somewhere its stack did not show"
    lines = [f"{what}, process {child}, {place}:"]
    for frame in reversed(frames[:frames_shown]):
        lines.append(f"  {frame.function}() at {hang_verdict.place(frame, label)}")
    return lines


# --- what the detail gets -----------------------------------------------------------------------
def beyond_python(ranks: Sequence[tuple[int, int | None]], label: hang_verdict.Labeller,
                  native: bool = True) -> dict[int, list[str]]:
    """Rank -> lines for its detail (indented by the caller): its forked children's stacks, then
    (``native`` and py-spy installed) its main thread's native frames inside its innermost Python
    frame. ``ranks``: (global rank, pid or None), as ``stacks.collect`` takes them. Never raises:
    a diagnosis must not stand in the way of the stop."""
    more: dict[int, list[str]] = {}
    pids = {rank: pid for rank, pid in ranks if pid is not None}
    if native:
        try:
            frames = native_frames(pids)
        except Exception:   # why: native frames are an extra: the Python stacks stand alone
            log.debug("py-spy failed", exc_info=True)
            frames = {}
        for rank, text in frames.items():
            more.setdefault(rank, []).append("native frames of its main thread (py-spy, most recent call last):")
            more[rank].extend(f"  {line}" for line in text.splitlines())
    for rank, pid in pids.items():
        with best_effort("rank %d's children could not be asked for their stacks", rank):
            for child, threads in child_stacks(pid):
                more.setdefault(rank, []).extend(child_lines(child, threads, label))
    return more

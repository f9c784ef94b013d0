"""Rank -> parent events over a pipe: length-prefixed pickled frames, their kinds and payloads.

The one frame going the other way, INPUT_REPLY (the answer to a rank's INPUT_REQUEST,
a prompt), uses the same framing on the rank's answers pipe (``RankPipes.answers_*``).

One pipe per rank keeps the parent's reader simple (no interleaving between
ranks) and lets the parent notice a dead rank as end-of-file. Inside a rank,
``current()`` returns the writer, or None when the code runs outside a launch;
the in-rank APIs (``progress``, results, errors) go through it.

Adding an event kind is one line in ``EventKind`` (plus its payload type
here, and its folding in ``supervise.supervisor``).

This module also holds the one failure vocabulary: ``error_payload`` is the
only builder of an ERROR payload, ``Failure`` the only failure record (the
supervisor's, and the one nodes post to each other in an elastic run).
"""
from __future__ import annotations

import enum
import errno
import fcntl
import os
import pickle
import resource
import struct
import threading
import traceback as traceback_module
import types
import weakref
from dataclasses import asdict, dataclass
from typing import Any, TypedDict

from .fork_locks import ForkRenewedLock
from .memory_errors import out_of_memory_type

# A frame's length: 64 bits, so no payload is too big for its header (a result's big parts
# travel in its result file, but where there is none, a frame holds all of it).
_HEADER = struct.Struct("!Q")


class EventKind(str, enum.Enum):
    """What a rank tells the parent. A str, so a frame carries its plain value."""
    READY = "ready"          # ReadyPayload
    PROGRESS = "progress"    # ProgressPayload (see rank.reports.progress)
    RESULT = "result"        # bytes: the value, serialized by rank.runner (tensor bytes in the rank's result file)
    ERROR = "error"          # ErrorPayload
    DISPLAY = "display"      # DisplayPayload: an IPython display call (rank.integrations.display_relay)
    INPUT_REQUEST = "input_request"   # InputRequestPayload: the rank waits for an INPUT_REPLY
    INPUT_REPLY = "input_reply"       # InputReplyPayload, parent -> rank on the same socket
    # a rank on another machine's own CPU and memory (rank.reports.resources): resources.usage_record
    RESOURCES = "resources"


# Module-level names for the kinds, as the rank-side code uses them.
READY, PROGRESS, RESULT, ERROR = EventKind.READY, EventKind.PROGRESS, EventKind.RESULT, EventKind.ERROR


class ReadyPayload(TypedDict):
    pid: int
    device: str


class ProgressPayload(TypedDict, total=False):
    bars: dict[str, dict[str, Any]]    # bar id -> changed fields
    metrics: dict[str, Any]            # latest value of each metric logged since the last event
    series: dict[str, list[int | float]]   # every numeric value logged since then, in order (curves)


class DisplayPayload(TypedDict, total=False):
    op: str                     # "display" (also an update) or "clear"
    data: dict[str, Any]        # the mime bundle, as IPython formatted it
    metadata: dict[str, Any]
    display_id: str | None      # the rank's own display id
    update: bool                # update_display / DisplayHandle.update
    wait: bool                  # clear_output(wait=...)


class InputRequestPayload(TypedDict):
    prompt: str
    password: bool
    caller: str        # "input()", "getpass()", "sys.stdin": named in the error where nobody can answer


class InputReplyPayload(TypedDict, total=False):
    line: str          # what was typed, without the newline
    eof: str           # the user ended input (Ctrl-D): EOFError in the rank
    unavailable: str   # nobody can answer: the whole message of the rank's StdinUnavailableError


class _ErrorPayloadKeys(TypedDict):
    kind: str          # FailureKind value
    type: str          # exception type name
    message: str
    traceback: str


class ErrorPayload(_ErrorPayloadKeys, total=False):
    resident: int      # bytes the process held when it made the payload (an exception's), where readable
    peak: int          # the process's own peak resident bytes so far, its children's not counted
    out_of_memory: str   # the exception's class when it is an allocation failure (``memory_errors``)


class FailureKind(str, enum.Enum):
    """How a rank (or the run) failed; ``LaunchError.kind`` carries the value."""
    EXCEPTION = "exception"
    SIGNAL = "signal"
    EXIT = "exit"
    RESULT = "result"
    TIMEOUT = "timeout"
    STOPPED = "stopped"
    INTERRUPTED = "interrupted"
    RENDEZVOUS = "rendezvous"

    # str() and format() give the value, as enum.StrEnum does: a kind in a message reads "exit"
    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        return format(str(self.value), format_spec)


def error_payload(exc: BaseException | None = None, *, kind: str = FailureKind.EXCEPTION,
                  exc_type: str | None = None, message: str | None = None,
                  traceback: str | None = None, skip_frames: int = 0) -> ErrorPayload:
    """The ERROR payload for ``exc`` (or for a failure described by ``exc_type``/``message``).

    ``skip_frames`` drops our own frames from the top of the traceback, so it
    starts at the user's code; frames that set ``__tracebackhide__`` (as IPython and pytest
    read it: a decorator of ours around the user's function) are left out too."""
    if traceback is None:
        traceback = ""
        if exc is not None:
            tb = exc.__traceback__
            for _ in range(skip_frames):
                if tb is not None and tb.tb_next is not None:
                    tb = tb.tb_next
            traceback = "".join(traceback_module.format_exception(type(exc), exc, without_hidden_frames(tb)))
    payload: ErrorPayload = {
        "kind": str(FailureKind(kind).value),
        "type": exc_type or (type(exc).__qualname__ if exc is not None else "RuntimeError"),
        "message": safe_str(exc) if message is None and exc is not None else (message or ""),
        "traceback": traceback,
    }
    held = _own_resident() if exc is not None else None
    if held is not None:
        payload["resident"] = held
    if exc is not None:
        payload["peak"] = _own_peak()
        out_of_memory = out_of_memory_type(exc)
        if out_of_memory is not None:
            payload["out_of_memory"] = out_of_memory
    return payload


def _own_peak() -> int:
    """This process's own peak resident bytes: what the notebook shows as the rank's peak once it
    ended. The kernel's count at the rank's end (``wait4``) is the largest of the rank's and of
    every child it reaped (a DataLoader worker the OOM killer took), so a rank that reports this
    is not shown holding what its worker held."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # KiB on Linux


def without_hidden_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without the frames whose locals set ``__tracebackhide__`` (a new chain: the
    exception's own traceback is left as it is)."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_locals.get("__tracebackhide__"):
            kept.append(tb)
        tb = tb.tb_next
    chain: types.TracebackType | None = None
    for entry in reversed(kept):
        chain = types.TracebackType(chain, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return chain


def _own_resident() -> int | None:
    """This process's resident bytes now (one read of statm): what an allocation failure's
    message says the rank held when it raised, also when the rank has ended before the notebook
    reads its error (a quick rank on a loaded machine: it was never sampled)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def safe_str(exc: BaseException) -> str:
    """``str(exc)``, or a note when the exception's own ``__str__`` raises: it is still
    reported as the exception it is, never as a rank that died without one."""
    try:
        return str(exc)
    except Exception as inner:   # why: the exception is still reported as itself, with this note for its text
        try:
            return f"<str() failed: {type(inner).__qualname__}: {inner}>"
        except Exception:   # why: the exception is still reported as itself, with this note for its text
            return "<str() failed>"


def headline_of(exc_type: str, message: str | None) -> str:
    """"ValueError: boom", or the type alone when the message is empty."""
    return f"{exc_type}: {message}" if message else exc_type


@dataclass
class Failure:
    """One failure: a rank's (``local_rank`` set) or the run's (timeout, interrupt: None).

    ``node``, ``rank``, ``attempt``, ``restartable`` and ``secondary`` are filled
    on the elastic path, where nodes post the record to each other."""
    local_rank: int | None
    kind: str               # FailureKind value
    headline: str           # "ValueError: boom", "killed by the kernel's out-of-memory killer (SIGKILL)"
    traceback: str = ""
    exc_type: str | None = None
    exc_message: str | None = None
    node: int | None = None
    rank: int | None = None         # global rank
    attempt: int = 0
    restartable: bool = True
    secondary: bool = False
    detail: str = ""                # where every rank was (a timeout: diagnose.hang_verdict.detail)
    memory: str = ""                # what ran out of memory, what held it, what to do (supervise.oom)

    @classmethod
    def from_payload(cls, local_rank: int | None, payload: ErrorPayload) -> "Failure":
        return cls(local_rank, payload.get("kind", FailureKind.EXCEPTION),
                   headline_of(payload["type"], payload["message"]),
                   payload.get("traceback", ""), payload["type"], payload["message"])

    def to_record(self) -> dict[str, Any]:
        """A JSON-able dict (what the node board stores)."""
        record = asdict(self)
        record.pop("local_rank")
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "Failure":
        return cls(local_rank=None, kind=record.get("kind", FailureKind.EXCEPTION),
                   headline=record.get("headline", ""), traceback=record.get("traceback") or "",
                   exc_type=record.get("exc_type"), exc_message=record.get("exc_message"),
                   node=record.get("node"), rank=record.get("rank"), attempt=record.get("attempt") or 0,
                   restartable=record.get("restartable", True), secondary=bool(record.get("secondary")),
                   detail=record.get("detail") or "", memory=record.get("memory") or "")

    def same_as(self, other: "Failure") -> bool:
        return (self.node, self.rank, self.headline, self.attempt) == \
            (other.node, other.rank, other.headline, other.attempt)


_writer: "EventWriter | None" = None
# XLA runs several ranks as threads of one process (one per device); each such
# thread installs its own writer here, so its events carry its own rank.
_thread_writer = threading.local()


class EventWriter:
    """Writes events to the parent. Thread-safe, so tqdm threads and user threads may share it.

    The user's function may close our fd (``os.closerange(3, ...)``, a daemonizing library)
    and the number may then be another file's: every send checks the fd is still our pipe
    (same device and inode), and otherwise reopens the pipe through the parent's read end
    (``reopen``, /proc/<parent pid>/fd/<n>: Linux opens the same pipe), so a result or an
    exception still arrives and is never written into the user's file.

    A process the rank forks (a DataLoader worker) inherits the writer and may send on the same
    pipe (its metrics, its display() calls). A write of more than PIPE_BUF bytes to a pipe is not
    atomic: once the pipe is full it goes in pieces, and another process's frame could land
    between them. So every frame is written under ``_take_frame_lock``: an exclusive ``flock`` on a
    description of the pipe that the writing process opened itself (a forked child shares its
    parent's descriptions, and with them their locks, so it opens its own). Why the rank's own
    small frames take it too: they are atomic, but one could land inside a child's large frame
    while the child waits for room. Its cost is two system calls per frame (a few microseconds,
    at most ~10 progress frames a second; ``benchmarks/progress_cost.py``), none per step.

    The lock's description is a write end of the pipe, held while the process lives: a writer
    whose pipe must reach end-of-file while its process goes on (the notebook's INPUT_REPLY
    writer, the one writer of its pipe) passes ``lock_frames=False``.

    ``answers_fd``: where the notebook's INPUT_REPLY frames arrive (rank.stdin_relay).
    ``tensors_fd``: the rank's result file (``shared_tensors``), where the RESULT's
    tensor bytes go; None: they travel inside the RESULT frame."""

    def __init__(self, fd: int, reopen: str | None = None, answers_fd: int | None = None,
                 tensors_fd: int | None = None, lock_frames: bool = True) -> None:
        self.fd = fd
        self.answers_fd = answers_fd
        self.tensors_fd = tensors_fd
        self._tensors_file = None if tensors_fd is None else _identity(tensors_fd)
        self._pipe = _identity(fd)
        self._reopen = reopen
        self._lock = ForkRenewedLock()   # a DataLoader worker sends progress through the rank's writer
        self.pid = os.getpid()   # the rank's own process; another one is a process the rank forked
        self._frame_lock: tuple[int, int] | None = None   # (the process that opened it, its fd)
        self._lock_frames = lock_frames

    def send(self, kind: EventKind, payload: Any) -> None:
        data = pickle.dumps((EventKind(kind).value, payload), protocol=pickle.HIGHEST_PROTOCOL)
        frame = _HEADER.pack(len(data)) + data
        with self._lock:
            self._ensure_our_pipe()
            locked = self._take_frame_lock()
            try:
                view = memoryview(frame)
                while view:
                    written = os.write(self.fd, view)
                    view = view[written:]
            finally:
                if locked is not None:
                    fcntl.flock(locked, fcntl.LOCK_UN)

    def _take_frame_lock(self) -> int | None:
        """Lock the pipe against the other processes writing frames on it (see the class); the
        locked fd, or None where no description of the pipe can be had (no /proc): unlocked."""
        if not self._lock_frames:
            return None
        held = self._frame_lock
        pid = os.getpid()
        if held is not None and held[0] == pid and held[1] < 0:   # none to be had here (a socket)
            return None
        # Our fd may have been closed by the user's code and its number reused: never lock their file.
        if held is None or held[0] != pid or _identity(held[1]) != self._pipe:
            held = self._frame_lock = self._open_frame_lock()
            if held[1] < 0:
                return None
        try:
            fcntl.flock(held[1], fcntl.LOCK_EX)
        except OSError:   # no lock to be had: the frame still goes, as it did before locks
            return None
        return held[1]

    def _open_frame_lock(self) -> tuple[int, int]:
        """(this process, a description of the pipe it opened), or fd -1 where there is none to be
        had (no /proc; a socket, which cannot be opened again): its frames then go unlocked."""
        fd = -1
        if self._pipe is not None:
            try:   # O_NONBLOCK: opening a pipe's write end must not wait for a reader
                fd = os.open(f"/proc/self/fd/{self.fd}", os.O_WRONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            except OSError:
                fd = -1
        if fd >= 0:
            _forget_frame_locks_after_fork(self)
        return os.getpid(), fd

    def result_file(self) -> int | None:
        """``tensors_fd`` while it is still the rank's result file; None once the function closed
        it (the number may be another file's by now): the tensors then travel in the frame."""
        if self.tensors_fd is None or _identity(self.tensors_fd) != self._tensors_file:
            return None
        return self.tensors_fd

    def _ensure_our_pipe(self) -> None:
        if self._pipe is None or _identity(self.fd) == self._pipe:
            return
        if self._reopen is None:
            raise OSError(errno.EBADF, f"the event pipe to the notebook (fd {self.fd}) was closed in this rank")
        # O_NONBLOCK: opening a pipe's write end waits for a reader; the parent may be gone
        fd = os.open(self._reopen, os.O_WRONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        if _identity(fd) != self._pipe:
            os.close(fd)
            raise OSError(errno.EBADF, f"{self._reopen} is not this rank's event pipe any more")
        os.set_blocking(fd, True)
        self.fd = fd


_locking_writers: "weakref.WeakSet[EventWriter]" = weakref.WeakSet()
_fork_hook_registered = False


def _forget_frame_locks_after_fork(writer: EventWriter) -> None:
    """A forked child closes the frame-lock descriptions it inherited, at once, before any of its
    code runs: held open there, one the parent locked when it was killed would stay locked."""
    global _fork_hook_registered
    _locking_writers.add(writer)
    if not _fork_hook_registered:
        _fork_hook_registered = True
        os.register_at_fork(after_in_child=_close_inherited_frame_locks)


def _close_inherited_frame_locks() -> None:
    for writer in list(_locking_writers):
        held, writer._frame_lock = writer._frame_lock, None
        # still our description (the user's code may have closed it and reused the number)
        if held is not None and held[1] >= 0 and _identity(held[1]) == writer._pipe:
            try:
                os.close(held[1])
            except OSError:
                pass


def parent_end(parent_pid: int, fd: int) -> str:
    """Where a rank can reopen its event pipe: the parent's read end, seen through /proc."""
    return f"/proc/{parent_pid}/fd/{fd}"


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class EventReader:
    """Decodes frames from the bytes the parent reads off one rank's pipe."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[EventKind, Any]]:
        """Add bytes; return the list of complete (kind, payload) events."""
        self._buffer += data
        events = []
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            end = _HEADER.size + size
            if len(self._buffer) < end:
                break
            with memoryview(self._buffer) as view:   # no copy of a big frame before unpickling it
                kind, payload = pickle.loads(view[_HEADER.size:end])
            events.append((EventKind(kind), payload))
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

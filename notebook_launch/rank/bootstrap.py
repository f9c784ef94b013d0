"""The start and the end of every rank process, whichever backend started it (fork, spawn, xla).

Detach from the notebook (own process group, death with the parent, default
signal handlers), point fds 1/2 and sys.stdout/err at the rank's pipes, and
end the process with its exit code without ever returning into the parent's code.
"""
from __future__ import annotations

import _signal
import ctypes
import faulthandler
import io
import logging
import os
import signal
import sys
import traceback
from typing import Any, Callable

from ..errors.best_effort import best_effort
from .inherited_streams import redirect_inherited_streams

PR_SET_PDEATHSIG = 1
EXIT_FAILED = 1
log = logging.getLogger("notebook_launch")


def _load_libc() -> ctypes.CDLL | None:
    """The process's C library, loaded once in the parent: a forked rank then finds it ready
    (loading it in every rank cost about 0.3 ms of each rank's start)."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc() if sys.platform.startswith("linux") else None


def _bound(name: str) -> Any:
    """The C library's function ``name``, its function object made once in the parent: a forked
    rank then calls it as it finds it. Looked up in each rank (``CDLL.__getattr__`` builds a
    function pointer object and caches it on the CDLL), ``prctl`` and ``fflush`` cost about
    0.15 ms each of every rank's CPU, most of it the notebook's pages that the look-up wrote to,
    copied after the fork (issue 45)."""
    try:
        return None if _LIBC is None else getattr(_LIBC, name)
    except AttributeError:
        return None


_PRCTL = _bound("prctl")
_FFLUSH = _bound("fflush")
_SIGKILL = int(signal.SIGKILL)


def exit_with(body: Callable[[], int]) -> None:
    """Run ``body()`` as a rank process's whole life, then end the process with its
    exit code. Never returns: the child must never fall back into the parent's code."""
    code = EXIT_FAILED
    try:
        code = body()
    except BaseException:   # why: report anything, then exit with a failure code
        try:
            traceback.print_exc()
        except BaseException:  # noqa: S110  # why: stderr itself is broken: nowhere left to say it
            pass
    finally:
        flush_everything()
        os._exit(code)


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when ``parent_pid`` ends (Linux); exit now if it already has."""
    if not sys.platform.startswith("linux"):
        return
    try:
        if _PRCTL is None:
            raise OSError("no C library with prctl")
        _PRCTL(PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
    except OSError:
        log.debug("prctl(PR_SET_PDEATHSIG) unavailable; the rank may outlive a killed parent")
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(EXIT_FAILED)


Dispositions = tuple[tuple[int, Any], ...]   # (signal number, its handler) pairs


def detach_from_parent(parent_pid: int, signals: Dispositions | None = None) -> None:
    """Own process group (so teardown reaches what the rank starts, and a
    terminal's Ctrl-C goes through the parent), death with the parent, and
    the signal state of a fresh Python process instead of the notebook's
    (``signals``: those to set, from ``signals_to_reset`` in the parent; None: every one)."""
    os.setpgid(0, 0)
    die_with_parent(parent_pid)
    reset_signal_state(signals)


# What CPython itself sets at start-up (Python/pylifecycle.c, Modules/signalmodule.c): SIGPIPE
# and SIGXFSZ ignored, so a broken pipe or a file past RLIMIT_FSIZE raises an OSError instead
# of killing the process; SIGINT raises KeyboardInterrupt. Every other signal has its default.
_FRESH_PYTHON_IGNORES = ("SIGPIPE", "SIGXFZ", "SIGXFSZ")


def reset_signal_state(signals: Dispositions | None = None) -> None:
    """Make this process's signals those of a fresh ``python -c``, whatever the notebook (or
    the thread that launched) had: a fork copies every disposition, every Python-level
    handler and the forking thread's blocked mask; an exec keeps ignored signals and the mask.
    So: an empty blocked mask, every signal at its default, then CPython's own start-up choices
    (``_FRESH_PYTHON_IGNORES`` ignored, SIGINT -> KeyboardInterrupt), no wakeup fd, and
    faulthandler off (``capture_output`` turns it on again, writing to the rank's stderr).

    A notebook differs from a fresh process here in ways that matter: ipykernel ignores SIGINT
    between cells, a kernel or a library may set SIGPIPE to its default (a write to a closed
    pipe or socket then kills the rank with no traceback) or ignore SIGCHLD (subprocess then
    loses its children's exit codes), and asyncio's loop leaves a wakeup fd behind.

    ``signals``: the signals to set, with their fresh handlers (``signals_to_reset``, read in the
    parent just before its forks: those whose disposition or Python handler differs there); None:
    every one."""
    if hasattr(_signal, "pthread_sigmask"):
        _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
    if faulthandler.is_enabled():   # else a later enable() keeps the handlers it thinks it has
        faulthandler.disable()
    unregister = getattr(faulthandler, "unregister", None)
    for signum, handler in _FRESH_DISPOSITIONS if signals is None else signals:
        if unregister is not None:
            try:
                unregister(signum)   # a faulthandler.register() the notebook made
            except (ValueError, RuntimeError):
                pass   # not a signal faulthandler can register (SIGSEGV, ...): nothing to undo
        try:
            _signal.signal(signum, handler)
        except (OSError, ValueError):
            log.debug("could not reset signal %d in the rank", signum)
    try:
        _signal.set_wakeup_fd(-1)
    except (ValueError, OSError):
        log.debug("could not clear the inherited signal wakeup fd", exc_info=True)


def _resettable_signals() -> list[int]:
    """Every signal a process can handle (SIGKILL and SIGSTOP cannot; glibc keeps 32 and 33)."""
    valid = signal.valid_signals() if hasattr(signal, "valid_signals") else set(signal.Signals)
    return sorted(int(s) for s in valid if s not in (signal.SIGKILL, signal.SIGSTOP))


def _fresh_dispositions() -> tuple[tuple[int, Any], ...]:
    """(signal number, what a fresh ``python -c`` has for it) for every signal a process can handle.
    Built once, in the notebook at import: every rank forked from it inherits the table, and sets
    each through ``_signal`` with plain numbers. ``signal.signal`` converts the old handler it
    returns to an enum (a ValueError caught for every handler that is none), and ``valid_signals``
    each number: with the pages that touched copied after the fork, about 1 ms of every rank's CPU."""
    ignored = {getattr(signal, name) for name in _FRESH_PYTHON_IGNORES if hasattr(signal, name)}
    table = []
    for signum in _resettable_signals():
        if signum == signal.SIGINT:
            handler: Any = signal.default_int_handler
        elif signum in ignored:
            handler = _signal.SIG_IGN
        else:
            handler = _signal.SIG_DFL
        table.append((signum, handler))
    return tuple(table)


_FRESH_DISPOSITIONS = _fresh_dispositions()


_FLAGS_MATTER = frozenset({int(signal.SIGCHLD)})   # a default disposition whose flags change what it does


def signals_to_reset() -> Dispositions:
    """The entries of the fresh table that differ in this process now, for its forked ranks'
    ``reset_signal_state``: a signal whose disposition (ignored, caught, default: the kernel's
    ``SigIgn`` and ``SigCgt`` masks, which see a C library's handlers too) or Python handler is not
    the fresh one; SIGINT always, and SIGCHLD always: the masks do not show a disposition's flags,
    and SIGCHLD's default with SA_NOCLDWAIT (set from C) has the kernel reap the rank's children,
    so a subprocess's exit code would be lost (the only default whose meaning its flags change).
    Setting all 64 in each rank cost about 0.3 ms of its CPU, the pages each handler's bookkeeping
    wrote copied after the fork; a notebook differs in a few (issue 45). Every one where the masks
    cannot be read."""
    masks = _disposition_masks()
    if masks is None:
        return _FRESH_DISPOSITIONS
    ignored, caught = masks
    differ = []
    for signum, handler in _FRESH_DISPOSITIONS:
        bit = 1 << (signum - 1)
        if handler is _signal.SIG_IGN:
            kernel_fresh = bool(ignored & bit) and not caught & bit
        elif handler is _signal.SIG_DFL:
            kernel_fresh = not (ignored | caught) & bit
        else:   # SIGINT: Python's own handler, set as a fresh Python sets it
            kernel_fresh = False
        if not kernel_fresh or signum in _FLAGS_MATTER or _signal.getsignal(signum) != handler:
            differ.append((signum, handler))
    return tuple(differ)


def _disposition_masks() -> tuple[int, int] | None:
    """(ignored, caught) signal masks of this process (``/proc/self/status``), None where unread."""
    try:
        with io.FileIO("/proc/self/status") as file:
            text = file.readall().decode()
    except (OSError, ValueError):
        return None
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("SigIgn", "SigCgt"):
            try:
                found[key] = int(value.strip(), 16)
            except ValueError:
                return None
    return (found["SigIgn"], found["SigCgt"]) if len(found) == 2 else None


EncodedEnvironment = tuple[tuple[bytes, bytes], ...]


def encode_environment(env: dict[str, str]) -> EncodedEnvironment:
    """``env`` as ``os.environ`` keeps it (its keys and values encoded as the OS takes them),
    made in the notebook before the fork, for ``set_environment`` in the rank."""
    encoding = sys.getfilesystemencoding()   # as os.environ encodes on POSIX
    return tuple((name.encode(encoding, "surrogateescape"), value.encode(encoding, "surrogateescape"))
                 for name, value in env.items())


def set_environment(env: EncodedEnvironment) -> None:
    """Add ``env`` (from ``encode_environment``) to this process's environment: what
    ``os.environ.update`` does, for both the C library's environment (``putenv``, which every
    library and child process reads) and ``os.environ``'s own copy, less its per-variable work
    (the two encodings and their checks, a ``MutableMapping.update`` in Python): about 0.2 of its
    0.7 ms in each rank, most of it the notebook's pages it wrote to, copied after the fork."""
    data = getattr(os.environ, "_data", None)   # CPython's os._Environ keeps the encoded pairs there
    if not isinstance(data, dict):
        os.environ.update({os.fsdecode(name): os.fsdecode(value) for name, value in env})
        return
    putenv = os.putenv
    for name, value in env:
        putenv(name, value)
        data[name] = value


def redirect_fds(stdout_fd: int, stderr_fd: int) -> None:
    """Point fds 1 and 2 (C-level output) at the given fds."""
    flush_everything()
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)


def capture_output(stdout_fd: int, stderr_fd: int) -> None:
    """Point fds 1 and 2 (C-level output too) and sys.stdout/stderr at the rank's pipes."""
    redirect_fds(stdout_fd, stderr_fd)
    if stdout_fd not in (1, 2):
        os.close(stdout_fd)
    if stderr_fd not in (1, 2):
        os.close(stderr_fd)
    install_std_streams(text_stream(1), text_stream(2))
    # A segfault or abort then prints the Python stack into the rank's log and error.
    faulthandler.enable(file=sys.stderr, all_threads=True)


def install_std_streams(stdout: io.TextIOBase, stderr: io.TextIOBase) -> None:
    """Make ``stdout``/``stderr`` the rank's sys.stdout/stderr (and ``__stdout__``/``__stderr__``),
    and forward the streams they replace, which the notebook's logging handlers may hold."""
    previous_out, previous_err = (sys.stdout, sys.__stdout__), (sys.stderr, sys.__stderr__)
    sys.stdout = sys.__stdout__ = stdout  # type: ignore[misc,assignment]
    sys.stderr = sys.__stderr__ = stderr  # type: ignore[misc,assignment]
    redirect_inherited_streams(previous_out, previous_err, stdout, stderr)


def text_stream(fd: int) -> io.TextIOWrapper:
    """A line-buffered UTF-8 text stream on ``fd`` that never closes it."""
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8",
                            errors="backslashreplace", line_buffering=True, write_through=False)


def flush_everything() -> None:
    for stream in (sys.stdout, sys.stderr):
        with best_effort("flushing %r failed", stream):
            stream.flush()
    # C stdio buffers, which os._exit would drop; the C library loaded once (a CDLL made per call
    # builds a class each time: a tenth of a millisecond of every call on persistent ranks)
    with best_effort("fflush(NULL) failed"):
        (_FFLUSH if _FFLUSH is not None else ctypes.CDLL(None).fflush)(None)

"""A rank's signal state and standard streams are those of a fresh ``python -c`` (issue 23 item 9).

Whatever the notebook did to its own process (a signal set to its default or ignored, a
Python handler installed, a faulthandler.register, a wakeup fd left by an event loop) and
whatever the launching thread blocked with ``pthread_sigmask``, a rank starts as a fresh
Python process would: SIGPIPE and SIGXFSZ ignored (a broken pipe raises BrokenPipeError
instead of killing the rank), SIGINT -> KeyboardInterrupt, every other signal at its
default, nothing blocked. Compared signal by signal against a real fresh ``python -c``, for
fork, spawn and persistent ranks, launched from a thread with a blocked mask.

Our deliberate differences, allowed below and why:
- ``FAULTHANDLER_SIGNALS`` are caught (SigCgt) in every rank: faulthandler writes a crash's
  Python stack into the rank's log (rank.bootstrap.capture_output). Python sees SIG_DFL.
- ``DUMP_SIGNAL`` (a realtime signal, rank.reports.whereabouts) is caught in every rank: faulthandler dumps
  every thread's stack when the notebook asks where a hung rank is (issue 20), even while it is
  blocked in C. Python sees SIG_DFL; SIGUSR1/SIGUSR2 stay the user's.
- A persistent rank's SIGINT handler is its own (rank.serve): an interrupt raises
  KeyboardInterrupt only inside the call it was meant for, and the rank stays alive.
- Not signal state but also ours: the rank leads its own process group and dies with the
  notebook (PR_SET_PDEATHSIG), fds 1/2 are the rank's pipes, fd 0 reads /dev/null.
"""
from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from notebook_launch import notebook_launcher, start_ranks
from notebook_launch.engines.local import fork_thread
from notebook_launch.planning.net import free_port
from notebook_launch.rank.reports import whereabouts

FAULTHANDLER_SIGNALS = {signal.SIGSEGV, signal.SIGFPE, signal.SIGABRT, signal.SIGBUS, signal.SIGILL}
# Signals glibc keeps for itself (32, 33: thread cancellation, setxid across threads): caught once
# the process has had threads (a fork of a notebook always has), and out of any program's reach.
GLIBC_RESERVED_BITS = sum(1 << (s - 1) for s in range(1, 65) if s not in signal.valid_signals())

PROBE = r'''
def probe():
    import os, signal, sys
    status = {}
    with open("/proc/thread-self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("SigBlk", "SigIgn", "SigCgt"):
                status[key] = int(value.strip(), 16)
    handlers = {}
    for signum in sorted(signal.valid_signals()):
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        handler = signal.getsignal(signum)
        if handler is signal.SIG_DFL:
            name = "SIG_DFL"
        elif handler is signal.SIG_IGN:
            name = "SIG_IGN"
        elif handler is signal.default_int_handler:
            name = "default_int_handler"
        elif handler is None:
            name = "None (a handler not installed from Python)"
        else:
            name = "python:" + getattr(handler, "__qualname__", repr(handler))
        handlers[int(signum)] = name
    wakeup = signal.set_wakeup_fd(-1)
    if wakeup != -1:
        signal.set_wakeup_fd(wakeup)

    def kind(fd):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return "closed"
        return link.split(":")[0] if ":" in link else link

    streams = {"fd0": kind(0), "fd1": kind(1), "fd2": kind(2),
               "stdout_fd": sys.stdout.fileno(), "stderr_fd": sys.stderr.fileno()}
    # What matters to a user: a write to a pipe whose reader is gone raises, it does not kill.
    r, w = os.pipe()
    os.close(r)
    try:
        os.write(w, b"x")
        broken = "no error"
    except BrokenPipeError:
        broken = "BrokenPipeError"
    finally:
        os.close(w)
    return {"status": status, "handlers": handlers, "wakeup_fd": wakeup, "streams": streams,
            "broken_pipe": broken}
'''
_namespace: dict = {"__name__": "tests.rank_probe"}
exec(compile(PROBE, "<rank probe>", "exec"), _namespace)
probe = _namespace["probe"]
probe.__module__ = __name__   # pickled by reference: a spawned rank imports this module
probe.__qualname__ = "probe"


def _clean_start() -> None:
    """A fresh Python started from a clean shell: every signal default, nothing blocked."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for signum in signal.valid_signals():
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(signum, signal.SIG_DFL)
            except (OSError, ValueError):
                pass


@pytest.fixture(scope="module")
def fresh_python() -> dict:
    code = PROBE + "\nimport json\nprint(json.dumps(probe()))\n"
    out = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, check=True, preexec_fn=_clean_start)
    return json.loads(out.stdout)


@pytest.fixture
def odd_notebook():
    """The notebook's process in odd states, each a real one: SIGPIPE at its default (as some
    kernels and libraries leave it), SIGINT ignored (ipykernel between cells), SIGHUP ignored
    (nohup), Python handlers for SIGTERM/SIGUSR1/SIGCHLD, a faulthandler.register, a wakeup fd
    (asyncio's loop), and SIGWINCH ignored by C code behind Python's back (a library's own
    ``signal()``: Python's handler table still says default, the kernel's masks do not; a rank
    that reset only what Python's table shows would keep it). Everything is put back afterwards."""
    saved = {s: signal.getsignal(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)}

    def user_handler(signum, frame):
        pass

    a, b = socket.socketpair()
    a.setblocking(False)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, user_handler)
    signal.signal(signal.SIGUSR1, user_handler)
    signal.signal(signal.SIGCHLD, user_handler)
    assert sys.__stderr__ is not None   # the test process's own stderr
    faulthandler.register(signal.SIGUSR2, file=sys.__stderr__)
    old_wakeup = signal.set_wakeup_fd(a.fileno())
    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    old_winch = libc.signal(int(signal.SIGWINCH), 1)   # SIG_IGN, set in C
    try:
        assert signal.getsignal(signal.SIGWINCH) == signal.SIG_DFL   # Python does not see it
        yield
    finally:
        libc.signal(int(signal.SIGWINCH), old_winch)
        signal.set_wakeup_fd(old_wakeup)
        faulthandler.unregister(signal.SIGUSR2)
        for signum, handler in saved.items():
            if handler is not None:
                signal.signal(signum, handler)
        a.close()
        b.close()


BLOCKED = [signal.SIGTERM, signal.SIGUSR1, signal.SIGALRM, signal.SIGCHLD, signal.SIGPIPE]


def from_blocked_thread(body):
    """Run ``body`` in a new thread that blocked BLOCKED first; a fork helper thread made for
    it inherits that mask, as one made by a notebook's first launch from such a thread would."""
    outcome: dict = {}

    def run():
        signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)
        try:
            outcome["value"] = body()
        except BaseException as exc:   # handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def assert_fresh(rank_state: dict, fresh: dict, *, persistent: bool = False) -> None:
    handlers = {int(k): v for k, v in rank_state["handlers"].items()}
    expected = {int(k): v for k, v in fresh["handlers"].items()}
    if persistent:   # rank.serve's interrupt handler (see the module docstring)
        assert handlers[signal.SIGINT].startswith("python:"), handlers[signal.SIGINT]
        handlers[signal.SIGINT] = expected[signal.SIGINT]
    assert handlers == expected
    status, fresh_status = rank_state["status"], fresh["status"]
    assert status["SigBlk"] == fresh_status["SigBlk"] == 0
    assert status["SigIgn"] == fresh_status["SigIgn"]
    faulthandler_bits = sum(1 << (s - 1) for s in FAULTHANDLER_SIGNALS)
    dump_bit = 1 << (whereabouts.DUMP_SIGNAL - 1)
    ours = faulthandler_bits | GLIBC_RESERVED_BITS | dump_bit
    assert status["SigCgt"] & ~ours == fresh_status["SigCgt"] & ~ours
    assert status["SigCgt"] & faulthandler_bits == faulthandler_bits   # our crash reports
    assert status["SigCgt"] & dump_bit == dump_bit   # "where is this rank?" (rank.reports.whereabouts)
    assert rank_state["wakeup_fd"] == fresh["wakeup_fd"] == -1
    assert rank_state["broken_pipe"] == fresh["broken_pipe"] == "BrokenPipeError"
    assert rank_state["streams"] == fresh["streams"] == {
        "fd0": "/dev/null", "fd1": "pipe", "fd2": "pipe", "stdout_fd": 1, "stderr_fd": 2}


def test_the_reference_is_a_fresh_python(fresh_python):
    """The comparison has teeth: a fresh Python ignores SIGPIPE and SIGXFSZ and catches SIGINT."""
    ign = fresh_python["status"]["SigIgn"]
    assert ign == (1 << (signal.SIGPIPE - 1)) | (1 << (signal.SIGXFSZ - 1))
    assert fresh_python["handlers"][str(int(signal.SIGINT))] == "default_int_handler"


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_launched_ranks_start_as_a_fresh_python(start_method, fresh_python, odd_notebook, tmp_path, monkeypatch):
    monkeypatch.setattr(fork_thread, "_fork_thread", None)   # the first launch is from the blocked thread

    def launch():
        return notebook_launcher(probe, num_processes=2, start_method=start_method, use_port=str(free_port()),
                                 log_dir=str(tmp_path / "logs"), ui="text", timeout=240)

    results = from_blocked_thread(launch)
    assert len(results) == 2
    for state in results:
        assert_fresh(state, fresh_python)


def test_persistent_ranks_start_as_a_fresh_python(fresh_python, odd_notebook, tmp_path, monkeypatch):
    monkeypatch.setattr(fork_thread, "_fork_thread", None)

    def start_and_probe():
        with start_ranks(2, use_port=free_port(), log_dir=str(tmp_path / "logs"), ui="text", timeout=120) as ranks:
            return ranks.run(probe)

    results = from_blocked_thread(start_and_probe)
    assert len(results) == 2
    for state in results:
        assert_fresh(state, fresh_python, persistent=True)


def test_ranks_launched_from_a_real_kernel_start_as_a_fresh_python(fresh_python, tmp_path):
    """In a Jupyter kernel as it is (ipykernel's own SIGINT handling, its threads and event
    loop), a launch from the cell and one from a thread that blocked signals, fork and spawn,
    and persistent ranks: every rank's state is a fresh Python's."""
    from helpers.nbutil import make_notebook, run_notebook
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    out = tmp_path / "states.json"
    nb = make_notebook(textwrap.dedent(f'''
        import json, signal, sys, threading
        sys.path.insert(0, {tests_dir!r})
        from test_rank_inherited_state import probe
        from notebook_launch import notebook_launcher, start_ranks
        from notebook_launch.planning.net import free_port
        states = {{}}
        for method in ("fork", "spawn"):
            states[method] = notebook_launcher(probe, num_processes=1, start_method=method, ui="none",
                                               use_port=str(free_port()), timeout=240)

        def from_a_thread():
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGUSR1, signal.SIGPIPE])
            states["fork from a thread"] = notebook_launcher(probe, num_processes=1, ui="none",
                                                             use_port=str(free_port()), timeout=240)
        thread = threading.Thread(target=from_a_thread)
        thread.start()
        thread.join()
        with start_ranks(1, use_port=free_port(), ui="none", timeout=120) as ranks:
            states["persistent"] = ranks.run(probe)
        json.dump(states, open({str(out)!r}, "w"))
    '''))
    run_notebook(nb, cwd=str(tmp_path), timeout=600)
    states = json.loads(out.read_text())
    assert set(states) == {"fork", "spawn", "fork from a thread", "persistent"}
    for kind, results in states.items():
        for state in results:
            assert_fresh(state, fresh_python, persistent=kind == "persistent")

"""Whatever the notebook did to its own signals, every rank's true ending is reported (issue 32 item 1).

The notebook's SIGCHLD in each state a real notebook gets into: ignored (``SIG_IGN``: the
kernel reaps every child itself, a common "no zombies" recipe), ``SA_NOCLDWAIT`` set from C
(the same, invisible to Python), a Python handler that reaps every child (``waitpid(-1)``), a
thread that waits for every child (a library's child watcher), and SIGCHLD blocked. In each,
a fork and a spawn launch and persistent ranks report ``os._exit(3)`` as exit code 3 and a
SIGKILL as SIGKILL, and the result of a rank that returned is its result. Before the fix every
fork launch with SIGCHLD ignored failed ("exit code -1"), and spawn called a killed rank's end
exit code 0.

And a notebook that ignores or blocks SIGTERM and SIGINT still stops its ranks: the ranks
start with a fresh Python's signals (tests/test_rank_inherited_state.py), so the teardown's
SIGTERM reaches them.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest
from helpers.waiting import ended, wait_for

from notebook_launch import LaunchError, notebook_launcher, start_ranks
from notebook_launch.engines.local import fork_thread
from notebook_launch.planning.net import free_port
from helpers.processes import children


def _wait_until_ended(pid: int) -> None:
    """Until ``pid`` (a sibling rank) has ended: gone, or a zombie nobody reaped yet."""
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] in ("Z", "X"):
                    return
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.01)


def what_a_rank_sees() -> dict:
    """Its pid, and what the notebook's SIGCHLD must not change in a rank: its own SIGCHLD is the
    default, so a subprocess it starts reports its true exit code (with SIGCHLD ignored a
    Popen says 0)."""
    return {"pid": os.getpid(), "SIGCHLD": str(signal.getsignal(signal.SIGCHLD)),
            "a subprocess's exit code": subprocess.run(["sh", "-c", "exit 5"]).returncode}


def end_after_rank_0(how: str, pid_file: str) -> dict:
    """Rank 0 returns what_a_rank_sees(); rank 1 waits until rank 0 has ended, then ends as
    ``how`` says, so rank 0's result is in before rank 1 fails."""
    rank = int(os.environ["RANK"])
    if rank == 0:
        seen = what_a_rank_sees()
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pid_file + ".tmp", pid_file)
        return seen
    if how == "return":
        return what_a_rank_sees()
    while not os.path.exists(pid_file):
        time.sleep(0.01)
    with open(pid_file) as f:
        _wait_until_ended(int(f.read()))
    if how == "exit 3":
        os._exit(3)
    if how == "SIGKILL":
        os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError(f"not a way to end: {how}")


# --- the notebook's SIGCHLD, each state a context manager that puts everything back ----------

class _SigAction(ctypes.Structure):
    """glibc's struct sigaction (the same on x86_64 and aarch64)."""
    _fields_ = [("sa_handler", ctypes.c_void_p), ("sa_mask", ctypes.c_ulong * 16),
                ("sa_flags", ctypes.c_int), ("sa_restorer", ctypes.c_void_p)]


SA_NOCLDWAIT = 2


def sigchld_action() -> tuple[int | None, int]:
    """SIGCHLD's handler address and flags as the kernel has them (Python sees neither flags nor
    a handler set from C): what the notebook must get back after every launch."""
    action = _SigAction()
    assert ctypes.CDLL(None).sigaction(signal.SIGCHLD, None, ctypes.byref(action)) == 0
    return action.sa_handler, action.sa_flags


@contextmanager
def sigchld_ignored() -> Iterator[set[int]]:
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        yield set()
    finally:
        signal.signal(signal.SIGCHLD, previous)


@contextmanager
def no_child_wait_from_c() -> Iterator[set[int]]:
    """SIGCHLD's handler the default, SA_NOCLDWAIT set by C code: Python's getsignal still says
    SIG_DFL, the kernel reaps every child itself."""
    libc = ctypes.CDLL(None, use_errno=True)
    old, new = _SigAction(), _SigAction()
    assert libc.sigaction(signal.SIGCHLD, None, ctypes.byref(old)) == 0
    ctypes.memmove(ctypes.byref(new), ctypes.byref(old), ctypes.sizeof(_SigAction))
    new.sa_flags |= SA_NOCLDWAIT
    assert libc.sigaction(signal.SIGCHLD, ctypes.byref(new), None) == 0
    try:
        yield set()
    finally:
        assert libc.sigaction(signal.SIGCHLD, ctypes.byref(old), None) == 0


@contextmanager
def reaping_handler() -> Iterator[set[int]]:
    """A Python SIGCHLD handler that reaps every child that ended; yields the pids it reaped."""
    reaped: set[int] = set()

    def reap(signum: int, frame: object) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            reaped.add(pid)

    previous = signal.signal(signal.SIGCHLD, reap)
    try:
        yield reaped
    finally:
        signal.signal(signal.SIGCHLD, previous)


@contextmanager
def reaping_thread() -> Iterator[set[int]]:
    """A thread blocked in waitpid(-1) for every child, as a library's child watcher; yields the
    pids it reaped. At the end a child of its own that exits at once wakes it to stop, so it
    takes no later test's children; that child is waited for here too, as the thread may have
    seen ``done`` and stopped (between two tries with no child) before it ended."""
    reaped: set[int] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                pid, _ = os.waitpid(-1, 0)
            except ChildProcessError:   # no child right now
                time.sleep(0.001)
                continue
            reaped.add(pid)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield reaped
    finally:
        done.set()
        with warnings.catch_warnings():   # Python 3.12+: a fork of a process with threads; this child only exits
            warnings.simplefilter("ignore", DeprecationWarning)
            waker = os.fork()
            if waker == 0:
                os._exit(0)
        thread.join()
        try:
            os.waitpid(waker, 0)
        except ChildProcessError:   # the thread reaped it
            pass


@contextmanager
def sigchld_blocked() -> Iterator[set[int]]:
    """SIGCHLD blocked in this thread (the one that launches and supervises) and so in the fork
    helper made from it."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    try:
        yield set()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


NOTEBOOK_STATES: dict[str, Callable[[], AbstractContextManager[set[int]]]] = {
    "SIGCHLD ignored": sigchld_ignored,
    "SA_NOCLDWAIT from C": no_child_wait_from_c,
    "a handler reaps every child": reaping_handler,
    "a thread reaps every child": reaping_thread,
    "SIGCHLD blocked": sigchld_blocked,
}
# States in which the notebook takes the statuses: without the pidfd's copy they would be lost.
STATUS_TAKEN = {"SIGCHLD ignored", "SA_NOCLDWAIT from C", "a handler reaps every child", "a thread reaps every child"}


@pytest.fixture(autouse=True)
def _no_child_left_for_later_tests() -> Iterator[None]:
    """Later tests in the same process (xdist worker) check that a launch leaves no child: a
    state here that left one (as the reaping thread once did, stopping before it reaped the child
    that woke it) fails here, where it was made, not there."""
    before = {child.pid for child in children(recursive=False)}
    yield
    deadline = time.monotonic() + 5
    while (left := [c for c in children(recursive=False) if c.pid not in before]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == [], f"this test left children: {left}"


@pytest.fixture
def fresh_fork_helper(monkeypatch):
    """The fork helper thread is made by this test's first launch (so it inherits a blocked mask)."""
    monkeypatch.setattr(fork_thread, "_fork_thread", None)


@pytest.mark.parametrize("state", list(NOTEBOOK_STATES))
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_launch_reports_each_ranks_true_ending(state, start_method, tmp_path, fresh_fork_helper):
    def launch(how: str) -> list:
        return notebook_launcher(end_after_rank_0, args=(how, str(tmp_path / how.replace(" ", "_"))),
                                 num_processes=2, start_method=start_method, use_port=str(free_port()),
                                 log_dir=str(tmp_path / "logs"), ui="none", timeout=240)

    with NOTEBOOK_STATES[state]() as reaped_by_notebook:
        notebooks_own = sigchld_action()
        seen = launch("return")
        assert [sorted(r) for r in seen] == [["SIGCHLD", "a subprocess's exit code", "pid"]] * 2, seen
        for rank_saw in seen:
            assert rank_saw["SIGCHLD"] == str(signal.SIG_DFL) and rank_saw["a subprocess's exit code"] == 5
        endings = {}
        for how in ("exit 3", "SIGKILL"):
            with pytest.raises(LaunchError) as caught:
                launch(how)
            endings[how] = caught.value
        assert sigchld_action() == notebooks_own   # the launches left the notebook's SIGCHLD as it was
    exit_3, killed = endings["exit 3"], endings["SIGKILL"]
    assert exit_3.rank == 1 and exit_3.kind == "exit", str(exit_3)
    assert str(exit_3).startswith("rank 1 failed: exit code 3 without raising a Python exception"), str(exit_3)
    assert exit_3.failures[1].exitcode == 3
    assert killed.rank == 1 and killed.kind == "signal", str(killed)
    assert str(killed).startswith("rank 1 failed: killed by SIGKILL"), str(killed)
    assert killed.failures[1].exitcode == -signal.SIGKILL
    for error in (exit_3, killed):   # rank 0 returned before rank 1 ended: its result is its result
        assert error.results is not None and isinstance(error.results[0], dict), str(error)
        assert error.results[0]["a subprocess's exit code"] == 5
        assert "rank 0: finished" in str(error) or "rank 0: done" in str(error), str(error)
    if state in STATUS_TAKEN - {"SIGCHLD ignored", "SA_NOCLDWAIT from C"} and start_method == "fork":
        # who reaps first is a race (the kernel alone reaps in the other two states): the
        # notebook took some of them here, and their true endings came from the pidfd. Spawned
        # ranks are the warm start process's children: it reaps them and says how they ended.
        assert reaped_by_notebook


def exit_3_on_rank_1() -> None:
    if int(os.environ["RANK"]) == 1:
        os._exit(3)
    time.sleep(600)


def rank_pid() -> int:
    return os.getpid()


@pytest.mark.parametrize(("state", "start_method"), [(state, "fork") for state in NOTEBOOK_STATES] + [
    ("SIGCHLD ignored", "spawn"), ("a thread reaps every child", "spawn")])   # spawn: the same ended_status
def test_persistent_ranks_report_each_ranks_true_ending(state, start_method, tmp_path, capsys, fresh_fork_helper):
    with NOTEBOOK_STATES[state]() as reaped_by_notebook, \
            start_ranks(2, use_port=free_port(), log_dir=str(tmp_path / "logs"), ui="none", timeout=240,
                        start_method=start_method) as ranks:
        notebooks_own = sigchld_action()
        assert ranks.run(rank_pid) == ranks.pids
        with pytest.raises(LaunchError) as caught:   # ends in a call
            ranks.run(exit_3_on_rank_1)
        assert "rank 1 died (exit code 3)" in str(caught.value), str(caught.value)
        assert caught.value.failures[1].exitcode == 3
        first_pids = ranks.pids
        assert ranks.run(rank_pid) == ranks.pids != first_pids   # restarted
        killed = ranks.pids[0]
        os.kill(killed, signal.SIGKILL)   # ends between calls
        assert wait_for(lambda: ended(killed))
        capsys.readouterr()
        assert ranks.run(rank_pid) == ranks.pids
        assert "local rank 0 ended between calls (killed by SIGKILL" in capsys.readouterr().out
        assert sigchld_action() == notebooks_own
    if state in STATUS_TAKEN - {"SIGCHLD ignored", "SA_NOCLDWAIT from C"}:
        assert reaped_by_notebook


def raise_on_rank_0_while_rank_1_sleeps(folder: str) -> None:
    """Rank 0 gives up once rank 1 is in its function: the stop then meets rank 1 as the user's code
    sees it, its dispositions already its own (on a busy machine rank 1 could otherwise still be
    starting when the stop came, inside the notebook's ignored and blocked SIGTERM)."""
    ready = os.path.join(folder, "rank1-ready")
    if int(os.environ["RANK"]) == 0:
        while not os.path.exists(ready):
            time.sleep(0.01)
        raise ValueError("rank 0 gives up")
    open(ready, "w").close()
    time.sleep(600)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_notebook_that_ignores_and_blocks_sigterm_and_sigint_still_stops_its_ranks(start_method, tmp_path,
                                                                                     fresh_fork_helper):
    ignored = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in ignored}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ignored)
    try:
        with pytest.raises(LaunchError) as caught:
            notebook_launcher(raise_on_rank_0_while_rank_1_sleeps, args=(str(tmp_path),), num_processes=2,
                              start_method=start_method,
                              use_port=str(free_port()), log_dir=str(tmp_path / "logs"), ui="none", timeout=240)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    error = caught.value
    assert str(error).startswith("rank 0 failed: ValueError: rank 0 gives up"), str(error)
    assert "rank 1: stopped by notebook_launch (SIGTERM) after rank 0 failed" in str(error), str(error)


def test_in_a_real_kernel_that_ignores_sigchld_every_launch_reports_true_endings(tmp_path):
    """In a Jupyter kernel as it is, after a cell set SIGCHLD to SIG_IGN: fork and spawn launches
    and persistent ranks return their results, and report os._exit(3) as exit code 3."""
    import json
    import textwrap

    from helpers.nbutil import make_notebook, run_notebook
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    out = tmp_path / "endings.json"
    nb = make_notebook(textwrap.dedent(f'''
        import json, os, signal, sys
        sys.path.insert(0, {tests_dir!r})
        from test_notebook_signal_dispositions import end_after_rank_0, exit_3_on_rank_1, rank_pid
        from notebook_launch import LaunchError, notebook_launcher, start_ranks
        from notebook_launch.planning.net import free_port
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        endings = {{}}
        for method in ("fork", "spawn"):
            pids = notebook_launcher(end_after_rank_0, args=("return", os.path.join({str(tmp_path)!r}, method + "-ok")),
                                     num_processes=2, start_method=method, ui="none",
                                     use_port=str(free_port()), timeout=240)
            try:
                notebook_launcher(end_after_rank_0, args=("exit 3", os.path.join({str(tmp_path)!r}, method)),
                                  num_processes=2, start_method=method, ui="none",
                                  use_port=str(free_port()), timeout=240)
            except LaunchError as error:
                endings[method] = [len(pids), str(error).splitlines()[0], error.failures[1].exitcode,
                                   error.results[0]["a subprocess's exit code"]]
        with start_ranks(2, use_port=free_port(), ui="none", timeout=240) as ranks:
            pids = ranks.run(rank_pid)
            try:
                ranks.run(exit_3_on_rank_1)
            except LaunchError as error:
                endings["persistent"] = [len(pids), str(error).splitlines()[0], error.failures[1].exitcode, 5]
        endings["SIGCHLD"] = str(signal.getsignal(signal.SIGCHLD))
        json.dump(endings, open({str(out)!r}, "w"))
    '''))
    run_notebook(nb, cwd=str(tmp_path), timeout=600)
    endings = json.loads(out.read_text())
    assert endings.pop("SIGCHLD") == str(signal.SIG_IGN)   # the notebook's own, untouched
    exit_3 = "rank 1 failed: exit code 3 without raising a Python exception (os._exit, or a crash in C code)"
    assert endings == {"fork": [2, exit_3, 3, 5], "spawn": [2, exit_3, 3, 5], "persistent": [2, exit_3, 3, 5]}


def returns_its_rank() -> int:
    return int(os.environ["RANK"])


@pytest.mark.parametrize("start_method", ["fork", "spawn", "spawn, start process off"])
def test_where_the_kernel_keeps_no_status_a_result_that_arrived_is_the_ranks_result(start_method, tmp_path,
                                                                                    monkeypatch):
    """Linux before 6.15 keeps no exit status on a pidfd (here: PIDFD_GET_INFO made to fail as
    such a kernel's does): with SIGCHLD ignored a rank's status is lost. A rank that returned has
    its result; one that ended without a result or an exception says its status was taken. Ranks
    forked from the warm start process are its children, not the notebook's: it keeps their
    statuses whatever the notebook does with SIGCHLD, so theirs is never lost."""
    import errno

    from notebook_launch.engines.local import start_process
    from notebook_launch.channels import process

    def no_pidfd_info(pidfd: int) -> None:
        raise OSError(errno.ENOTTY, "Inappropriate ioctl for device")

    monkeypatch.setattr(process, "_pidfd_exit_info", no_pidfd_info)
    if "off" in start_method:
        monkeypatch.setenv(start_process.SWITCH, "0")
    start_method = start_method.split(",")[0]
    with sigchld_ignored():
        results = notebook_launcher(returns_its_rank, num_processes=2, start_method=start_method,
                                    use_port=str(free_port()), log_dir=str(tmp_path / "logs"), ui="none",
                                    timeout=240)
        with pytest.raises(LaunchError) as caught:
            notebook_launcher(end_after_rank_0, args=("exit 3", str(tmp_path / "pid")), num_processes=2,
                              start_method=start_method, use_port=str(free_port()),
                              log_dir=str(tmp_path / "logs"), ui="none", timeout=240)
    assert results == [0, 1]
    error = caught.value
    if start_method == "spawn" and os.environ.get(start_process.SWITCH) != "0":
        assert error.rank == 1 and error.failures[1].exitcode == 3, str(error)   # the start process kept it
        assert str(error).startswith("rank 1 failed: exit code 3"), str(error)
        return
    assert error.rank == 1 and error.failures[1].exitcode == -1, str(error)   # torch's "unknown"
    assert str(error).startswith("rank 1 failed: ended, its exit status taken before notebook_launch could "
                                 "read it (the notebook ignores SIGCHLD"), str(error)
    assert error.results is not None and isinstance(error.results[0], dict)   # rank 0's result: its own


def test_the_status_is_waited_for_while_the_kernel_has_not_kept_it_yet(monkeypatch):
    """Between a reaped child leaving its parent (ECHILD) and the kernel keeping its status on the
    pidfd the exiting process can be preempted: on a loaded machine that moment outlasted 127 ms
    of tries and a SIGKILLed rank was called 'its exit status taken'. The moment cannot be made
    to last here, so a stand-in for the kernel's answers (KernelNotKeptYet) plays it: ESRCH and
    'not kept yet' for 300 ms, then the status; and a kernel without PIDFD_GET_INFO answers at once."""
    import errno

    from notebook_launch.channels import process

    class KernelNotKeptYet:
        def __init__(self, error: int | None) -> None:
            self.until, self.error, self.asked = time.monotonic() + 0.3, error, 0

        def __call__(self, pidfd: int):
            self.asked += 1
            if time.monotonic() < self.until:
                if self.error is not None and self.asked % 2:
                    raise OSError(self.error, os.strerror(self.error))
                return None
            return ("signal", 9)

    monkeypatch.setattr(process, "_pidfd_exit_info", KernelNotKeptYet(errno.ESRCH))
    assert process._exit_status_kept(-1) == ("signal", 9)
    unsupported = KernelNotKeptYet(errno.ENOTTY)
    monkeypatch.setattr(process, "_pidfd_exit_info", unsupported)
    assert process._exit_status_kept(-1) is None and unsupported.asked == 1

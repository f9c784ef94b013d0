"""Nothing a rank started outlives the run: its process group dies with it, and strays are swept.

Every rank leads its own process group, and what it starts (subprocess, multiprocessing,
DataLoader workers) stays in that group unless it moves out. When a rank ends, however it
ends (a return, an exception, os._exit, a segfault, SIGKILL), ``end_rank_group`` kills the
group while the rank is still an unreaped zombie: its pid, and so the group id, cannot
have been reused by then. A process that left the group (``setsid``, ``start_new_session=True``,
a daemon) is found at the end of the run, or of each elastic attempt, by ``sweep``: it still
carries the rank's NOTEBOOK_LAUNCH_RUN_ID in its environment, unless it cleared it. Linux only
(/proc and pidfds); elsewhere only the group is killed.

Both need the notebook alive. For when it is not (a hard kernel restart SIGKILLs it while
ranks run; the ranks die with it, PR_SET_PDEATHSIG, but their children would not), ``guard``
registers every rank's group and run with the notebook's keeper (``orphan_keeper``), which
kills the same processes as soon as the notebook is gone; ``sweep`` tells it the run ended.
What escapes: a process that both left the rank's group and cleared its environment (the
equivalent of a ``systemd-run`` or ``nohup env -i``), as it would escape the sweep.
"""
from __future__ import annotations

import fcntl
import logging
import os
import signal
import socket
import subprocess
import sys
import threading

from ..wire.fork_locks import ForkRenewedLock, no_fork_during_exec

log = logging.getLogger("notebook_launch")
RUN_MARK = "NOTEBOOK_LAUNCH_RUN_ID"


def end_rank_group(pid: int) -> None:
    """SIGKILL the process group that rank ``pid`` leads. Call it after the rank exited and
    before it is reaped: until then no other process or group can have that number."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass   # the group is empty (or the rank died before it made its own group)
    except PermissionError:
        log.debug("cannot signal process group %d", pid, exc_info=True)


_births: dict[str, tuple[int, int]] = {}   # run id -> birth_mark() before its first rank started


def note_start(run_id: str) -> None:
    """Before a run's first rank starts: where the kernel's pid counter stood, so that ``sweep``
    reads only the environments of processes started since (a warm 4-rank launch read every
    process's /proc/PID/environ, some 150 files on a quiet machine: a tenth of its time, issue 45)."""
    mark = birth_mark()
    if run_id and mark is not None:
        _births[run_id] = mark


def birth_of(run_id: str) -> tuple[int, int] | None:
    """Where the pid counter stood before the run's first rank started (``note_start``), if noted."""
    return _births.get(run_id)


def birth_mark() -> tuple[int, int] | None:
    """(the last pid the kernel handed out, the forks it counted since boot), or None where /proc
    does not say."""
    try:
        with open("/proc/loadavg", "rb") as f:
            last = int(f.read().split()[-1])
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"processes "):
                    return last, int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _born_since(since: tuple[int, int] | None, pids: list[int]) -> list[int]:
    """The pids of ``pids`` that can have been handed out since ``since`` (``birth_mark``), or
    all of them where /proc does not say (``born_between``)."""
    now = birth_mark()
    if since is None or now is None:
        return pids
    try:
        with open("/proc/sys/kernel/pid_max", "rb") as f:
            pid_max = int(f.read())
    except (OSError, ValueError):
        return pids
    return born_between(since, now, pid_max, pids)


def born_between(since: tuple[int, int], now: tuple[int, int], pid_max: int, pids: list[int]) -> list[int]:
    """The pids of ``pids`` from the kernel's pid counter's place at ``since`` to its place at ``now``
    (each ``(last pid, forks since boot)``), going round at ``pid_max``. All of them where the counter
    may have made a whole turn: it moved by the forks since, plus the pids in use it skipped (at most
    as many as exist), so ``pid_max // 2`` of the two together is the bound."""
    (first, forks_then), (last, forks_now) = since, now
    if forks_now - forks_then + len(pids) >= pid_max // 2:
        return pids
    if last >= first:
        return [pid for pid in pids if first < pid <= last]
    return [pid for pid in pids if pid > first or pid <= last]   # the counter went round past pid_max


def sweep(run_id: str) -> list[int]:
    """SIGKILL every process of this user whose environment carries this run's id (a rank's
    descendant that left the rank's process group). Call it once no rank of the run is alive.
    Returns the pids signalled. The notebook's keeper forgets the run. Only processes started
    since the run's ``note_start`` can carry its id: only theirs are read."""
    _tell_keeper(f"- {run_id}", start=False)
    since = _births.pop(run_id, None)
    if not hasattr(os, "pidfd_open") or not os.path.isdir("/proc"):
        return []
    mark = f"{RUN_MARK}={run_id}".encode()
    me = os.getpid()
    killed = []
    pids = [int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit()]
    for pid in _born_since(since, pids):
        if pid == me or not _carries(pid, mark):
            continue
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue   # it ended meanwhile
        try:
            if _carries(pid, mark):   # still the same process: the pidfd pins it
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                killed.append(pid)
        except OSError:
            log.debug("could not kill stray process %d of run %s", pid, run_id, exc_info=True)
        finally:
            os.close(pidfd)
    if killed:
        log.debug("run %s: killed %d process(es) that left their rank's group: %s", run_id, len(killed), killed)
    return killed


def _carries(pid: int, mark: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return mark in f.read().split(b"\0")
    except OSError:
        return False   # another user's process, or gone


# --- the keeper: the same cleanup when the notebook itself dies ----------------------------

_KEEPER_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "orphan_keeper.py")
_keeper_lock = ForkRenewedLock()


class _Keeper:
    """This process's keeper, as the notebook sees it: the end of the socket pair it writes
    orders to, and the keeper's first process (it exits once the keeper forked; reaped later)."""

    def __init__(self, owner: int, orders: socket.socket, first: subprocess.Popen | None) -> None:
        self.owner, self.orders, self.first = owner, orders, first

    def reap_first(self) -> None:
        if self.first is not None and self.first.poll() is not None:
            self.first = None


_keeper: _Keeper | None = None


def guard(run_id: str, *groups: int) -> None:
    """Have the notebook's keeper kill rank groups ``groups`` and whatever carries ``run_id`` if
    this process (the notebook) dies before the run is swept. Starts the keeper on first use,
    without waiting for it (a fresh interpreter: tens of milliseconds, once per notebook, that
    the launch does not wait for; the order waits for it in the socket); never raises. A launch
    names all its ranks in one order: one wakeup of the keeper, not one per rank."""
    if run_id and groups:
        _tell_keeper(f"+ {run_id} {' '.join(map(str, groups))}", start=True)


def start_keeper_ahead() -> None:
    """Start this process's keeper now if it has none: a launch (or persistent ranks) calls it once
    its checks passed, before it makes its run folder and forks its ranks. ``guard`` used to start
    it at the first rank's registration, between the forks of the first launch's first two ranks:
    the keeper's interpreter then started (~15 ms of CPU) on the cores the ranks were starting
    on, and the first rank ran for a moment with no keeper yet. Ahead, it starts beside the run
    folder and the forks, and every rank is registered with a keeper already there. The notebook
    waits only for its exec (Popen uses vfork), never for it to be ready. A start that fails is
    logged, and ``guard`` tries again."""
    global _keeper
    if not hasattr(os, "pidfd_open") or not os.path.isdir("/proc"):
        return
    with _keeper_lock:
        if _current_keeper() is None:
            _keeper = _start_keeper()


def _current_keeper() -> _Keeper | None:
    keeper = _keeper
    return keeper if keeper is not None and keeper.owner == os.getpid() else None


def keeper_fds() -> set[int]:
    """The descriptors this process holds for its keeper (the orders socket): opened at the first
    launch and kept for the process's life, like the keeper itself. What a check for descriptors a
    launch left open leaves out."""
    keeper = _keeper
    if keeper is None or keeper.owner != os.getpid():
        return set()
    try:
        return {keeper.orders.fileno()} - {-1}
    except OSError:
        return set()


def _tell_keeper(message: str, *, start: bool) -> None:
    if not hasattr(os, "pidfd_open") or not os.path.isdir("/proc"):
        return
    global _keeper
    data = (message + "\n").encode()
    with _keeper_lock:
        for attempt in range(2):
            keeper = _current_keeper()
            if keeper is None:
                if not start:
                    return
                keeper = _keeper = _start_keeper()
                if keeper is None:
                    return
            keeper.reap_first()
            try:   # never blocks, never raises SIGPIPE (whatever the notebook did to it)
                sent = keeper.orders.send(data, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
                if sent == len(data):
                    return
                log.debug("the orphan keeper's socket is full: %r only partly sent", message)
                return
            except BlockingIOError:   # a keeper that stopped reading: it cannot take more
                log.debug("the orphan keeper's socket is full: %r not sent", message)
                return
            except OSError:   # the keeper is gone (killed): start another, once
                log.debug("the orphan keeper did not take %r (attempt %d)", message, attempt + 1, exc_info=True)
                keeper.orders.close()
                _keeper = None


def _above_std(fd: int) -> int:
    """``fd`` moved to 3 or above: in a notebook whose fds 0-2 are closed (a daemonized host) a new
    descriptor can be one of them, and the keeper's stdin/stdout/stderr (/dev/null) then replaced
    the orders socket or the pidfd it was handed: it read end-of-file at once, took the notebook
    for dead and killed the ranks it was told of. (The notebook's own end is moved too: on fd 1
    its prints would have gone to the keeper as orders.)"""
    if fd > 2:
        return fd
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


def _start_keeper() -> _Keeper | None:
    """Start the keeper (``orphan_keeper``) for this process, without waiting for it: the orders
    written meanwhile wait in the socket pair's buffer for it."""
    try:
        pidfd = _above_std(os.pidfd_open(os.getpid()))
    except OSError:
        log.debug("no pidfd for this process: no orphan keeper", exc_info=True)
        return None
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours, theirs = (socket.socket(fileno=_above_std(end.detach())) for end in (ours, theirs))
    except OSError:
        os.close(pidfd)
        log.debug("no socket pair for the orphan keeper", exc_info=True)
        return None
    try:
        with no_fork_during_exec:   # a rank forked meanwhile would hold Popen's error pipe (fork_locks)
            first = subprocess.Popen(
                [sys.executable, "-I", "-S", _KEEPER_PROGRAM, str(theirs.fileno()), str(pidfd)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(), pidfd), close_fds=True, start_new_session=True, env={})
    except OSError:
        log.debug("could not start the orphan keeper", exc_info=True)
        ours.close()
        return None
    except BaseException:   # an interrupt meanwhile: no keeper, and no socket left open
        ours.close()
        raise
    finally:
        theirs.close()
        os.close(pidfd)
    # Its first process exits as soon as the keeper forked: reaped at once by a thread of its own,
    # not at the next order (a launch refused by a later check gives none, and the notebook held
    # a zombie child until its next launch).
    threading.Thread(target=first.wait, name="notebook_launch-keeper-reap", daemon=True).start()
    return _Keeper(os.getpid(), ours, first)

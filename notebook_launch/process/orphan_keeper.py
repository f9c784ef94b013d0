"""The keeper: a tiny process that ends what the ranks started when the notebook itself dies.

Run as a program (``python -I -S orphan_keeper.py ORDERS_FD PIDFD``), never imported by the
notebook: stdlib only. ``leftovers`` starts one per notebook process, lazily, at its
first launch, before the ranks (``start_keeper_ahead``; ``guard`` if that failed), and does not
wait for it to start.

Why a process of its own: a rank dies with the notebook (PR_SET_PDEATHSIG), but what the
rank started (a ``subprocess.Popen``, DataLoader workers, a daemon) does not, and the
supervisor that would end them (``leftovers.end_rank_group``/``sweep``) died with the
notebook. The keeper watches the notebook through a pidfd the notebook handed it, so it
wakes however the notebook ends (a hard kernel restart's SIGKILL included), and then kills
every process in a registered rank's process group and every process whose environment
carries a registered run's ``NOTEBOOK_LAUNCH_RUN_ID``, in rounds until none is left.

It is a fresh interpreter, not a fork: a fork would keep the notebook's memory pages alive
for as long as it lives. It leaves the notebook's process group and session (Jupyter kills
the kernel's group on a restart) and is not the notebook's child (it forks once and the
first process exits), so it never shows among the notebook's children. It learns the runs
from lines on a socket pair whose other end only the notebook holds (``ORDERS_FD``):
``+ RUN_ID PGID`` registers a rank's group, ``- RUN_ID`` forgets a run that ended (the
supervisor swept it already). The notebook writes them from its first launch on, while the
keeper may still be starting: they wait in the socket's buffer, which outlives the notebook.
So a notebook that dies before the keeper reads anything still has its runs ended: the
keeper reads everything that was written before it acts on the notebook's death.
"""
from __future__ import annotations

import os
import select
import signal
import sys

RUN_MARK = b"NOTEBOOK_LAUNCH_RUN_ID"
MAX_ROUNDS = 50


def main(argv: list[str]) -> None:
    orders, pidfd = int(argv[0]), int(argv[1])
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_IGN)   # a terminal's hangup or Ctrl-C must not end it first
    if os.fork() != 0:   # the notebook reaps this first process; the keeper is nobody's child there
        os._exit(0)
    os.set_blocking(orders, False)
    runs: dict[bytes, set[int]] = {}
    pending = b""
    listening = True
    while True:
        ready, _, _ = select.select([pidfd] + ([orders] if listening else []), [], [])
        pending, listening = read_orders(orders, pending, runs)
        if pidfd in ready:   # the notebook is gone; what it wrote before dying was read just now
            break
    end_everything(runs)


def read_orders(orders: int, pending: bytes, runs: dict[bytes, set[int]]) -> tuple[bytes, bool]:
    """Apply every whole line waiting on ``orders``; the part of a line still to come, and
    whether more can come (False once every notebook-side end is closed)."""
    while True:
        try:
            chunk = os.read(orders, 65536)
        except BlockingIOError:
            return pending, True
        except OSError:
            return pending, False
        if not chunk:
            return pending, False
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            apply_order(line, runs)


def apply_order(line: bytes, runs: dict[bytes, set[int]]) -> None:
    parts = line.split()
    try:
        if len(parts) >= 3 and parts[0] == b"+":   # "+ RUN GROUP...": a launch's ranks in one order
            groups = [int(part) for part in parts[2:]]
            runs.setdefault(parts[1], set()).update(group for group in groups if group > 1)   # never 0 (ours) or 1
        elif len(parts) == 2 and parts[0] == b"-":
            runs.pop(parts[1], None)
    except ValueError:
        pass   # not an order of ours


def end_everything(runs: dict[bytes, set[int]]) -> None:
    """Kill every process in the runs' groups or carrying their marks, until a round finds none."""
    if not runs:
        return
    groups = set().union(*runs.values())
    marks = {RUN_MARK + b"=" + run_id for run_id in runs}
    me = os.getpid()
    for _ in range(MAX_ROUNDS):
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:
                pass
        found = False
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            pid = int(entry.name)
            if _belongs(pid, groups, marks):
                found = True
                _kill(pid, groups, marks)
        if not found:
            return


def _belongs(pid: int, groups: set[int], marks: set[bytes]) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        if fields[0] in (b"Z", b"X"):   # dead already, waiting to be reaped
            return False
        if int(fields[2]) in groups:
            return True
        with open(f"/proc/{pid}/environ", "rb") as f:
            return any(item in marks for item in f.read().split(b"\0"))
    except (OSError, ValueError, IndexError):
        return False   # gone, or another user's


def _kill(pid: int, groups: set[int], marks: set[bytes]) -> None:
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if _belongs(pid, groups, marks):   # still the same process: the pidfd pins it
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)


if __name__ == "__main__":
    main(sys.argv[1:])

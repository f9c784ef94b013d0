"""The warm start process: a fresh Python, started by the notebook (``engines.local.start_process``),
that imports once what ranks need (torch, torch.distributed, and torch._dynamo when a launch
trains) and then forks every rank of a launch that must not fork the notebook itself (a notebook
holding a CUDA context, ``start_method="spawn"``, persistent ranks started that way). A rank forked
from here starts in milliseconds instead of paying a Python start and a torch import of its own.

What keeps it as safe as a fresh interpreter:
- It never initialises an accelerator runtime: after its imports it checks that CUDA and the XLA
  runtime are not initialised, and refuses to serve (the notebook then starts ranks the slow way)
  if something did. It imports nothing the user wrote: its ``sys.path`` is the notebook's
  without the working directory, its own working directory is ``/``.
- A rank is forked with the notebook's state of the moment: each request carries the notebook's
  environment and working directory, and the rank then runs ``rank.spawn_entry`` exactly as a
  spawned rank does (the notebook's ``sys.path``, cells and random states from the payload; the
  job unpickled there, so the user's modules are imported fresh, as edited on disk).
- Its ranks are its children: it reaps each one as it ends and tells the notebook how it ended
  and what the kernel counted of it (``start_wire.REPORT``: pid, exit code or signal, peak memory, CPU time)
  on a pipe of their own, so the notebook's SIGCHLD handling never takes a status. A rank dies
  with this process (PR_SET_PDEATHSIG), and this process with the notebook.
- It holds nothing of a run: the fds a request brings are closed here once the ranks have them.
  It ends when the notebook ends (a pidfd on the notebook: SIGKILL included); when the notebook
  closes the socket (a start process retired because a package changed), once its last rank ended.

Messages (``channels.start_wire``): the notebook sends ``{"ranks": {...}}`` with every rank's fds
and gets ``{"pids": [...]}`` or ``{"error": text}``; ``{"warm": [...]}`` imports more; ``{"state":
True}`` answers what this process holds (for tests and the docs' numbers). At start it sends
``{"ready": ...}`` with the files of the packages it imported (``fingerprints``), so the notebook can
tell when a ``%pip install -U`` replaced one and start a fresh start process.
"""
from __future__ import annotations

import functools
import gc
import os
import select
import signal
import socket
import sys
import threading
from typing import Any

from ...channels import start_wire
from ...rank import forking
from ...rank.preload import EVERY_RANK, warm

SOCKET_VARIABLE = "NOTEBOOK_LAUNCH_START_SOCKET"     # "<socket fd> <reports fd> <notebook pid>"
# "1": torch was imported here without its device backends (engines.local.start_client.withhold_device_backends):
# every rank forked from here loads them itself (rank.device_backends)
WITHHELD_VARIABLE = "NOTEBOOK_LAUNCH_DEVICE_BACKENDS_WITHHELD"
backends_withheld = False


def main() -> int:
    fd, reports, notebook = (int(x) for x in os.environ.pop(SOCKET_VARIABLE).split())
    global backends_withheld
    backends_withheld = os.environ.pop(WITHHELD_VARIABLE, "") == "1"
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the notebook's Ctrl-C is for the ranks, not for us
    # A notebook that ignores SIGCHLD hands that on through exec: the kernel would then reap the ranks
    # itself and their statuses would be gone. Ours to keep: the default, and it unblocked.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
    try:
        notebook_fd = os.pidfd_open(notebook)
    except ProcessLookupError:
        return 0
    warm(sys.argv[1:], quiet_if_missing=True)
    from ...rank import spawn_entry  # noqa: F401  (what every rank runs: imported once here, not in each)
    warm(EVERY_RANK, quiet_if_missing=True)
    problem = accelerator_initialized()
    if problem:
        start_wire.send(sock, {"error": f"the start process would hold {problem} after its imports"})
        return 1
    start_wire.send(sock, {"ready": {"pid": os.getpid(), "fingerprints": fingerprints()}})
    Server(sock, reports, notebook_fd).serve()
    return 0


class Server:
    """The loop: requests on the socket, the ranks' ends on their pidfds, the notebook's on its own."""

    def __init__(self, sock: socket.socket, reports: int, notebook_fd: int) -> None:
        self.sock, self.reports, self.notebook_fd = sock, reports, notebook_fd
        self.children: dict[int, int] = {}    # pidfd -> pid of each rank still running
        self.open = True                      # the notebook still sends requests

    def serve(self) -> None:
        while self.open or self.children:
            watched = [self.notebook_fd, *self.children] + ([self.sock.fileno()] if self.open else [])
            ready, _, _ = select.select(watched, [], [])
            if self.notebook_fd in ready:
                return   # the ranks die with this process (PR_SET_PDEATHSIG)
            for fd in ready:
                if fd in self.children:
                    self.reap(fd)
            if self.open and self.sock.fileno() in ready:
                self.answer()

    def answer(self) -> None:
        try:
            message, fds = start_wire.receive(self.sock)
        except start_wire.WireClosed:
            self.open = False   # retired: serve the ranks' ends until the last one, then end
            return
        sent: list[int] = []
        try:
            answer, sent = self.handle(message, fds)
        except Exception as exc:   # why: a request that failed here is the notebook's error to raise
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        try:
            start_wire.send(self.sock, answer, sent)
        except start_wire.WireClosed:
            self.open = False

    def handle(self, message: dict[str, Any], fds: list[int]) -> tuple[dict[str, Any], list[int]]:
        """The answer to one request, and the fds that go with it (a pidfd per rank forked: the
        notebook's sentinel, valid even when the rank ends and is reaped before it arrives)."""
        if "warm" in message:
            failed = warm(message["warm"], quiet_if_missing=True)
            return {"warmed": [m for m in message["warm"] if m not in failed], "fingerprints": fingerprints()}, []
        if "state" in message:
            return {"state": state()}, []
        request = message["ranks"]
        warm(request.get("warm", ()), quiet_if_missing=True)
        if len(fds) != sum(len(rank["targets"]) for rank in request["ranks"]):
            return {"error": f"{len(fds)} fds came with a request for other numbers"}, []
        pidfds = self.fork_ranks(request, fds)
        return {"pids": [self.children[fd] for fd in pidfds]}, pidfds

    def fork_ranks(self, request: dict[str, Any], fds: list[int]) -> list[int]:
        """Fork each rank of the request; their pidfds (a rank that could not be forked, EAGAIN,
        ends the list: the notebook starts that one and the rest as fresh Pythons)."""
        pidfds = []
        first = 0
        ours = (self.sock.fileno(), self.reports, self.notebook_fd)
        for rank in request["ranks"]:
            mine = fds[first:first + len(rank["targets"])]
            first += len(rank["targets"])
            others = [fd for fd in fds if fd not in mine]
            try:
                pid, pidfd = forking.fork_child(
                    functools.partial(become_rank, dict(rank, env={**request["env"], **rank["env"]},
                                                        cwd=request.get("cwd")), mine),
                    close=ours + tuple(others) + tuple(self.children))
            except OSError:
                break
            self.children[pidfd] = pid
            pidfds.append(pidfd)
        return pidfds

    def reap(self, pidfd: int) -> None:
        pid = self.children.pop(pidfd)
        os.close(pidfd)
        ended = forking.reap(pid)
        if ended.status is None:   # taken by someone else after all (SIGCHLD is ours to set: not expected)
            report = start_wire.REPORT.pack(pid, start_wire.LOST_KIND, -1, 0, 0.0)
        else:
            kind, value = ended.status
            report = start_wire.REPORT.pack(pid, int(kind == "signal"), value, ended.peak_rss, ended.cpu_seconds)
        try:
            os.write(self.reports, report)
        except BrokenPipeError:   # the notebook let go of its end: nobody waits for this rank
            pass


def become_rank(request: dict[str, Any], fds: list[int]) -> None:
    """In the rank (forked: the start process's own fds closed): take the notebook's fds under
    their numbers, its environment and working directory, then run ``spawn_entry`` as a spawned
    rank does."""
    code = 1
    try:
        gc.freeze()   # the start process's objects stay shared pages, never collected here
        threading.current_thread().name = "MainThread"
        place_fds(fds, request["targets"])
        os.environ.clear()
        os.environ.update(request["env"])
        if request.get("cwd"):
            try:
                os.chdir(request["cwd"])
            except OSError:   # why: spawn_entry restores it from the payload again, and says nothing either
                pass
        sys.argv = ["-c"]
        from ...rank.spawn_entry import main as spawn_main
        from ...rank.device_backends import FLAG
        spawn_main(request["argv"] + ([FLAG, "1"] if backends_withheld else []))   # never returns
    finally:
        os._exit(code)


def place_fds(fds: list[int], targets: list[int]) -> None:
    """Make each of ``fds`` available under its number in ``targets`` (what the rank's arguments
    name), through numbers above every target first so no move overwrites another fd still needed."""
    floor = max(targets + [2]) + 1
    import fcntl
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, floor) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, target in zip(high, targets):
        os.dup2(fd, target, inheritable=True)
        os.close(fd)


def accelerator_initialized() -> str | None:
    """What accelerator runtime this process would hand its forks, if any (it must be none)."""
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "cuda", None) is not None and torch.cuda.is_initialized():
        return "a CUDA context"
    if "torch_xla" in sys.modules:
        from ...detect.xla import runtime_initialized
        if runtime_initialized():
            return "the XLA runtime"
    if "torch_tpu" in sys.modules:
        from ...detect import torch_tpu
        if torch_tpu.runtime_initialized():
            return "TorchTPU's runtime"
    return None


def fingerprints() -> dict[str, tuple[int, int]]:
    """The folders the imported packages were found in (site-packages, the standard library's),
    each as (inode, mtime in ns). pip installing, upgrading or removing any package there adds and
    removes entries of that folder (``torch``, ``torch-2.13.0.dist-info``), which changes its
    mtime; the notebook compares these few before every launch (a stat of each of a few hundred
    modules took 2 ms a launch here)."""
    folders = set()
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if "." in name or not isinstance(path, str) or name == "__main__":
            continue
        folder = os.path.dirname(path)
        if os.path.basename(path).startswith("__init__."):
            folder = os.path.dirname(folder)
        folders.add(folder)
    found = {}
    for folder in folders:
        try:
            st = os.stat(folder)
        except OSError:
            continue
        found[folder] = (st.st_ino, st.st_mtime_ns)
    return found


def state() -> dict[str, Any]:
    """What this process holds, for the notebook's questions (tests, the docs' numbers)."""
    torch = sys.modules.get("torch")
    with open("/proc/self/statm") as f:
        resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {
        "pid": os.getpid(),
        "cuda_initialized": bool(torch is not None and torch.cuda.is_initialized()),
        "modules": sorted(sys.modules),
        "resident_bytes": resident,
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        "cwd": os.getcwd(),
    }


if __name__ == "__main__":
    sys.exit(main())

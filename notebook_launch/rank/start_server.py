"""The warm start process: a fresh Python, started by the notebook (``backends.start_process``),
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
- The rank becomes the notebook's own child: the start process forks a short-lived middle process,
  which forks the rank and exits; the notebook, a child subreaper for that moment, adopts the
  orphan. So the notebook reaps it, reads its exit status and its usage, and the rank dies with
  the notebook (PR_SET_PDEATHSIG, set once adopted), exactly as a spawned rank.
- It holds nothing of a run: the fds a request brings are closed here once the rank has them.
  It ends when the notebook ends (a pidfd on the notebook: SIGKILL included) or closes the socket.

Messages (``channels.start_wire``): the notebook sends ``{"ranks": {...}}`` with every rank's fds
and gets ``{"pids": [...]}`` or ``{"error": text}``; ``{"warm": [...]}`` imports more; ``{"state": True}``
answers what this process holds (for tests and the docs' numbers). At start it sends ``{"ready":
...}`` with the files of the packages it imported (``fingerprints``), so the notebook can tell when
a ``%pip install -U`` replaced one and start a fresh start process.
"""
from __future__ import annotations

import gc
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any

from ..channels import start_wire
from .preload import warm

SOCKET_VARIABLE = "NOTEBOOK_LAUNCH_START_SOCKET"     # "<socket fd> <notebook pid>"
ADOPTION_WAIT = 10.0     # seconds a rank waits to be adopted by the notebook before it gives up


def main() -> int:
    fd, notebook = (int(x) for x in os.environ.pop(SOCKET_VARIABLE).split())
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the notebook's Ctrl-C is for the ranks, not for us
    try:
        notebook_fd = os.pidfd_open(notebook)
    except ProcessLookupError:
        return 0
    preload = sys.argv[1:]
    warm(preload, quiet_if_missing=True)
    from . import spawn_entry  # noqa: F401  (what every rank runs: imported once here, not in each)
    warm(["cloudpickle", "numpy"], quiet_if_missing=True)
    problem = accelerator_initialized()
    if problem:
        start_wire.send(sock, {"error": f"the start process would hold {problem} after its imports"})
        return 1
    start_wire.send(sock, {"ready": {"pid": os.getpid(), "fingerprints": fingerprints()}})
    serve(sock, notebook_fd, notebook)
    return 0


def serve(sock: socket.socket, notebook_fd: int, notebook: int) -> None:
    while True:
        ready, _, _ = select.select([sock.fileno(), notebook_fd], [], [])
        if notebook_fd in ready:
            return
        try:
            message, fds = start_wire.receive(sock)
        except start_wire.WireClosed:
            return
        try:
            answer = handle(message, fds, sock, notebook_fd, notebook)
        except Exception as exc:   # why: a request that failed here is the notebook's error to raise
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        try:
            start_wire.send(sock, answer)
        except start_wire.WireClosed:
            return


def handle(message: dict[str, Any], fds: list[int], sock: socket.socket, notebook_fd: int,
           notebook: int) -> dict[str, Any]:
    if "warm" in message:
        failed = warm(message["warm"], quiet_if_missing=True)
        return {"warmed": [m for m in message["warm"] if m not in failed], "fingerprints": fingerprints()}
    if "state" in message:
        return {"state": state()}
    request = message["ranks"]
    warm(request.get("warm", ()), quiet_if_missing=True)
    if len(fds) != sum(len(rank["targets"]) for rank in request["ranks"]):
        return {"error": f"{len(fds)} fds came with a request for other numbers"}
    return {"pids": fork_ranks(request, fds, (sock.fileno(), notebook_fd), notebook)}


def fork_ranks(request: dict[str, Any], fds: list[int], ours: tuple[int, ...], notebook: int) -> list[int]:
    """Fork a launch's ranks through one middle process that forks them all and exits, so the
    notebook (a subreaper meanwhile) adopts them; their pids, once they have been orphaned. One
    middle per launch, not per rank: each fork and each exit of a process that imported torch
    costs milliseconds (about 3 and 5 here). A rank the middle could not fork (EAGAIN) is -errno."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(read_end)
            first = 0
            for rank in request["ranks"]:
                mine = fds[first:first + len(rank["targets"])]
                first += len(rank["targets"])
                try:
                    pid = os.fork()
                except OSError as exc:
                    os.write(write_end, struct.pack("!i", -(exc.errno or 1)))
                    break
                if pid == 0:
                    os.close(write_end)
                    others = [fd for fd in fds if fd not in mine]
                    become_rank(dict(rank, env={**request["env"], **rank["env"]}, cwd=request.get("cwd")),
                                mine, ours + tuple(others), notebook)   # never returns
                os.write(write_end, struct.pack("!i", pid))
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        os.waitpid(middle, 0)   # the ranks are the notebook's children once this returns
        data = b""
        while chunk := os.read(read_end, 4096):
            data += chunk
    finally:
        os.close(read_end)
    return [struct.unpack_from("!i", data, offset)[0] for offset in range(0, len(data) - len(data) % 4, 4)]


def become_rank(request: dict[str, Any], fds: list[int], ours: tuple[int, ...], notebook: int) -> None:
    """In the rank: take the notebook's fds under their numbers, its environment and working
    directory, wait to be the notebook's child, then run ``spawn_entry`` as a spawned rank does."""
    code = 1
    try:
        gc.freeze()   # the start process's objects stay shared pages, never collected here
        threading.current_thread().name = "MainThread"
        for fd in ours:
            os.close(fd)
        place_fds(fds, request["targets"])
        os.environ.clear()
        os.environ.update(request["env"])
        if request.get("cwd"):
            try:
                os.chdir(request["cwd"])
            except OSError:   # why: spawn_entry restores it from the payload again, and says nothing either
                pass
        deadline = time.monotonic() + ADOPTION_WAIT
        while os.getppid() != notebook:
            if time.monotonic() > deadline:
                os._exit(code)
            time.sleep(0.0002)
        sys.argv = ["-c"]
        from .spawn_entry import main as spawn_main
        spawn_main(request["argv"])   # never returns
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
        from ..detect.xla import runtime_initialized
        if runtime_initialized():
            return "the XLA runtime"
    return None


def fingerprints() -> dict[str, tuple[str, int, int, int]]:
    """Each imported top-level package's file: (path, inode, mtime in ns, size). A package that
    pip replaced has another inode or time; the notebook compares before every launch."""
    found = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if "." in name or not isinstance(path, str) or name == "__main__":
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue
        found[name] = (path, st.st_ino, st.st_mtime_ns, st.st_size)
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

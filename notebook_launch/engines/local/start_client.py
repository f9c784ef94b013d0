"""The warm start process's client (``start_process`` says when there is one): starting it (its
command line and environment), asking it for ranks over its socket, fds riding along, and reading
how its ranks ended from the reports it writes as it reaps them (``start_wire``'s messages).

Apart from ``start_process`` because it is a job of its own: one ``StartProcess`` speaks the
protocol with one start process; which one the notebook has, when it is replaced, retired or
stopped, is ``start_process``'s (which re-exports what callers use from here).
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

from ...channels import LOST, EndUsage, WaitStatus, start_wire
from ...notebook.interrupt_gate import held_through
from ...wire.fork_locks import no_fork_during_exec
from ...record.resources import helper_pids, register_helper

log = logging.getLogger("notebook_launch")

READY_WAIT = 300.0       # seconds the first launch waits for the start process's imports at most
REQUEST_WAIT = 120.0     # seconds a request may take (an import of torch._dynamo on a busy machine)
HELPER_NAME = "start process"   # how the panel's header names its memory
# the folder that holds the notebook_launch package: as many levels up as the module's name is deep
PACKAGE_ROOT = os.path.abspath(__file__).rsplit(os.sep, __name__.count(".") + 1)[0]
BOOTSTRAP = ("import json, sys; sys.path[:] = json.loads(sys.argv.pop(1)); "
             "from notebook_launch.engines.local.start_server import main; sys.exit(main())")


@dataclass(frozen=True)
class RankRequest:
    """One rank the start process is asked for: its ``spawn_entry`` arguments, what of the
    environment is its own, and its fds (number in its arguments -> this process's fd)."""
    argv: list[str]
    env: Mapping[str, str]
    fds: Mapping[int, int]


class StartProcessUnavailable(Exception):
    """The start process could not start or serve; the caller starts ranks the slow way."""


AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"   # torch's switch for its device backends' entry points


def withhold_device_backends(environ: Mapping[str, str], root: str | None = "/",
                             torch_tpu_version: str | None | bool = True) -> dict[str, str]:
    """What of the start process's environment keeps its ``import torch`` from loading the device
    backends, where they would set up a TPU: torch_tpu installed and TPU devices it drives here
    (``rank.device_backends`` says why; each rank then loads them with its own environment).
    Elsewhere nothing: torch_tpu on a machine without its devices sets nothing up, and its ranks
    keep it from the start process instead of loading it (seconds) each."""
    if environ.get(AUTOLOAD, "1") != "1":
        return {}   # off in the notebook: its fresh Pythons do not load them either
    from ...detect.torch_tpu import detect_torch_tpu
    from .start_server import WITHHELD_VARIABLE
    if not detect_torch_tpu(root, torch_tpu_version).can_launch:
        return {}
    return {AUTOLOAD: "0", WITHHELD_VARIABLE: "1"}


def preload_for_start() -> list[str]:
    """What the start process imports first: torch and torch.distributed where installed (it never
    imports the user's code); torch._dynamo comes with the first launch that trains."""
    return ["torch", "torch.distributed"]


class StartProcess:
    """One running start process and the socket to it. Use through ``current()``."""

    def __init__(self, popen: subprocess.Popen, sock: socket.socket, reports: int) -> None:
        self.popen, self.sock, self.pid = popen, sock, popen.pid
        self.lock = threading.Lock()
        self.ready: dict[str, Any] | None = None
        self.failed: str | None = None
        self.reports = reports                 # the read end of the ranks' ends (``start_wire.REPORT`` records)
        self.reports_lock = threading.Lock()
        self.ends: dict[int, tuple[WaitStatus, EndUsage]] = {}   # pid -> how it ended, not yet taken
        self.holders = 0                       # ranks of it not yet released
        self.retired = False

    @classmethod
    def start(cls) -> "StartProcess":
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        reports_r, reports_w = os.pipe()
        os.set_blocking(reports_r, False)
        try:
            env = dict(os.environ)
            env.update(withhold_device_backends(env))
            env[start_server_variable()] = f"{theirs.fileno()} {reports_w} {os.getpid()}"
            env.setdefault("PYTHONUNBUFFERED", "1")
            path = json.dumps([PACKAGE_ROOT] + third_party_path())
            with no_fork_during_exec:
                popen = subprocess.Popen(
                    [sys.executable, "-c", BOOTSTRAP, path, *preload_for_start()],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    pass_fds=(theirs.fileno(), reports_w), env=env, cwd="/", close_fds=True,
                    start_new_session=True)
        except BaseException:
            ours.close()
            os.close(reports_r)
            raise
        finally:
            theirs.close()
            os.close(reports_w)
        ours.set_inheritable(False)
        register_helper(HELPER_NAME, popen.pid)   # its memory shows beside the machine's in the panel
        return cls(popen, ours, reports_r)

    def wait_ready(self, timeout: float = READY_WAIT) -> dict[str, Any]:
        """The start process's ready message, waiting for its imports the first time."""
        with self.lock:
            if self.ready is None and self.failed is None:
                try:
                    message, fds = start_wire.receive(self.sock, timeout)
                    for fd in fds:
                        os.close(fd)
                except (start_wire.WireClosed, TimeoutError, OSError) as exc:
                    self.failed = f"it ended before it was ready ({self.describe_end() or exc})"
                else:
                    if "ready" in message:
                        self.ready = message["ready"]
                    else:
                        self.failed = str(message.get("error", message))
            if self.failed is not None:
                raise StartProcessUnavailable(self.failed)
            assert self.ready is not None
            return self.ready

    def ask(self, message: dict[str, Any], fds: list[int] | tuple[int, ...] = (),
            timeout: float = REQUEST_WAIT) -> dict[str, Any]:
        """Send one request and wait for its answer (one request at a time); fds that came with it
        are closed (``ask_with_fds`` keeps them)."""
        answer, extra = self.ask_with_fds(message, fds, timeout)
        for fd in extra:
            os.close(fd)
        return answer

    def ask_with_fds(self, message: dict[str, Any], fds: list[int] | tuple[int, ...] = (),
                     timeout: float = REQUEST_WAIT) -> tuple[dict[str, Any], list[int]]:
        """``ask``, with the fds the answer brought (the caller's to close)."""
        self.wait_ready()
        with self.lock:
            try:
                start_wire.send(self.sock, message, fds)
                answer, extra = start_wire.receive(self.sock, timeout)
            except (start_wire.WireClosed, TimeoutError, OSError) as exc:
                self.failed = f"it stopped answering ({self.describe_end() or exc})"
                raise StartProcessUnavailable(self.failed) from exc
        if "error" in answer:
            for fd in extra:
                os.close(fd)
            raise StartProcessUnavailable(str(answer["error"]))
        if "fingerprints" in answer and self.ready is not None:
            self.ready["fingerprints"] = answer["fingerprints"]
        return answer, extra

    def fork_ranks(self, ranks: list["RankRequest"], warm: list[str]) -> list[tuple[int, int]]:
        """Fork a launch's ranks, each running ``rank.spawn_entry`` with its ``argv``, its ``fds``
        (the numbers its arguments name -> this process's fds) and the notebook's environment with
        its ``env`` over it. Returns (pid, pidfd) of each (the start process's children: ``ended``
        says how each ended; the pidfd is the caller's); a rank that could not be forked (the
        machine out of processes) ends the list early."""
        pids: list[tuple[int, int]] = []
        env, cwd = dict(os.environ), _cwd()
        try:
            for batch in _batches(ranks):
                request = {"ranks": {"env": env, "cwd": cwd, "warm": warm,
                                     "ranks": [{"argv": r.argv, "env": dict(r.env), "targets": list(r.fds)}
                                               for r in batch]}}
                # An interrupt waits for the answer: one raised while it came left ranks the start
                # process had forked running, unknown here (the py314 lane, on a busy machine), and
                # the answer in the socket for the next request. Raised once they are in ``pids``.
                with held_through("notebook_launch: interrupted while the ranks were started"):
                    answer, pidfds = self.ask_with_fds(request, [fd for r in batch for fd in r.fds.values()])
                    forked = list(zip((int(pid) for pid in answer["pids"]), pidfds))
                    self.holders += len(forked)
                    pids += forked
                if len(forked) < len(batch):
                    break
        except BaseException:
            # A later batch failed, or an interrupt: the caller starts every rank again as a fresh
            # Python (or stops), so the ranks forked so far must not run on (they die here; it reaps them).
            for pid, pidfd in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    log.debug("rank process %d had ended already", pid)
                os.close(pidfd)
                self.holders -= 1
            raise
        return pids

    def state(self) -> dict[str, Any]:
        """What the start process holds (its pid, modules, memory, fds, CUDA)."""
        return self.ask({"state": True})["state"]

    def alive(self) -> bool:
        return self.popen.poll() is None and self.failed is None

    def stale(self) -> list[str]:
        """The folders of packages it imported that changed since (a package installed, upgraded
        or removed there; empty: none)."""
        if self.ready is None:
            return []
        changed = []
        for folder, (ino, mtime) in self.ready.get("fingerprints", {}).items():
            try:
                st = os.stat(folder)
            except OSError:
                changed.append(folder)
                continue
            if (st.st_ino, st.st_mtime_ns) != (ino, mtime):
                changed.append(folder)
        return changed

    def describe_end(self) -> str | None:
        code = self.popen.poll()
        if code is None:
            return None
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"

    def ended(self, pid: int, wait: float = 0.0) -> tuple[WaitStatus, EndUsage] | None:
        """How rank ``pid`` ended and what the kernel counted of it, once the start process reaped
        it (None until then; up to ``wait`` seconds for its report); taken once."""
        deadline = time.monotonic() + wait
        while True:
            found = self._take(pid)
            left = deadline - time.monotonic()
            if found is not None or left <= 0 or self.reports < 0:
                return found
            select.select([self.reports], [], [], left)

    def _take(self, pid: int) -> tuple[WaitStatus, EndUsage] | None:
        with self.reports_lock:
            if self.reports >= 0:
                while True:
                    try:
                        data = os.read(self.reports, start_wire.REPORT.size * 64)
                    except BlockingIOError:
                        break
                    if not data:
                        break
                    for offset in range(0, len(data) - len(data) % start_wire.REPORT.size, start_wire.REPORT.size):
                        ended, kind, value, peak, cpu = start_wire.REPORT.unpack_from(data, offset)
                        status: WaitStatus = (LOST if kind == start_wire.LOST_KIND else
                                              ("signal", value) if kind else ("exit", value))
                        self.ends[ended] = (status, EndUsage(peak, cpu))
            return self.ends.pop(pid, None)

    def released(self) -> None:
        """One of its ranks was released; a retired start process ends after its last one."""
        self.holders -= 1
        if self.retired and self.holders <= 0:
            self._finish()

    def retire(self) -> None:
        """Fork nothing more; end once every rank of it ended (at once if none is left)."""
        self.retired = True
        self._unregister()
        try:
            self.sock.close()   # the start process serves its ranks' ends, then ends
        except OSError:
            log.debug("the start process's socket was closed already")
        if self.holders <= 0:
            self._finish()

    def stop(self) -> None:
        """End it now, and every rank it forked with it (they die with it)."""
        self.retired = True
        self._unregister()
        try:
            self.sock.close()
        except OSError:
            log.debug("the start process's socket was closed already")
        if self.popen.poll() is None:
            self.popen.kill()
        self._finish()

    def _finish(self) -> None:
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log.debug("start process %d did not end within 30 s", self.pid)
            return
        with self.reports_lock:
            if self.reports >= 0 and not self.holders > 0:
                os.close(self.reports)
                self.reports = -1

    def _unregister(self) -> None:
        if helper_pids().get(HELPER_NAME) == self.pid:
            register_helper(HELPER_NAME, None)


def _batches(ranks: list[RankRequest]) -> list[list[RankRequest]]:
    """The ranks in as few requests as their fds allow (SCM_RIGHTS carries 253 fds a message)."""
    batches: list[list[RankRequest]] = [[]]
    for rank in ranks:
        if batches[-1] and sum(len(r.fds) for r in batches[-1]) + len(rank.fds) > start_wire.MAX_FDS:
            batches.append([])
        batches[-1].append(rank)
    return [batch for batch in batches if batch]


def start_server_variable() -> str:
    from .start_server import SOCKET_VARIABLE
    return SOCKET_VARIABLE


def third_party_path() -> list[str]:
    """The notebook's sys.path without its working directory: packages, never the user's files."""
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:
        cwd = None
    return [p for p in sys.path if p and os.path.realpath(p) != cwd]


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None

"""The notebook's side of the warm start process (``engines.local.start_server``): one per notebook, started
in the background (``prestart``: by ``%load_ext notebook_launch`` where a launch may have to avoid
forking the notebook, or by the first such launch), from which every rank that must not be forked
from the notebook is forked instead (``engines.local.spawn``). Ranks then start in milliseconds, not in
the seconds a fresh Python and a torch import take, and still share nothing with the notebook: not
its CUDA context, not its XLA runtime, not its OpenMP pool.

What the notebook keeps in hand:
- **Replacement.** Before every launch the start process is checked: one that ended (killed, out
  of memory) is replaced and the launch goes on, said once in the cell; one whose imported
  packages changed on disk since it imported them (a ``%pip install -U``) is replaced silently,
  so ranks never run yesterday's torch.
- **Its ranks' ends.** The ranks are the start process's children: it reaps each one and writes
  how it ended and what the kernel counted of it on a pipe only the notebook reads (``ended``), so
  the supervisor reads a status and a peak memory as it does for a rank of its own, and no SIGCHLD
  policy of the notebook (ignored, a handler that reaps every child) can take it.
- **An end.** The start process ends with the notebook (it watches the notebook's pidfd, so a
  SIGKILLed kernel ends it too), and its ranks with it; with ``stop()``, and at the notebook's exit.
  One replaced because its packages changed is retired: it forks nothing more and ends once its
  last rank (persistent ranks may live on) has ended.

``NOTEBOOK_LAUNCH_START_PROCESS=0`` turns it off: each rank is then a fresh Python (``spawn``).

Here: whether the notebook has one and which (started, replaced, retired, stopped); speaking with
one (its command line, its requests, its ranks' ends) is ``start_client``'s ``StartProcess``.
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import Mapping

from ...detect.platform import START_PROCESS_SWITCH, start_process_possible
from ...wire.fork_locks import ForkRenewedLock
from ...notebook.notebook_streams import ERR
# The client (one start process, its protocol): what callers use of it is named from here too
from .start_client import (AUTOLOAD, HELPER_NAME, READY_WAIT, REQUEST_WAIT, RankRequest, StartProcess,
                           StartProcessUnavailable, withhold_device_backends)

__all__ = ["AUTOLOAD", "HELPER_NAME", "READY_WAIT", "REQUEST_WAIT", "SWITCH", "RankRequest", "StartProcess",
           "StartProcessUnavailable", "current", "enabled", "forced", "held_fds", "prestart",
           "running", "stop", "why_start_early", "withhold_device_backends"]
log = logging.getLogger("notebook_launch")

SWITCH = START_PROCESS_SWITCH     # "0": no start process; ranks start as fresh Pythons


def forced(environ: Mapping[str, str] = os.environ) -> bool:
    """``NOTEBOOK_LAUNCH_START_PROCESS=1``: start it on ``%load_ext`` whatever the machine."""
    return environ.get(SWITCH, "").strip().lower() in ("1", "true", "yes", "on")


def why_start_early(environ: Mapping[str, str] = os.environ, root: str = "/",
                    version: tuple[int, int] = sys.version_info[:2]) -> str | None:
    """Why ``%load_ext`` should start the start process before any launch (None: not worth its
    memory here, the first launch that needs it starts it). Where launches cannot fork the
    notebook once it has touched the device, or ever: an NVIDIA or AMD GPU, a TPU, Python 3.14's
    forkserver default; or asked for."""
    if not enabled(environ):
        return None
    if forced(environ):
        return f"{SWITCH}=1"
    dev = os.path.join(root, "dev")
    try:
        names = os.listdir(dev)
    except OSError:
        names = []
    if any(n.startswith("nvidia") and n[len("nvidia"):].isdigit() for n in names):
        return "an NVIDIA GPU"
    if "kfd" in names:
        return "an AMD GPU (ROCm)"
    if any(n.startswith("accel") for n in names) or os.path.isdir(os.path.join(dev, "vfio")) and any(
            n.isdigit() for n in os.listdir(os.path.join(dev, "vfio"))):
        return "a TPU"
    if version >= (3, 14):
        return "Python 3.14 (forkserver by default)"
    return None


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether launches that must not fork the notebook use the start process: Linux (pidfds,
    fds passed over a socket), not switched off (``detect.platform.start_process_possible``)."""
    return start_process_possible(environ)


# --- one per notebook -------------------------------------------------------------------

_lock = ForkRenewedLock()
_current: StartProcess | None = None
_atexit_registered = False


def prestart() -> bool:
    """Start the start process in the background if none runs (returns at once); False when it is
    switched off or cannot run here. A launch that needs it waits for its imports only if they have
    not finished by then. Public as ``notebook_launch.prestart()``."""
    if not enabled():
        return False
    try:
        _running()
    except OSError as exc:
        log.debug("could not start the start process: %s", exc)
        return False
    return True


def current() -> StartProcess:
    """The running start process, ready: replaced first if it ended (said once in the cell) or if
    a package it imported changed on disk. Raises StartProcessUnavailable when none can serve."""
    global _current
    with _lock:
        process = _current
        if process is not None and not process.alive():
            print(f"notebook_launch: the warm start process (pid {process.pid}) had ended "
                  f"({process.describe_end() or process.failed}); starting a new one", file=ERR)
            process.stop()
            _current = process = None
        elif process is not None and process.ready is not None and (changed := process.stale()):
            log.debug("start process %d: packages changed on disk (%s); replacing it",
                      process.pid, ", ".join(changed))
            process.retire()   # its persistent ranks, if any, live on; it ends after them
            _current = process = None
    process = _running()
    process.wait_ready()
    return process


def _running() -> StartProcess:
    global _current, _atexit_registered
    with _lock:
        if _current is None:
            _current = StartProcess.start()
            if not _atexit_registered:
                atexit.register(stop)
                _atexit_registered = True
        return _current


def running() -> StartProcess | None:
    """The start process if one was started (ready or not), without starting one."""
    return _current


def held_fds() -> set[int]:
    """The descriptors the notebook holds for its start process (its socket and the ranks' ends
    pipe): opened with it and kept for its life, across launches, like the orphan keeper's
    (``leftovers.keeper_fds``). What a check for descriptors a launch left open leaves out."""
    process = _current
    if process is None:
        return set()
    try:
        return {process.sock.fileno(), process.reports} - {-1}
    except OSError:
        return set()


def stop() -> None:
    """End the start process (a kernel restart and the notebook's end do it too)."""
    global _current
    with _lock:
        process, _current = _current, None
    if process is not None:
        process.stop()

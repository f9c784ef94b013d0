"""The test process's children, less the warm start process (``engines.local.start_process``): that one
lives as long as the notebook on purpose (every later spawn-class launch forks its ranks from it),
so "nothing is left" means no rank, no rank's child and no zombie; the start process's own end is
tested on its own (tests/test_start_process.py)."""
from __future__ import annotations

import psutil

START_SERVER = "notebook_launch.engines.local.start_server"


def is_start_process(process: psutil.Process) -> bool:
    try:
        return any(START_SERVER in part for part in process.cmdline())
    except psutil.Error:
        return False


def children(recursive: bool = True) -> list[psutil.Process]:
    """This process's children (all descendants with ``recursive``), without the start process."""
    return [p for p in psutil.Process().children(recursive=recursive) if not is_start_process(p)]


def running(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``processes`` still running: not ended and not a zombie. A process can end and be
    reaped by its own parent between being listed and being looked at; that one has ended too."""
    return [p for p in processes if _runs(p)]


def _runs(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

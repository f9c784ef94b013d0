"""The sweep reads only the environments of processes born since the run began
(``leftovers.born_between``), and falls back to every process where the pid counter may
have gone round; a real setsid child is swept either way (tests/test_rank_children.py)."""
from __future__ import annotations

import os
import subprocess
import sys

from notebook_launch.process import leftovers


def test_pids_after_the_mark_only():
    pids = [5, 100, 101, 150, 151, 30000]
    assert leftovers.born_between((100, 1000), (150, 1010), 32768, pids) == [101, 150]


def test_the_counter_going_round_pid_max_keeps_both_ends():
    pids = [5, 300, 32000, 32700]
    assert leftovers.born_between((31990, 1000), (310, 1800), 32768, pids) == [5, 300, 32000, 32700]
    assert leftovers.born_between((31990, 1000), (10, 1800), 32768, pids) == [5, 32000, 32700]


def test_every_pid_where_a_whole_turn_is_possible():
    pids = list(range(1, 200))
    assert leftovers.born_between((100, 0), (150, 20000), 32768, pids) == pids


def test_a_process_started_after_the_mark_is_in_the_range():
    """Real pids: a child started after birth_mark() is among the candidates, the notebook is not."""
    mark = leftovers.birth_mark()
    if mark is None:   # no /proc/loadavg or /proc/stat here: the sweep reads every process
        return
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
        found = leftovers._born_since(mark, pids)
        assert child.pid in found
        assert os.getpid() not in found or len(found) == len(pids)
    finally:
        child.kill()
        child.wait()
